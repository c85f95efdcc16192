// moert::Tokenizer against the `tokenizers` library: every fixture tokenizer
// (tests/fixtures/tokenizers/<kind>, made by generate.py there) encodes and
// decodes the whole test corpus exactly as tokenizers did, and random id
// sequences decode to its strings; bad tokenizer files are refused with the
// file and field named.
#include "moert/Error.h"
#include "moert/Tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace {

using moert::Tokenizer;
using nlohmann::json;

const std::string kDir = std::string(MOE_FIXTURES_DIR) + "/tokenizers";

json readJson(const std::string &path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  return json::parse(in);
}

std::string fromHex(const std::string &hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::vector<int32_t> ids(const json &v) { return v.get<std::vector<int32_t>>(); }

class TokenizerFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerFixture, EncodesAndDecodesTheCorpusAsTokenizers) {
  const std::string dir = kDir + "/" + GetParam();
  Tokenizer tok = Tokenizer::load(dir);
  const json corpus = readJson(kDir + "/corpus.json")["cases"];
  const json expected = readJson(dir + "/expected.json");
  ASSERT_EQ(corpus.size(), expected["cases"].size());
  for (size_t i = 0; i < corpus.size(); ++i) {
    const json &c = corpus[i], &e = expected["cases"][i];
    // Invalid UTF-8 goes in as raw bytes: moert replaces it as Python did.
    const std::string text =
        c.contains("bytes_hex") ? fromHex(c["bytes_hex"]) : c["text"].get<std::string>();
    SCOPED_TRACE("corpus case " + std::to_string(i) + ": " + c["text"].get<std::string>());
    EXPECT_EQ(tok.encode(text), ids(e["ids"]));
    EXPECT_EQ(tok.encode(text, /*addSpecialTokens=*/false), ids(e["ids_no_special"]));
    EXPECT_EQ(tok.decode(ids(e["ids"])), e["decoded"].get<std::string>());
    EXPECT_EQ(tok.decode(ids(e["ids"]), /*skipSpecialTokens=*/true),
              e["decoded_skip_special"].get<std::string>());
  }
  for (const json &d : expected["decode_cases"]) {
    SCOPED_TRACE("decode " + d["ids"].dump());
    EXPECT_EQ(tok.decode(ids(d["ids"])), d["decoded"].get<std::string>());
    EXPECT_EQ(tok.decode(ids(d["ids"]), true), d["decoded_skip_special"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, TokenizerFixture,
                         ::testing::Values("gpt2", "llama3", "qwen2", "deepseek_v3", "llama2",
                                           "metaspace"));

TEST(Tokenizer, SizeAndTokens) {
  Tokenizer tok = Tokenizer::load(kDir + "/llama2/tokenizer.json");
  EXPECT_EQ(tok.size(), 857); // 856 model tokens + the added "moe"
  EXPECT_EQ(tok.tokenId("<s>"), 1);
  EXPECT_EQ(tok.tokenId("<0x41>"), 3 + 0x41);
  EXPECT_EQ(tok.eosId(), 2); // tokenizer_config.json's eos_token
  EXPECT_TRUE(tok.isSpecial(2));
  EXPECT_FALSE(tok.tokenId("no such token"));
}

/// A copy of a fixture's tokenizer.json, edited, in a fresh directory.
class BadTokenizer : public ::testing::Test {
protected:
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() /
          ("moert-tokenizer-" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir);
    original = readJson(kDir + "/llama2/tokenizer.json");
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  std::string write(const std::string &text, const std::string &name = "tokenizer.json") {
    std::ofstream(dir / name) << text;
    return (dir / "tokenizer.json").string();
  }
  /// The InputError of loading `text`.
  std::string error(const std::string &text) {
    const std::string path = write(text);
    try {
      Tokenizer::load(path);
    } catch (const moert::InputError &e) {
      return e.what();
    }
    ADD_FAILURE() << "loaded";
    return "";
  }
  std::filesystem::path dir;
  json original;
};

TEST_F(BadTokenizer, TruncatedJsonNamesTheFile) {
  std::string text = original.dump();
  std::string message = error(text.substr(0, text.size() / 2));
  EXPECT_NE(message.find("tokenizer.json: tokenizer.json is not valid JSON"), std::string::npos)
      << message;
}

TEST_F(BadTokenizer, UnknownKindsAreNotSupportedYet) {
  json t = original;
  t["model"]["type"] = "Unigram";
  EXPECT_NE(error(t.dump()).find("model.type: not supported yet: model Unigram"),
            std::string::npos);
  t = original;
  t["normalizer"]["normalizers"][0] = {{"type", "Lowercase"}};
  EXPECT_NE(error(t.dump()).find("normalizer.normalizers[0].type: not supported yet: normalizer "
                                 "Lowercase"),
            std::string::npos);
  t = original;
  t["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_NE(error(t.dump()).find("pre_tokenizer.type: not supported yet: pre_tokenizer Whitespace"),
            std::string::npos);
  t = original;
  t["decoder"]["decoders"][1] = {{"type", "WordPiece"}};
  EXPECT_NE(error(t.dump()).find("decoder.decoders[1].type: not supported yet: decoder WordPiece"),
            std::string::npos);
  t = original;
  t["post_processor"] = {{"type", "Pairs"}};
  EXPECT_NE(error(t.dump()).find("post_processor.type: not supported yet: post_processor Pairs"),
            std::string::npos);
  t["post_processor"] = {{"type", "Sequence"},
                         {"processors", json::array({{{"type", "ByteLevel"}}, {{"type", "Pairs"}}})}};
  EXPECT_NE(error(t.dump()).find("post_processor.processors[1].type: not supported yet: "
                                 "post_processor Pairs"),
            std::string::npos);
  t = original;
  t["truncation"] = {{"max_length", 8}};
  EXPECT_NE(error(t.dump()).find("truncation: not supported yet: truncation"), std::string::npos);
  t = original;
  t["model"]["dropout"] = 0.1;
  EXPECT_NE(error(t.dump()).find("model.dropout: not supported yet: BPE dropout"),
            std::string::npos);
}

TEST_F(BadTokenizer, MergesNamingUnknownTokens) {
  json t = original;
  t["model"]["merges"][5] = json::array({"▁", "no-such-token"});
  EXPECT_NE(error(t.dump()).find("model.merges[5]: 'no-such-token' is not in the vocabulary"),
            std::string::npos);
  t = original;
  t["model"]["merges"][7] = "just-one";
  EXPECT_NE(error(t.dump()).find("model.merges[7]: 'just-one' is not two tokens"),
            std::string::npos);
  t = original;
  t["model"]["vocab"].erase("e▁");
  std::string message = error(t.dump());
  EXPECT_NE(message.find("model.merges[1]: the merged token 'e▁' is not in the vocabulary"),
            std::string::npos)
      << message;
}

TEST_F(BadTokenizer, BadIdsAndRegexes) {
  json t = original;
  t["model"]["vocab"]["<unk>"] = -3;
  EXPECT_NE(error(t.dump()).find("model.vocab.<unk>: expected a token id"), std::string::npos);
  t = original;
  t["added_tokens"][1]["id"] = 7;
  EXPECT_NE(error(t.dump()).find("added_tokens[1].id: 7 is the vocabulary's '<0x04>'"),
            std::string::npos);
  t = original;
  t["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "(unclosed"}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
  EXPECT_NE(error(t.dump()).find("pre_tokenizer.pattern: not a regex"), std::string::npos);
}

TEST_F(BadTokenizer, ConfigAddBosEosFlagsRebuildTheTemplate) {
  // transformers' Llama tokenizers: add_bos_token / add_eos_token decide.
  write(original.dump());
  write(R"({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": false,
            "add_eos_token": true})",
        "tokenizer_config.json");
  Tokenizer tok = Tokenizer::load(dir.string());
  Tokenizer plain = Tokenizer::load(kDir + "/llama2");
  std::vector<int32_t> body = plain.encode("Hello world", false);
  body.push_back(2);
  EXPECT_EQ(tok.encode("Hello world"), body);
  write(R"({"eos_token": "<nope>"})", "tokenizer_config.json");
  try {
    Tokenizer::load(dir.string());
    ADD_FAILURE() << "loaded";
  } catch (const moert::InputError &e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: eos_token: '<nope>' is not a token"),
              std::string::npos)
        << e.what();
  }
}

} // namespace
