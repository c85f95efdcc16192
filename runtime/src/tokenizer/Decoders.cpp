// Decoders of tokenizer.json, each as `tokenizers` implements it
// (decoders/*.rs and the Decoder impls of ByteLevel, Metaspace, Replace):
// a decoder maps the list of token strings to another list (decode_chain);
// the text is their concatenation.
#include "Parts.h"

namespace moert::tokenizer {

namespace {

std::unique_ptr<Decoder> decoderOf(const JsonFields &o);

struct SequenceDecoder final : Decoder {
  std::vector<std::unique_ptr<Decoder>> parts;
  void apply(std::vector<std::string> &tokens) const override {
    for (const auto &p : parts)
      p->apply(tokens);
  }
};

/// The bytes behind each token's characters (a token with a character
/// outside the byte alphabet stays as its UTF-8), joined, then made valid
/// UTF-8 (from_utf8_lossy).
struct ByteLevelDecoder final : Decoder {
  void apply(std::vector<std::string> &tokens) const override {
    static const std::vector<int> byteOf = [] {
      std::vector<int> t(512, -1);
      const std::vector<char32_t> &chars = byteLevelChars();
      for (int b = 0; b < 256; ++b)
        t[chars[b]] = b;
      return t;
    }();
    std::string bytes;
    for (const std::string &t : tokens) {
      std::string mapped;
      bool all = true;
      for (size_t i = 0; i < t.size() && all;) {
        size_t length = 0;
        char32_t c = codePointAt(t, i, &length);
        if (c < byteOf.size() && byteOf[c] >= 0)
          mapped.push_back(static_cast<char>(byteOf[c]));
        else
          all = false;
        i += length;
      }
      bytes += all ? mapped : t;
    }
    tokens.assign(1, validUtf8(bytes));
  }
};

struct MetaspaceDecoder final : Decoder {
  std::string rep;
  bool dropFirst = true; ///< prepend_scheme is not "never"
  void apply(std::vector<std::string> &tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string &t = tokens[i];
      for (size_t at = 0; at < t.size();) {
        if (t.compare(at, rep.size(), rep) == 0) {
          if (!(i == 0 && dropFirst))
            out.push_back(' ');
          at += rep.size();
        } else {
          out.push_back(t[at++]);
        }
      }
      tokens[i] = std::move(out);
    }
  }
};

struct ReplaceDecoder final : Decoder {
  Pattern pattern;
  std::string content;
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern(std::move(pattern)), content(std::move(content)) {}
  void apply(std::vector<std::string> &tokens) const override {
    for (std::string &t : tokens)
      t = replaceAll(pattern, content, t);
  }
};

/// <0xAB> tokens become their bytes; a run of them that is not valid UTF-8
/// becomes one U+FFFD per byte.
struct ByteFallbackDecoder final : Decoder {
  static int byteOf(const std::string &t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>')
      return -1;
    int value = 0;
    for (int i = 3; i < 5; ++i) {
      const char c = t[i];
      int digit = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
      if (digit < 0)
        return -1;
      value = value * 16 + digit;
    }
    return value;
  }
  void apply(std::vector<std::string> &tokens) const override {
    std::vector<std::string> out;
    std::string run;
    auto flush = [&] {
      if (run.empty())
        return;
      if (validUtf8(run) == run)
        out.push_back(run);
      else
        for (size_t i = 0; i < run.size(); ++i)
          out.push_back("\xEF\xBF\xBD");
      run.clear();
    };
    for (std::string &t : tokens) {
      int b = byteOf(t);
      if (b >= 0) {
        run.push_back(static_cast<char>(b));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

struct FuseDecoder final : Decoder {
  void apply(std::vector<std::string> &tokens) const override {
    std::string all;
    for (const std::string &t : tokens)
      all += t;
    tokens.assign(1, all);
  }
};

/// Up to `start` leading and `stop` trailing `content` characters removed
/// from every token.
struct StripDecoder final : Decoder {
  char32_t content;
  size_t start, stop;
  void apply(std::vector<std::string> &tokens) const override {
    for (std::string &t : tokens) {
      std::vector<std::pair<size_t, char32_t>> chars; // byte offset, char
      for (size_t i = 0; i < t.size();) {
        size_t length = 0;
        chars.push_back({i, codePointAt(t, i, &length)});
        i += length;
      }
      size_t startCut = 0;
      for (size_t i = 0; i < std::min(start, chars.size()) && chars[i].second == content; ++i)
        startCut = i + 1;
      size_t stopCut = chars.size();
      for (size_t i = 0; i < stop && i < chars.size(); ++i) {
        size_t index = chars.size() - i - 1;
        if (chars[index].second != content)
          break;
        stopCut = index;
      }
      if (stopCut <= startCut) {
        t.clear();
        continue;
      }
      const size_t from = chars[startCut].first;
      const size_t to = stopCut < chars.size() ? chars[stopCut].first : t.size();
      t = t.substr(from, to - from);
    }
  }
};

std::unique_ptr<Decoder> decoderOf(const JsonFields &o) {
  const std::string type = o.string("type");
  if (type == "Sequence") {
    auto d = std::make_unique<SequenceDecoder>();
    for (size_t i = 0; i < o.array("decoders").size(); ++i)
      d->parts.push_back(decoderOf(o.element("decoders", i)));
    return d;
  }
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    auto d = std::make_unique<MetaspaceDecoder>();
    appendUtf8(d->rep, singleChar(o, "replacement"));
    d->dropFirst = readPrependScheme(o) != Prepend::Never;
    return d;
  }
  if (type == "Replace")
    return std::make_unique<ReplaceDecoder>(Pattern(o, "pattern"), o.string("content"));
  if (type == "ByteFallback")
    return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse")
    return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    auto d = std::make_unique<StripDecoder>();
    d->content = singleChar(o, "content");
    d->start = static_cast<size_t>(o.integer("start", 0));
    d->stop = static_cast<size_t>(o.integer("stop", 0));
    return d;
  }
  inputError("{}: not supported yet: decoder {}", o.fieldName("type"), type);
}

} // namespace

std::unique_ptr<Decoder> readDecoder(const JsonFields &parent, const std::string &field) {
  if (!parent.has(field) || parent.get(field).is_null())
    return nullptr;
  return decoderOf(parent.child(field));
}

} // namespace moert::tokenizer
