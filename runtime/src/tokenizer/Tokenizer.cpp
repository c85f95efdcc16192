// moert::Tokenizer: reads tokenizer.json (+ tokenizer_config.json) and runs
// the pipeline of `tokenizers` (tokenizer/mod.rs, added_vocabulary.rs):
// added tokens are cut out of the raw text first (leftmost-longest; single
// word, lstrip and rstrip as there), the other pieces are normalized, cut
// again by the normalized added tokens, pre-tokenized and given to the BPE
// model; the post-processor adds the special tokens. Decoding maps ids to
// token strings (added tokens included) and runs the decoder.
#include "moert/Tokenizer.h"
#include "../InputFile.h"
#include "Parts.h"
#include "moert/Error.h"

#include <sys/stat.h>

#include <mutex>
#include <shared_mutex>

namespace moert {
namespace tokenizer {

struct AddedToken {
  int32_t id;
  std::string original; ///< as the file writes it (token_to_id)
  std::string content;  ///< what is matched (normalized, for a normalized token)
  std::string text;     ///< what decoding gives
  bool singleWord, lstrip, rstrip, normalized, special;
};

/// The added tokens of one kind (normalized or not), matched leftmost-longest.
class AddedMatcher {
public:
  void add(const AddedToken *t) {
    const auto first = static_cast<unsigned char>(t->content[0]);
    byFirst[first].push_back(t);
    any = true;
  }
  bool empty() const { return !any; }
  /// The leftmost-longest match at or after `from`: its token and start.
  const AddedToken *find(std::string_view s, size_t from, size_t *start) const {
    for (size_t i = from; i < s.size(); ++i) {
      const auto &candidates = byFirst[static_cast<unsigned char>(s[i])];
      const AddedToken *best = nullptr;
      for (const AddedToken *t : candidates)
        if (s.compare(i, t->content.size(), t->content) == 0 &&
            (!best || t->content.size() > best->content.size()))
          best = t;
      if (best) {
        *start = i;
        return best;
      }
    }
    return nullptr;
  }

private:
  std::vector<const AddedToken *> byFirst[256];
  bool any = false;
};

/// A piece of the input, or an added token found in it (id >= 0).
struct Split {
  Piece piece;
  int32_t id = -1;
};

struct Pipeline {
  std::string path;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> preTokenizer;
  std::unique_ptr<Decoder> decoder;
  std::unique_ptr<Bpe> model;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, const AddedToken *> addedById;
  std::unordered_map<std::string, int32_t> addedByContent;
  AddedMatcher raw, normalizedMatcher;
  /// Ids before and after the sequence when special tokens are added.
  std::vector<int32_t> before, after;
  std::optional<int32_t> eos;
  int64_t size = 0;

  mutable std::shared_mutex cacheMutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  void cutAddedTokens(const AddedMatcher &matcher, const Piece &piece,
                      std::vector<Split> &out) const;
  void tokenizeWord(const std::string &word, std::vector<int32_t> &out) const;
};

/// added_vocabulary.rs find_matches: splits `piece` around the added
/// tokens of `matcher`.
void Pipeline::cutAddedTokens(const AddedMatcher &matcher, const Piece &piece,
                              std::vector<Split> &out) const {
  const std::string &s = piece.text;
  size_t offset = 0, from = 0, start = 0;
  auto charBefore = [&](size_t at) {
    size_t i = at - 1, length = 0;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80)
      --i;
    return codePointAt(s, i, &length);
  };
  auto push = [&](size_t a, size_t b, int32_t id) {
    if (b > a || id >= 0)
      out.push_back({{s.substr(a, b - a), piece.atStart && a == 0}, id});
  };
  while (const AddedToken *t = matcher.find(s, from, &start)) {
    size_t stop = start + t->content.size();
    from = stop;
    if (t->singleWord) {
      size_t length = 0;
      const bool startSpace = start == 0 || !isWordChar(charBefore(start));
      const bool stopSpace = stop == s.size() || !isWordChar(codePointAt(s, stop, &length));
      if (!startSpace || !stopSpace)
        continue;
    }
    if (t->lstrip) {
      size_t newStart = start;
      while (newStart > 0 && isWhitespace(charBefore(newStart))) {
        size_t i = newStart - 1;
        while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80)
          --i;
        newStart = i;
      }
      start = std::max(newStart, offset);
    }
    if (t->rstrip) {
      size_t length = 0;
      while (stop < s.size() && isWhitespace(codePointAt(s, stop, &length)))
        stop += length;
    }
    if (offset < start)
      push(offset, start, -1);
    out.push_back({{s.substr(start, stop - start), piece.atStart && start == 0}, t->id});
    offset = stop;
  }
  if (offset < s.size())
    push(offset, s.size(), -1);
}

