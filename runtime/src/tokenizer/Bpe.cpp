// The BPE model of tokenizer.json, as `tokenizers` runs it (models/bpe):
// characters (with continuing_subword_prefix / end_of_word_suffix) to ids,
// unknown characters through byte fallback (<0xAB> tokens), then the unk
// token (fused when fuse_unk) or nothing; then merges by rank, lowest rank
// first and leftmost among equal ranks; ignore_merges takes a word that is
// in the vocabulary as is.
#include "Parts.h"

#include <queue>

namespace moert::tokenizer {

namespace {
uint64_t pairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
} // namespace

Bpe::Bpe(const JsonFields &model) {
  const std::string type = model.has("type") ? model.string("type") : "BPE";
  if (type != "BPE")
    inputError("{}: not supported yet: model {}", model.fieldName("type"), type);
  if (model.has("dropout") && !model.get("dropout").is_null() && model.number("dropout") != 0)
    inputError("{}: not supported yet: BPE dropout (encoding would be random)",
               model.fieldName("dropout"));
  auto optionalString = [&](const char *field) {
    return model.has(field) && !model.get(field).is_null() ? model.string(field) : std::string();
  };
  unkToken = optionalString("unk_token");
  prefix = optionalString("continuing_subword_prefix");
  suffix = optionalString("end_of_word_suffix");
  auto flag = [&](const char *field) {
    return model.has(field) && !model.get(field).is_null() && model.boolean(field);
  };
  fuseUnk = flag("fuse_unk");
  byteFallback = flag("byte_fallback");
  ignoreMerges = flag("ignore_merges");

  JsonFields vocabulary = model.child("vocab");
  const nlohmann::json &v = model.get("vocab");
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string &token = it.key();
    if (!it->is_number_integer() || it->get<int64_t>() < 0)
      vocabulary.fail(token, "expected a token id (an integer >= 0)");
    if (it->get<int64_t>() >= kMaxTokenId)
      vocabulary.fail(token, fmt::format("expected an id below {} (moert's limit)", kMaxTokenId));
    const auto id = static_cast<int32_t>(it->get<int64_t>());
    if (static_cast<size_t>(id) >= tokens.size()) {
      tokens.resize(static_cast<size_t>(id) + 1);
      hasToken.resize(static_cast<size_t>(id) + 1, false);
    }
    if (hasToken[id])
      vocabulary.fail(token, fmt::format("id {} is also token '{}'", id, tokens[id]));
    tokens[id] = token;
    hasToken[id] = true;
    vocab.emplace(token, id);
  }
  if (!unkToken.empty() && !vocab.count(unkToken))
    model.fail("unk_token", fmt::format("'{}' is not in the vocabulary", unkToken));
  for (int b = 0; b < 256; ++b) {
    auto found = vocab.find(fmt::format("<0x{:02X}>", b));
    byteIds[b] = found == vocab.end() ? -1 : found->second;
  }

  const nlohmann::json &list = model.array("merges");
  merges.reserve(list.size());
  for (size_t rank = 0; rank < list.size(); ++rank) {
    const nlohmann::json &m = list[rank];
    const std::string where = fmt::format("merges[{}]", rank);
    std::string a, b;
    if (m.is_string()) { // legacy "a b"
      const std::string s = m.get<std::string>();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        model.fail(where, fmt::format("'{}' is not two tokens separated by one space", s));
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      model.fail(where, "expected [\"left\", \"right\"] or \"left right\"");
    }
    auto left = vocab.find(a), right = vocab.find(b);
    if (left == vocab.end())
      model.fail(where, fmt::format("'{}' is not in the vocabulary", a));
    if (right == vocab.end())
      model.fail(where, fmt::format("'{}' is not in the vocabulary", b));
    if (b.compare(0, prefix.size(), prefix) != 0)
      model.fail(where, fmt::format("'{}' does not start with the continuing_subword_prefix", b));
    const std::string merged = a + b.substr(prefix.size());
    auto result = vocab.find(merged);
    if (result == vocab.end())
      model.fail(where, fmt::format("the merged token '{}' is not in the vocabulary", merged));
    merges[pairKey(left->second, right->second)] = {static_cast<uint32_t>(rank), result->second};
  }
}

const std::string *Bpe::token(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < tokens.size() && hasToken[id] ? &tokens[id]
                                                                             : nullptr;
}

const int32_t *Bpe::id(std::string_view token) const {
  auto found = vocab.find(std::string(token));
  return found == vocab.end() ? nullptr : &found->second;
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t> &out) const {
  if (ignoreMerges)
    if (const int32_t *whole = id(word)) {
      out.push_back(*whole);
      return;
    }
  mergeWord(word, out);
}

void Bpe::mergeWord(std::string_view w, std::vector<int32_t> &out) const {
  // The word's symbols (ids), as a linked list.
  std::vector<int32_t> ids;
  ids.reserve(w.size());
  int32_t unk = -1; // a pending unk symbol (fused ones collapse into it)
  const int32_t unkId = unkToken.empty() ? -1 : vocab.at(unkToken);
  std::string s;
  for (size_t i = 0; i < w.size();) {
    size_t length = 0;
    codePointAt(w, i, &length);
    const bool first = i == 0, last = i + length == w.size();
    s.assign(w.substr(i, length));
    if (!first && !prefix.empty())
      s.insert(0, prefix);
    if (last && !suffix.empty())
      s += suffix;
    if (const int32_t *known = id(s)) {
      if (unk >= 0) {
        ids.push_back(unk);
        unk = -1;
      }
      ids.push_back(*known);
    } else {
      bool fellBack = false;
      if (byteFallback) {
        bool all = true;
        for (unsigned char c : s)
          all = all && byteIds[c] >= 0;
        if (all) {
          // (tokenizers pushes a pending unk only when a known symbol comes)
          for (unsigned char c : s)
            ids.push_back(byteIds[c]);
          fellBack = true;
        }
      }
      if (!fellBack && unkId >= 0) {
        if (unk >= 0 && !fuseUnk)
          ids.push_back(unk);
        unk = unkId;
      }
    }
    i += length;
  }
  if (unk >= 0)
    ids.push_back(unk);

  const size_t n = ids.size();
  std::vector<int64_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int64_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int64_t>(i) + 1 : -1;
  }
  struct Merge {
    uint32_t rank;
    size_t pos;
    int32_t result;
    bool operator>(const Merge &o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Merge, std::vector<Merge>, std::greater<Merge>> queue;
  auto consider = [&](size_t pos) {
    if (next[pos] < 0)
      return;
    auto m = merges.find(pairKey(ids[pos], ids[static_cast<size_t>(next[pos])]));
    if (m != merges.end())
      queue.push({m->second.first, pos, m->second.second});
  };
  for (size_t i = 0; i + 1 < n; ++i)
    consider(i);
  while (!queue.empty()) {
    Merge top = queue.top();
    queue.pop();
    if (!alive[top.pos] || next[top.pos] < 0)
      continue;
    const auto right = static_cast<size_t>(next[top.pos]);
    auto m = merges.find(pairKey(ids[top.pos], ids[right]));
    if (m == merges.end() || m->second.second != top.result)
      continue; // stale: a symbol of the pair changed since it was queued
    ids[top.pos] = top.result;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] >= 0)
      prev[static_cast<size_t>(next[right])] = static_cast<int64_t>(top.pos);
    if (prev[top.pos] >= 0)
      consider(static_cast<size_t>(prev[top.pos]));
    consider(top.pos);
  }
  for (size_t i = 0; i < n; ++i)
    if (alive[i])
      out.push_back(ids[i]);
}

} // namespace moert::tokenizer
