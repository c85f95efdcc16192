// moert tokenize / detokenize, and the tokenizer of moert run --prompt
// (docs/tokenizer.md).
#include "TextCli.h"
#include "InputFile.h"
#include "JsonFields.h"
#include "moert/Error.h"
#include "moert/Npy.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

namespace moert {
namespace {

const char *kTokenizeUsage =
    R"(usage: moert tokenize --tokenizer PATH [--no-special] TEXT [TEXT ...]
       moert tokenize --tokenizer PATH --input FILE [--input FILE ...] --output PREFIX
                      [--jsonl-field KEY] [--lines] [--no-eos] [--threads N]
       moert detokenize --tokenizer PATH [--skip-special] IDS [IDS ...])";

/// The documents of one input: a JSONL file (one object per non-empty line,
/// its `field` a string), a text file one document per line (`lines`), or
/// the whole text file as one.
/// The JSON object of each non-empty line of a JSONL text, with its line
/// number; InputError naming the line.
std::vector<std::pair<int64_t, nlohmann::json>> jsonLines(const std::string &path,
                                                          const std::string &text) {
  std::vector<std::pair<int64_t, nlohmann::json>> objects;
  size_t at = 0;
  for (int64_t number = 1; at < text.size(); ++number) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos)
      end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    if (line.empty() || line == "\r")
      continue;
    checkJsonDepth(line, path);
    try {
      objects.emplace_back(number, nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception &e) {
      inputError("{}:{}: not valid JSON: {}", path, number, jsonMessage(e));
    }
  }
  return objects;
}

void readDocuments(const std::string &path, const std::string &jsonlField, bool lines,
                   std::vector<std::string> &documents) {
  const std::string text = readInputFile(path, uint64_t(1) << 40, "a text input");
  const bool jsonl = !jsonlField.empty() || (path.size() > 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0);
  if (jsonl) {
    const std::string field = jsonlField.empty() ? "text" : jsonlField;
    for (const auto &[number, object] : jsonLines(path, text)) {
      if (!object.is_object() || !object.contains(field) || !object[field].is_string())
        inputError("{}:{}: expected an object with a string field '{}'", path, number, field);
      documents.push_back(object[field].get<std::string>());
    }
    return;
  }
  if (!lines) {
    documents.push_back(text);
    return;
  }
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos)
      end = text.size();
    std::string_view line(text.data() + at, end - at);
    at = end + 1;
    if (!line.empty() && line != "\r")
      documents.emplace_back(line);
  }
}

/// Encodes the documents on `threads` threads (documents split in turn).
std::vector<std::vector<int32_t>> encodeAll(const Tokenizer &tokenizer,
                                            const std::vector<std::string> &documents,
                                            int threads, bool special = true) {
  std::vector<std::vector<int32_t>> out(documents.size());
  auto work = [&](int t) {
    for (size_t d = static_cast<size_t>(t); d < documents.size(); d += static_cast<size_t>(threads))
      out[d] = tokenizer.encode(documents[d], special);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t)
    pool.emplace_back(work, t);
  work(0);
  for (std::thread &t : pool)
    t.join();
  return out;
}

} // namespace

Tokenizer promptTokenizer(const std::string &tokenizerPath, const std::string &weightsDir,
                          int64_t vocabSize, const char *use) {
  std::optional<Tokenizer> tokenizer;
  if (!tokenizerPath.empty())
    tokenizer = Tokenizer::load(tokenizerPath);
  else
    tokenizer = Tokenizer::find(weightsDir);
  if (!tokenizer)
    inputError("{}: {} has no tokenizer.json (give the model's tokenizer with --tokenizer "
               "PATH{})",
               use, weightsDir,
               std::string(use) == "--prompt" ? ", or its ids with --tokens" : ", or token data");
  if (tokenizer->size() > vocabSize)
    inputError("{}: its ids go up to {}, but the model's vocabulary has {} (a tokenizer of "
               "another model?)",
               tokenizer->path(), tokenizer->size() - 1, vocabSize);
  return std::move(*tokenizer);
}

void TextStream::add(int32_t id) {
  ids.push_back(id);
  print(false);
}

void TextStream::finish() {
  print(true);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void TextStream::print(bool final) {
  const std::string text = tokenizer.decode(ids, /*skipSpecialTokens=*/true);
  // A character cut by the last token decodes as U+FFFD until its other
  // bytes come.
  if (!final && text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0)
    return;
  if (text.size() > printed) {
    std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
    std::fflush(stdout);
    printed = text.size();
  }
}

std::vector<int32_t> tokenizeInputs(const Tokenizer &tokenizer,
                                    const std::vector<std::string> &inputs,
                                    const std::string &jsonlField, bool lines, bool eos,
                                    int threads, const char *who, std::vector<int64_t> *offsets) {
  std::vector<std::string> documents;
  for (const std::string &path : inputs)
    readDocuments(path, jsonlField, lines, documents);
  std::optional<int32_t> eosId = eos ? tokenizer.eosId() : std::nullopt;
  size_t bytes = 0;
  for (const std::string &d : documents)
    bytes += d.size();
  auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<int32_t>> encoded = encodeAll(tokenizer, documents, threads);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<int32_t> tokens;
  if (offsets)
    offsets->assign(1, 0);
  for (const std::vector<int32_t> &ids : encoded) {
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    if (eosId)
      tokens.push_back(*eosId);
    if (offsets)
      offsets->push_back(static_cast<int64_t>(tokens.size()));
  }
  fmt::print(stderr,
             "{}: {} documents, {} bytes -> {} tokens{}; encoded in {:.3f} s "
             "({:.2f} MB/s on {} threads)\n",
             who, documents.size(), bytes, tokens.size(), eosId ? " (EOS after each)" : "",
             seconds, seconds > 0 ? static_cast<double>(bytes) / seconds / 1e6 : 0.0, threads);
  return tokens;
}

bool isPromptResponseJsonl(const std::string &path) {
  if (path.size() <= 6 || path.compare(path.size() - 6, 6, ".jsonl") != 0)
    return false;
  // The first non-empty line decides (the file is read whole once, later).
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line) && (line.empty() || line == "\r"))
    ;
  if (line.empty())
    return false;
  const nlohmann::json object = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  return object.is_object() && object.contains("prompt") && object.contains("response");
}