void Pipeline::tokenizeWord(const std::string &word, std::vector<int32_t> &out) const {
  constexpr size_t kCacheWords = 10000, kCacheWordBytes = 256;
  {
    std::shared_lock lock(cacheMutex);
    auto hit = cache.find(word);
    if (hit != cache.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  const size_t first = out.size();
  model->tokenize(word, out);
  if (word.size() < kCacheWordBytes) {
    std::unique_lock lock(cacheMutex);
    if (cache.size() < kCacheWords)
      cache.emplace(word, std::vector<int32_t>(out.begin() + first, out.end()));
  }
}

namespace {

/// A tokenizer file's JSON text (at most 1 GiB, nesting bounded).
std::string readFile(const std::string &path) {
  std::string text = readInputFile(path, uint64_t(1) << 30, "a tokenizer file");
  checkJsonDepth(text, path);
  return text;
}

bool isDirectory(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

/// The post-processor's ids before and after the sequence.
void postProcessorOf(const JsonFields &o, Pipeline &p) {
  const std::string type = o.string("type");
  if (type == "ByteLevel")
    return; // offsets only
  if (type == "Sequence") {
    for (size_t i = 0; i < o.array("processors").size(); ++i)
      postProcessorOf(o.element("processors", i), p);
    return;
  }
  if (type == "TemplateProcessing") {
    const nlohmann::json &single = o.array("single");
    JsonFields specials = o.child("special_tokens");
    bool sequenceSeen = false;
    for (size_t i = 0; i < single.size(); ++i) {
      JsonFields item = o.element("single", i);
      if (item.has("Sequence")) {
        if (item.child("Sequence").string("id") != "A")
          item.fail("Sequence.id", "expected A (the single template has one sequence)");
        sequenceSeen = true;
        continue;
      }
      const std::string name = item.child("SpecialToken").string("id");
      for (int64_t id : specials.child(name).integers("ids", 0))
        (sequenceSeen ? p.after : p.before).push_back(static_cast<int32_t>(id));
    }
    if (!sequenceSeen)
      o.fail("single", "has no sequence ($A)");
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    auto idOf = [&](const char *f) {
      const nlohmann::json &pair = o.get(f);
      if (!pair.is_array() || pair.size() != 2 || !pair[1].is_number_integer() || pair[1] < 0)
        o.fail(f, "expected [token, id]");
      return pair[1].get<int32_t>();
    };
    p.before.push_back(idOf("cls"));
    p.after.push_back(idOf("sep"));
    return;
  }
  inputError("{}: not supported yet: post_processor {}", o.fieldName("type"), type);
}

void readPostProcessor(const JsonFields &parent, const std::string &field, Pipeline &p) {
  if (parent.has(field) && !parent.get(field).is_null())
    postProcessorOf(parent.child(field), p);
}

/// A token of tokenizer_config.json: a string, {"content": ...}, or null.
std::optional<std::string> configToken(const nlohmann::json &config, const char *field,
                                       const std::string &path) {
  if (!config.contains(field) || config[field].is_null())
    return std::nullopt;
  const nlohmann::json &v = config[field];
  if (v.is_string())
    return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  inputError("{}: {}: expected a token (a string or {{\"content\": ...}})", path, field);
}

void readConfig(const std::string &path, Pipeline &p) {
  const std::string text = readFile(path);
  nlohmann::json config = parseJsonObject(path, text.data(), text.data() + text.size(),
                                          "tokenizer_config.json");
  auto idOf = [&](const char *field) -> std::optional<int32_t> {
    auto token = configToken(config, field, path);
    if (!token)
      return std::nullopt;
    if (auto a = p.addedByContent.find(*token); a != p.addedByContent.end())
      return a->second;
    if (const int32_t *id = p.model->id(*token))
      return *id;
    inputError("{}: {}: '{}' is not a token of {}", path, field, *token, p.path);
  };
  p.eos = idOf("eos_token");
  const std::optional<int32_t> bos = idOf("bos_token");
  // transformers' Llama tokenizers rebuild the template from these flags.
  auto flag = [&](const char *field) -> std::optional<bool> {
    if (!config.contains(field) || config[field].is_null())
      return std::nullopt;
    if (!config[field].is_boolean())
      inputError("{}: {}: expected true or false", path, field);
    return config[field].get<bool>();
  };
  const std::optional<bool> addBos = flag("add_bos_token"), addEos = flag("add_eos_token");
  if (!addBos && !addEos)
    return;
  p.before.clear();
  p.after.clear();
  if (addBos.value_or(false)) {
    if (!bos)
      inputError("{}: add_bos_token is true but bos_token names no token", path);
    p.before.push_back(*bos);
  }
  if (addEos.value_or(false)) {
    if (!p.eos)
      inputError("{}: add_eos_token is true but eos_token names no token", path);
    p.after.push_back(*p.eos);
  }
}

std::unique_ptr<Pipeline> readTokenizer(const std::string &path, const std::string &configPath) {
  auto p = std::make_unique<Pipeline>();
  p->path = path;
  const std::string text = readFile(path);
  nlohmann::json root =
      parseJsonObject(path, text.data(), text.data() + text.size(), "tokenizer.json");
  JsonFields o(root, p->path, "");
  for (const char *field : {"truncation", "padding"})
    if (o.has(field) && !o.get(field).is_null())
      inputError("{}: not supported yet: {} (moert encodes whole texts)", o.fieldName(field),
                 field);
  p->model = std::make_unique<Bpe>(o.child("model"));
  p->normalizer = readNormalizer(o, "normalizer");
  p->preTokenizer = readPreTokenizer(o, "pre_tokenizer");
  p->decoder = readDecoder(o, "decoder");
  readPostProcessor(o, "post_processor", *p);

  int64_t maxId = p->model->size() - 1;
  if (o.has("added_tokens")) {
    const nlohmann::json &list = o.array("added_tokens");
    p->added.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      JsonFields t = o.element("added_tokens", i);
      auto flag = [&](const char *f, bool fallback) {
        return t.has(f) ? t.boolean(f) : fallback;
      };
      AddedToken a;
      a.id = static_cast<int32_t>(t.bounded("id", 0, kMaxTokenId - 1));
      a.original = a.text = t.string("content");
      if (a.text.empty() || validUtf8(a.text) != a.text)
        t.fail("content", "expected a non-empty UTF-8 string");
      a.special = flag("special", false);
      a.normalized = flag("normalized", !a.special);
      a.singleWord = flag("single_word", false);
      a.lstrip = flag("lstrip", false);
      a.rstrip = flag("rstrip", false);
      a.content = a.text;
      if (a.normalized && p->normalizer) {
        p->normalizer->apply(a.content);
        if (a.content.empty())
          t.fail("content", "is empty once normalized");
        a.text = a.content; // decoding gives the normalized form, as tokenizers does
      }
      if (const std::string *known = p->model->token(a.id); known && *known != a.original)
        t.fail("id", fmt::format("{} is the vocabulary's '{}'", a.id, *known));
      maxId = std::max<int64_t>(maxId, a.id);
      p->added.push_back(std::move(a));
    }
    for (const AddedToken &a : p->added) {
      (a.normalized ? p->normalizedMatcher : p->raw).add(&a);
      p->addedById[a.id] = &a;
      p->addedByContent[a.original] = a.id;
    }
  }
  p->size = maxId + 1;
  for (int32_t id : p->before)
    if (id > maxId)
      inputError("{}: post_processor: special token id {} is not in the vocabulary", path, id);
  for (int32_t id : p->after)
    if (id > maxId)
      inputError("{}: post_processor: special token id {} is not in the vocabulary", path, id);
  if (!configPath.empty())
    readConfig(configPath, *p);
  return p;
}

} // namespace
} // namespace tokenizer

using tokenizer::Piece;
using tokenizer::Split;

Tokenizer::Tokenizer(std::unique_ptr<tokenizer::Pipeline> pipeline)
    : pipeline(std::move(pipeline)) {}
Tokenizer::Tokenizer(Tokenizer &&) noexcept = default;
Tokenizer &Tokenizer::operator=(Tokenizer &&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string &path) {
  std::string file = path, dir;
  if (tokenizer::isDirectory(path)) {
    dir = path;
    file = path + "/tokenizer.json";
    if (!tokenizer::exists(file))
      inputError("{}: no tokenizer.json in this directory", path);
  } else {
    size_t slash = path.rfind('/');
    dir = slash == std::string::npos ? "." : path.substr(0, slash);
  }
  std::string config = dir + "/tokenizer_config.json";
  if (!tokenizer::exists(config))
    config.clear();
  return Tokenizer(tokenizer::readTokenizer(file, config));
}

std::optional<Tokenizer> Tokenizer::find(const std::string &weightsDir) {
  if (!tokenizer::exists(weightsDir + "/tokenizer.json"))
    return std::nullopt;
  return load(weightsDir);
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool addSpecialTokens) const {
  const tokenizer::Pipeline &p = *pipeline;
  std::vector<Split> splits;
  p.cutAddedTokens(p.raw, Piece{tokenizer::validUtf8(input), true}, splits);
  std::vector<int32_t> ids;
  if (addSpecialTokens)
    ids = p.before;
  std::vector<Split> normalized;
  std::vector<Piece> pieces;
  for (Split &s : splits) {
    if (s.id >= 0) {
      ids.push_back(s.id);
      continue;
    }
    if (p.normalizer)
      p.normalizer->apply(s.piece.text);
    normalized.clear();
    p.cutAddedTokens(p.normalizedMatcher, s.piece, normalized);
    for (Split &n : normalized) {
      if (n.id >= 0) {
        ids.push_back(n.id);
        continue;
      }
      pieces.assign(1, std::move(n.piece));
      if (p.preTokenizer)
        p.preTokenizer->apply(pieces);
      for (const Piece &word : pieces)
        if (!word.text.empty())
          p.tokenizeWord(word.text, ids);
    }
  }
  if (addSpecialTokens)
    ids.insert(ids.end(), p.after.begin(), p.after.end());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t> &ids, bool skipSpecialTokens) const {
  const tokenizer::Pipeline &p = *pipeline;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (auto a = p.addedById.find(id); a != p.addedById.end()) {
      if (!(skipSpecialTokens && a->second->special))
        tokens.push_back(a->second->text);
    } else if (const std::string *t = p.model->token(id)) {
      tokens.push_back(*t);
    }
  }
  if (!p.decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i)
      out += (i ? " " : "") + tokens[i];
    return out;
  }
  p.decoder->apply(tokens);
  std::string out;
  for (const std::string &t : tokens)
    out += t;
  return out;
}

int64_t Tokenizer::size() const { return pipeline->size; }
const std::string &Tokenizer::path() const { return pipeline->path; }
std::optional<int32_t> Tokenizer::eosId() const { return pipeline->eos; }

std::optional<int32_t> Tokenizer::tokenId(std::string_view token) const {
  if (auto a = pipeline->addedByContent.find(std::string(token));
      a != pipeline->addedByContent.end())
    return a->second;
  if (const int32_t *id = pipeline->model->id(token))
    return *id;
  return std::nullopt;
}

bool Tokenizer::isSpecial(int32_t id) const {
  auto a = pipeline->addedById.find(id);
  return a != pipeline->addedById.end() && a->second->special;
}

} // namespace moert
