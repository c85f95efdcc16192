// Normalizers and pre-tokenizers of tokenizer.json, each as `tokenizers`
// implements it (normalizers/*.rs, pre_tokenizers/*.rs): NFC/NFD/NFKC/NFKD,
// Prepend, Replace, Strip, Sequence; Split, ByteLevel, Metaspace, Digits,
// Sequence. Offsets are not tracked: moert needs ids, and of the original
// positions only whether a piece starts the input (Metaspace's "first").
#include "Parts.h"

#include <algorithm>
#include <functional>

namespace moert::tokenizer {

namespace {

[[noreturn]] void unsupported(const JsonFields &fields, const std::string &field,
                              const std::string &what) {
  inputError("{}: not supported yet: {}", fields.fieldName(field), what);
}

std::unique_ptr<Normalizer> normalizerOf(const JsonFields &o);
std::unique_ptr<PreTokenizer> preTokenizerOf(const JsonFields &o);

//===----------------------------------------------------------------------===//
// Normalizers
//===----------------------------------------------------------------------===//

struct SequenceNormalizer final : Normalizer {
  std::vector<std::unique_ptr<Normalizer>> parts;
  void apply(std::string &s) const override {
    for (const auto &p : parts)
      p->apply(s);
  }
};

struct FormNormalizer final : Normalizer {
  NormalForm form;
  explicit FormNormalizer(NormalForm form) : form(form) {}
  void apply(std::string &s) const override { s = normalize(s, form); }
};

struct PrependNormalizer final : Normalizer {
  std::string prefix;
  void apply(std::string &s) const override {
    if (!s.empty())
      s.insert(0, prefix);
  }
};

struct ReplaceNormalizer final : Normalizer {
  Pattern pattern;
  std::string content;
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern(std::move(pattern)), content(std::move(content)) {}
  void apply(std::string &s) const override { s = replaceAll(pattern, content, s); }
};

struct StripNormalizer final : Normalizer {
  bool left = false, right = false;
  void apply(std::string &s) const override {
    size_t begin = 0, end = s.size();
    if (left)
      while (begin < end) {
        size_t length = 0;
        if (!isWhitespace(codePointAt(s, begin, &length)))
          break;
        begin += length;
      }
    if (right)
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80)
          --start;
        size_t length = 0;
        if (!isWhitespace(codePointAt(s, start, &length)))
          break;
        end = start;
      }
    s = s.substr(begin, end - begin);
  }
};

//===----------------------------------------------------------------------===//
// Pre-tokenizers
//===----------------------------------------------------------------------===//

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior readBehavior(const JsonFields &o, const std::string &field) {
  const std::string b = o.string(field);
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  unsupported(o, field, "split behavior " + b);
}

/// NormalizedString::split: the kept slices of `matches` under `behavior`.
std::vector<std::pair<size_t, size_t>> splitSlices(const std::vector<Slice> &matches,
                                                   Behavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  bool previous = false;
  switch (behavior) {
  case Behavior::Isolated:
    for (const Slice &m : matches)
      out.push_back({m.start, m.end});
    break;
  case Behavior::Removed:
    for (const Slice &m : matches)
      if (!m.match)
        out.push_back({m.start, m.end});
    break;
  case Behavior::Contiguous:
    for (size_t i = 0; i < matches.size(); ++i) {
      const Slice &m = matches[i];
      if (i > 0 && m.match == previous && !out.empty())
        out.back().second = m.end;
      else
        out.push_back({m.start, m.end});
      previous = m.match;
    }
    break;
  case Behavior::MergedWithPrevious:
    for (const Slice &m : matches) {
      if (m.match && !previous && !out.empty())
        out.back().second = m.end;
      else
        out.push_back({m.start, m.end});
      previous = m.match;
    }
    break;
  case Behavior::MergedWithNext:
    for (size_t i = matches.size(); i-- > 0;) {
      const Slice &m = matches[i];
      if (m.match && !previous && !out.empty())
        out.back().first = m.start;
      else
        out.push_back({m.start, m.end});
      previous = m.match;
    }
    std::reverse(out.begin(), out.end());
    break;
  }
  return out;
}

/// Replaces every piece by its slices (the first keeps atStart when it
/// starts the piece).
void splitPieces(std::vector<Piece> &pieces,
                 const std::function<std::vector<Slice>(std::string_view)> &find,
                 Behavior behavior) {
  std::vector<Piece> out;
  for (Piece &p : pieces)
    for (auto [start, end] : splitSlices(find(p.text), behavior))
      if (end > start)
        out.push_back({p.text.substr(start, end - start), p.atStart && start == 0});
  pieces = std::move(out);
}

