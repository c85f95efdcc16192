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
/// The value after option argv[i] (advancing i); InputError naming the
/// option when it is the last argument (Cli.cpp).
const char *optionValue(int argc, char **argv, int &i);
int detokenizeCommand(int argc, char **argv);

/// The tokenizer of `moert run --prompt`: --tokenizer PATH, else the one in
/// the weights directory; refused when its ids exceed the model's
/// vocabulary (a tokenizer of another model).
Tokenizer promptTokenizer(const std::string &tokenizerPath, const std::string &weightsDir,
                          int64_t vocabSize);

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