std::vector<int32_t> tokenizePromptResponses(const Tokenizer &tokenizer, const std::string &path,
                                             int threads, std::vector<uint8_t> &targets) {
  std::vector<std::string> prompts, responses;
  for (const auto &[number, object] :
       jsonLines(path, readInputFile(path, uint64_t(1) << 40, "a text input"))) {
    for (const char *field : {"prompt", "response"})
      if (!object.is_object() || !object.contains(field) || !object[field].is_string())
        inputError("{}:{}: expected an object with string fields 'prompt' and 'response'", path,
                   number);
    prompts.push_back(object["prompt"].get<std::string>());
    responses.push_back(object["response"].get<std::string>());
  }
  const std::vector<std::vector<int32_t>> p = encodeAll(tokenizer, prompts, threads);
  const std::vector<std::vector<int32_t>> r = encodeAll(tokenizer, responses, threads, false);
  const std::optional<int32_t> eos = tokenizer.eosId();
  std::vector<int32_t> tokens;
  targets.clear();
  int64_t trained = 0;
  for (size_t d = 0; d < p.size(); ++d) {
    tokens.insert(tokens.end(), p[d].begin(), p[d].end());
    targets.insert(targets.end(), p[d].size(), 0);
    tokens.insert(tokens.end(), r[d].begin(), r[d].end());
    targets.insert(targets.end(), r[d].size(), 1);
    if (eos) {
      tokens.push_back(*eos);
      targets.push_back(1);
    }
  }
  for (uint8_t t : targets)
    trained += t;
  fmt::print(stderr, "moert train --data: {} prompt/response pairs -> {} tokens, {} of them "
                     "responses{} (the tokens the loss counts)\n",
             p.size(), tokens.size(), trained, eos ? " and EOS" : "");
  return tokens;
}

int tokenizeCommand(int argc, char **argv) {
  std::string tokenizerPath, output, jsonlField;
  std::vector<std::string> inputs, texts;
  bool special = true, eos = true, lines = false;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        inputError("{}: expected a value", arg);
      return argv[++i];
    };
    if (arg == "--tokenizer") tokenizerPath = value();
    else if (arg == "--input") inputs.push_back(value());
    else if (arg == "--output") output = value();
    else if (arg == "--jsonl-field") jsonlField = value();
    else if (arg == "--lines") lines = true;
    else if (arg == "--no-special") special = false;
    else if (arg == "--no-eos") eos = false;
    else if (arg == "--threads") {
      std::string v = value();
      threads = std::atoi(v.c_str());
      if (threads < 1 || threads > 1024)
        inputError("--threads: expected a value in [1, 1024] but got '{}'", v);
    } else if (arg.size() > 1 && arg[0] == '-') inputError("unknown option '{}'\n{}", arg, kTokenizeUsage);
    else texts.push_back(arg);
  }
  if (tokenizerPath.empty() || (texts.empty() == inputs.empty()) ||
      (inputs.empty() != output.empty()))
    inputError("expected texts, or --input files with --output\n{}", kTokenizeUsage);
  Tokenizer tokenizer = Tokenizer::load(tokenizerPath);
  if (!texts.empty()) {
    for (const std::string &t : texts)
      fmt::print("{}\n", fmt::join(tokenizer.encode(t, special), ","));
    return 0;
  }
  // Token data for training (docs/tokenizer.md): PREFIX.tokens.npy (int32,
  // every document's ids then EOS) and PREFIX.docs.npy (int64 offsets).
  std::vector<int64_t> offsets;
  std::vector<int32_t> tokens =
      tokenizeInputs(tokenizer, inputs, jsonlField, lines, eos, threads, "moert tokenize", &offsets);
  writeNpy(output + ".tokens.npy", {static_cast<int64_t>(tokens.size())}, tokens);
  writeNpy(output + ".docs.npy", {static_cast<int64_t>(offsets.size())}, offsets);
  return 0;
}

int detokenizeCommand(int argc, char **argv) {
  std::string tokenizerPath;
  std::vector<std::vector<int32_t>> lists;
  bool skip = false;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--tokenizer") {
      if (i + 1 >= argc)
        inputError("--tokenizer: expected a value");
      tokenizerPath = argv[++i];
    } else if (arg == "--skip-special") {
      skip = true;
    } else if (arg.size() > 1 && arg[0] == '-' && !(arg[1] >= '0' && arg[1] <= '9')) {
      inputError("unknown option '{}'\n{}", arg, kTokenizeUsage);
    } else {
      lists.push_back(parseTokenIds(arg.c_str(), "moert detokenize"));
    }
  }
  if (tokenizerPath.empty() || lists.empty())
    inputError("expected --tokenizer and ids\n{}", kTokenizeUsage);
  Tokenizer tokenizer = Tokenizer::load(tokenizerPath);
  for (const std::vector<int32_t> &ids : lists) {
    for (int32_t id : ids)
      if (id < 0 || id >= tokenizer.size())
        inputError("token id {} is not in {} (ids 0 to {})", id, tokenizer.path(),
                   tokenizer.size() - 1);
    fmt::print("{}\n", tokenizer.decode(ids, skip));
  }
  return 0;
}

} // namespace moert