/// Slices of each character for which `is` holds.
std::vector<Slice> charMatches(std::string_view s, const std::function<bool(char32_t)> &is) {
  std::vector<Slice> out;
  size_t last = 0;
  for (size_t i = 0; i < s.size();) {
    size_t length = 0;
    char32_t c = codePointAt(s, i, &length);
    if (is(c)) {
      if (last < i)
        out.push_back({last, i, false});
      out.push_back({i, i + length, true});
      last = i + length;
    }
    i += length;
  }
  if (last < s.size() || s.empty())
    out.push_back({last, s.size(), false});
  return out;
}

struct SequencePreTokenizer final : PreTokenizer {
  std::vector<std::unique_ptr<PreTokenizer>> parts;
  void apply(std::vector<Piece> &pieces) const override {
    for (const auto &p : parts)
      p->apply(pieces);
  }
};

struct SplitPreTokenizer final : PreTokenizer {
  Pattern pattern;
  Behavior behavior;
  bool invert;
  SplitPreTokenizer(Pattern pattern, Behavior behavior, bool invert)
      : pattern(std::move(pattern)), behavior(behavior), invert(invert) {}
  void apply(std::vector<Piece> &pieces) const override {
    splitPieces(
        pieces,
        [&](std::string_view s) {
          std::vector<Slice> m = pattern.findMatches(s);
          if (invert)
            for (Slice &x : m)
              x.match = !x.match;
          return m;
        },
        behavior);
  }
};

constexpr const char *kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct ByteLevelPreTokenizer final : PreTokenizer {
  bool addPrefixSpace = false;
  std::unique_ptr<Pattern> regex; ///< GPT-2's, when use_regex
  void apply(std::vector<Piece> &pieces) const override {
    if (addPrefixSpace)
      for (Piece &p : pieces)
        if (p.text.empty() || p.text[0] != ' ')
          p.text.insert(0, " ");
    if (regex)
      splitPieces(
          pieces, [&](std::string_view s) { return regex->findMatches(s); }, Behavior::Isolated);
    const std::vector<char32_t> &chars = byteLevelChars();
    for (Piece &p : pieces) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (unsigned char b : p.text)
        appendUtf8(mapped, chars[b]);
      p.text = std::move(mapped);
    }
  }
};

struct MetaspacePreTokenizer final : PreTokenizer {
  char32_t replacement;
  std::string rep;
  Prepend scheme;
  bool split;
  void apply(std::vector<Piece> &pieces) const override {
    static const Pattern space = Pattern::literal(" ", "space");
    for (Piece &p : pieces) {
      p.text = replaceAll(space, rep, p.text);
      const bool starts = p.text.compare(0, rep.size(), rep) == 0;
      if (!p.text.empty() && !starts &&
          (scheme == Prepend::Always || (scheme == Prepend::First && p.atStart)))
        p.text.insert(0, rep);
    }
    if (split)
      splitPieces(
          pieces,
          [&](std::string_view s) {
            return charMatches(s, [&](char32_t c) { return c == replacement; });
          },
          Behavior::MergedWithNext);
  }
};

struct DigitsPreTokenizer final : PreTokenizer {
  bool individual = false;
  void apply(std::vector<Piece> &pieces) const override {
    splitPieces(
        pieces, [](std::string_view s) { return charMatches(s, isNumeric); },
        individual ? Behavior::Isolated : Behavior::Contiguous);
  }
};

} // namespace

// Shared with Decoders.cpp (Parts.h).
bool flag(const JsonFields &o, const std::string &field, bool fallback) {
  return o.has(field) && !o.get(field).is_null() ? o.boolean(field) : fallback;
}

char32_t singleChar(const JsonFields &o, const std::string &field) {
  std::string s = o.string(field);
  size_t length = 0;
  if (s.empty() || validUtf8(s) != s || (codePointAt(s, 0, &length), length != s.size()))
    o.fail(field, "expected one character");
  return codePointAt(s, 0, &length);
}

std::string replaceAll(const Pattern &pattern, const std::string &content, std::string_view s) {
  std::string out;
  for (const Slice &m : pattern.findMatches(s))
    out.append(m.match ? std::string_view(content) : s.substr(m.start, m.end - m.start));
  return out;
}

