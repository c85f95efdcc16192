// A model's own tokenizer, read from its Hugging Face tokenizer.json (and
// tokenizer_config.json beside it), encoding and decoding exactly as the
// `tokenizers` library does for the kinds the supported families publish:
// byte-level BPE (GPT-2, Llama-3, Qwen2, DeepSeek-V3 pre-tokenizers) and
// SentencePiece-style BPE (Prepend/Replace normalizers or Metaspace, byte
// fallback), added and special tokens, and the decoders that undo them.
// Any other kind of model, normalizer, pre-tokenizer, post-processor or
// decoder is refused ("not supported yet: ..." naming the file and field).
// docs/tokenizer.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moert {

namespace tokenizer {
struct Pipeline;
}

class Tokenizer {
public:
  /// Reads PATH: a tokenizer.json, or a directory holding one (and maybe a
  /// tokenizer_config.json). Bad files: InputError naming the file and field.
  static Tokenizer load(const std::string &path);
  /// The tokenizer of a weights directory (its tokenizer.json), if it has one.
  static std::optional<Tokenizer> find(const std::string &weightsDir);

  Tokenizer(Tokenizer &&) noexcept;
  Tokenizer &operator=(Tokenizer &&) noexcept;
  ~Tokenizer();

  /// Token ids of `text`, as tokenizers' `encode(text, add_special_tokens)`.
  /// Invalid UTF-8 is first replaced by U+FFFD (one per maximal invalid
  /// subsequence, as Python's bytes.decode("utf-8", "replace")).
  std::vector<int32_t> encode(std::string_view text, bool addSpecialTokens = true) const;
  /// The text of `ids`, as tokenizers' `decode(ids, skip_special_tokens)`;
  /// ids the tokenizer does not know are left out, as it leaves them.
  std::string decode(const std::vector<int32_t> &ids, bool skipSpecialTokens = false) const;

  /// One past the largest id the tokenizer can produce.
  int64_t size() const;
  /// The file it was read from.
  const std::string &path() const;
  /// The id of a token (model vocabulary or added token), if it exists.
  std::optional<int32_t> tokenId(std::string_view token) const;
  /// tokenizer_config.json's eos_token, when it names a token.
  std::optional<int32_t> eosId() const;
  /// True for the ids of special added tokens.
  bool isSpecial(int32_t id) const;

private:
  explicit Tokenizer(std::unique_ptr<tokenizer::Pipeline> pipeline);
  std::unique_ptr<tokenizer::Pipeline> pipeline;
};

} // namespace moert
