// The pieces of a tokenizer.json pipeline (internal to the runtime): each
// mirrors one component of Hugging Face `tokenizers` (the Rust crate, whose
// behaviour is the reference) for the kinds moert reads; Tokenizer.cpp reads
// the file and refuses the others. docs/tokenizer.md.
#pragma once

#include "../JsonFields.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace moert::tokenizer {

//===----------------------------------------------------------------------===//
// Unicode (Unicode.cpp: UTF-8 by hand, properties and normal forms from
// utf8proc)
//===----------------------------------------------------------------------===//

/// `bytes` with every maximal invalid UTF-8 subsequence replaced by U+FFFD
/// (Python's bytes.decode("utf-8", "replace"), Rust's from_utf8_lossy).
std::string validUtf8(std::string_view bytes);
/// The code point at byte `i` of valid UTF-8 and its length in bytes.
char32_t codePointAt(std::string_view s, size_t i, size_t *length);
void appendUtf8(std::string &out, char32_t c);
/// Unicode White_Space (Rust's char::is_whitespace).
bool isWhitespace(char32_t c);
/// Rust regex's Unicode \w: letters, marks, decimal digits, connector
/// punctuation, joiners.
bool isWordChar(char32_t c);
/// Rust's char::is_numeric: general categories Nd, Nl, No.
bool isNumeric(char32_t c);
enum class NormalForm { NFC, NFD, NFKC, NFKD };
std::string normalize(std::string_view s, NormalForm form);

//===----------------------------------------------------------------------===//
// Patterns (Regex.cpp)
//===----------------------------------------------------------------------===//

/// One slice of a string and whether it is a match (tokenizers' Pattern::
/// find_matches: the slices cover the string, in order).
struct Slice {
  size_t start, end;
  bool match;
};

/// A tokenizer.json pattern: {"String": s} (literal) or {"Regex": r}, an
/// Oniguruma regex as `tokenizers` compiles it, run by PCRE2 (Unicode
/// classes \s \S \w \W rewritten to Oniguruma's sets first).
class Pattern {
public:
  /// `where` names the field in errors ("FILE: FIELD: ...").
  Pattern(const JsonFields &fields, const std::string &field);
  static Pattern literal(std::string_view text, const std::string &where);
  static Pattern regex(const std::string &regex, const std::string &where);
  Pattern(Pattern &&) noexcept;
  ~Pattern();
  std::vector<Slice> findMatches(std::string_view s) const;

private:
  Pattern() = default;
  void compile(const std::string &regex, const std::string &where);
  struct Code;
  std::unique_ptr<Code> code;
};

//===----------------------------------------------------------------------===//
// Pipeline stages
//===----------------------------------------------------------------------===//

/// A piece of the input on its way to the model: text, and whether it
/// starts at the beginning of the original input (Metaspace's "first").
struct Piece {
  std::string text;
  bool atStart = false;
};

class Normalizer {
public:
  virtual ~Normalizer() = default;
  virtual void apply(std::string &s) const = 0;
};

class PreTokenizer {
public:
  virtual ~PreTokenizer() = default;
  /// Splits every piece (empty pieces are dropped afterwards).
  virtual void apply(std::vector<Piece> &pieces) const = 0;
};

class Decoder {
public:
  virtual ~Decoder() = default;
  /// tokenizers' Decoder::decode_chain.
  virtual void apply(std::vector<std::string> &tokens) const = 0;
};

/// Readers of one component object; null for JSON null. Refuse unknown
/// kinds with "not supported yet: <where> <type>".
std::unique_ptr<Normalizer> readNormalizer(const JsonFields &fields, const std::string &field);
std::unique_ptr<PreTokenizer> readPreTokenizer(const JsonFields &fields, const std::string &field);
std::unique_ptr<Decoder> readDecoder(const JsonFields &fields, const std::string &field);

/// A boolean field that may be absent or null (then `fallback`).
bool flag(const JsonFields &o, const std::string &field, bool fallback);
/// A field holding exactly one character.
char32_t singleChar(const JsonFields &o, const std::string &field);
/// `s` with every match of `pattern` replaced by `content`.
std::string replaceAll(const Pattern &pattern, const std::string &content, std::string_view s);
/// Metaspace's prepend_scheme (default always; add_prefix_space: false
/// means never), as its pre-tokenizer and decoder read it.
enum class Prepend { Always, First, Never };
Prepend readPrependScheme(const JsonFields &o);

/// The byte-level alphabet of GPT-2 (tokenizers' bytes_char): byte -> char.
const std::vector<char32_t> &byteLevelChars();

//===----------------------------------------------------------------------===//
// The BPE model (Bpe.cpp)
//===----------------------------------------------------------------------===//

/// Token ids are below this (real vocabularies have at most a few 100k).
constexpr int64_t kMaxTokenId = int64_t(1) << 22;

class Bpe {
public:
  /// Reads "model" (type BPE) of the file.
  explicit Bpe(const JsonFields &model);
  /// Appends the ids of one pre-tokenized piece.
  void tokenize(std::string_view word, std::vector<int32_t> &out) const;
  const std::string *token(int32_t id) const;
  const int32_t *id(std::string_view token) const;
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }

private:
  void mergeWord(std::string_view word, std::vector<int32_t> &out) const;

  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> tokens; ///< by id ("" where no token has the id)
  std::vector<bool> hasToken;
  /// (left id, right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<uint32_t, int32_t>> merges;
  std::string unkToken, prefix, suffix;
  bool fuseUnk = false, byteFallback = false, ignoreMerges = false;
  int32_t byteIds[256];
  bool allBytes = false;
};

} // namespace moert::tokenizer
