// Text in and out of the moert command line (TextCli.cpp): `moert tokenize`
// (text or text/JSONL files to ids or to token data for training), `moert
// detokenize`, and the tokenizer side of `moert run --prompt`.
#pragma once

#include "moert/Tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace moert {

int tokenizeCommand(int argc, char **argv);
/// Comma-separated token ids ("1,2,3"; "" is none); InputError naming
/// `option` (Cli.cpp).
std::vector<int32_t> parseTokenIds(const char *text, const char *option);
/// An integer option's value; InputError naming `option` (Cli.cpp).
int64_t parseInt(const std::string &option, const char *text);
/// A finite number option's value; InputError naming `option` (Cli.cpp).
double parseDouble(const std::string &option, const char *text);
/// The value after option argv[i] (advancing i); InputError naming the
/// option when it is the last argument (Cli.cpp).
const char *optionValue(int argc, char **argv, int &i);
int detokenizeCommand(int argc, char **argv);

/// The documents of `inputs` (text files, one document each or per line
/// with `lines`; JSONL files by their .jsonl name or `jsonlField`, one per
/// line) encoded on `threads` threads and joined, each followed by EOS when
/// `eos` and the tokenizer has one; `offsets` (if set) gets where each
/// document starts, then the total. Prints a line on stderr naming `who`.
std::vector<int32_t> tokenizeInputs(const Tokenizer &tokenizer,
                                    const std::vector<std::string> &inputs,
                                    const std::string &jsonlField, bool lines, bool eos,
                                    int threads, const char *who,
                                    std::vector<int64_t> *offsets = nullptr);

/// True when `path` is a JSONL file (by its name) whose first object has
/// "prompt" and "response" fields: fine-tuning data.
bool isPromptResponseJsonl(const std::string &path);
/// Fine-tuning data: per line of the JSONL file `path` the prompt's ids
/// (with the tokenizer's special tokens) then the response's (without) and
/// EOS; `targets` marks with 1 the ids a model learns to predict (the
/// response's and EOS), 0 the prompt's. InputError naming a bad line.
std::vector<int32_t> tokenizePromptResponses(const Tokenizer &tokenizer, const std::string &path,
                                             int threads, std::vector<uint8_t> &targets);

/// The tokenizer of `moert run --prompt` (or of `use`, the option that
/// needs it: moert train's text --data): --tokenizer PATH, else the one in
/// the weights directory; refused when its ids exceed the model's
/// vocabulary (a tokenizer of another model).
Tokenizer promptTokenizer(const std::string &tokenizerPath, const std::string &weightsDir,
                          int64_t vocabSize, const char *use = "--prompt");

/// Prints a continuation as it is generated: the text decoded so far, less
/// what was printed, once it does not end inside a character.
class TextStream {
public:
  explicit TextStream(const Tokenizer &tokenizer) : tokenizer(tokenizer) {}
  void add(int32_t id);
  /// Prints what is left and a newline.
  void finish();

private:
  void print(bool final);
  const Tokenizer &tokenizer;
  std::vector<int32_t> ids;
  size_t printed = 0;
};

} // namespace moert