Prepend readPrependScheme(const JsonFields &o) {
  Prepend scheme = Prepend::Always;
  if (o.has("prepend_scheme")) {
    const std::string s = o.string("prepend_scheme");
    if (s == "always") scheme = Prepend::Always;
    else if (s == "first") scheme = Prepend::First;
    else if (s == "never") scheme = Prepend::Never;
    else unsupported(o, "prepend_scheme", s);
  }
  if (o.has("add_prefix_space") && !o.get("add_prefix_space").is_null() &&
      !o.boolean("add_prefix_space")) {
    if (o.has("prepend_scheme") && scheme != Prepend::Never)
      o.fail("add_prefix_space", "false does not match prepend_scheme");
    scheme = Prepend::Never;
  }
  return scheme;
}

const std::vector<char32_t> &byteLevelChars() {
  static const std::vector<char32_t> table = [] {
    std::vector<char32_t> t(256, 0);
    std::vector<bool> printable(256, false);
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b)
      t[b] = printable[b] ? char32_t(b) : next++;
    return t;
  }();
  return table;
}

namespace {
std::unique_ptr<Normalizer> normalizerOf(const JsonFields &o) {
  const std::string type = o.string("type");
  if (type == "Sequence") {
    auto n = std::make_unique<SequenceNormalizer>();
    for (size_t i = 0; i < o.array("normalizers").size(); ++i)
      n->parts.push_back(normalizerOf(o.element("normalizers", i)));
    return n;
  }
  if (type == "NFC") return std::make_unique<FormNormalizer>(NormalForm::NFC);
  if (type == "NFD") return std::make_unique<FormNormalizer>(NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<FormNormalizer>(NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<FormNormalizer>(NormalForm::NFKD);
  if (type == "Prepend") {
    auto n = std::make_unique<PrependNormalizer>();
    n->prefix = o.string("prepend");
    return n;
  }
  if (type == "Replace")
    return std::make_unique<ReplaceNormalizer>(Pattern(o, "pattern"), o.string("content"));
  if (type == "Strip") {
    auto n = std::make_unique<StripNormalizer>();
    n->left = flag(o, "strip_left", false);
    n->right = flag(o, "strip_right", false);
    return n;
  }
  unsupported(o, "type", "normalizer " + type);
}
} // namespace

std::unique_ptr<Normalizer> readNormalizer(const JsonFields &parent, const std::string &field) {
  if (!parent.has(field) || parent.get(field).is_null())
    return nullptr;
  return normalizerOf(parent.child(field));
}

namespace {
std::unique_ptr<PreTokenizer> preTokenizerOf(const JsonFields &o) {
  const std::string type = o.string("type");
  if (type == "Sequence") {
    auto p = std::make_unique<SequencePreTokenizer>();
    for (size_t i = 0; i < o.array("pretokenizers").size(); ++i)
      p->parts.push_back(preTokenizerOf(o.element("pretokenizers", i)));
    return p;
  }
  if (type == "Split")
    return std::make_unique<SplitPreTokenizer>(Pattern(o, "pattern"), readBehavior(o, "behavior"),
                                               flag(o, "invert", false));
  if (type == "ByteLevel") {
    auto p = std::make_unique<ByteLevelPreTokenizer>();
    p->addPrefixSpace = flag(o, "add_prefix_space", true);
    if (flag(o, "use_regex", true))
      p->regex = std::make_unique<Pattern>(Pattern::regex(kGpt2Regex, "GPT-2's regex"));
    return p;
  }
  if (type == "Metaspace") {
    auto p = std::make_unique<MetaspacePreTokenizer>();
    p->replacement = singleChar(o, "replacement");
    appendUtf8(p->rep, p->replacement);
    p->scheme = readPrependScheme(o);
    p->split = flag(o, "split", true);
    return p;
  }
  if (type == "Digits") {
    auto p = std::make_unique<DigitsPreTokenizer>();
    p->individual = flag(o, "individual_digits", false);
    return p;
  }
  unsupported(o, "type", "pre_tokenizer " + type);
}
} // namespace

std::unique_ptr<PreTokenizer> readPreTokenizer(const JsonFields &parent, const std::string &field) {
  if (!parent.has(field) || parent.get(field).is_null())
    return nullptr;
  return preTokenizerOf(parent.child(field));
}

} // namespace moert::tokenizer
