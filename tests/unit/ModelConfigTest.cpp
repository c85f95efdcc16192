// Units of the Hugging Face frontend: config parsing, checkpoint layout and
// parameter counts, checked against sums written out by hand.
#include "moe/Frontend/HF/ModelConfig.h"

#include "gtest/gtest.h"
#include <map>

using namespace moe::hf;

namespace {

ModelConfig parse(const std::string &text) {
  llvm::Expected<ModelConfig> c = parseModelConfig(text, "test/config.json");
  if (!c) {
    ADD_FAILURE() << llvm::toString(c.takeError());
    return ModelConfig();
  }
  return *c;
}

std::string parseError(const std::string &text) {
  llvm::Expected<ModelConfig> c = parseModelConfig(text, "test/config.json");
  if (c)
    return "(parsed)";
  return llvm::toString(c.takeError());
}

const char *kTinyMixtral = R"({
  "model_type": "mixtral", "vocab_size": 251, "hidden_size": 64,
  "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
  "rms_norm_eps": 1e-5, "rope_theta": 1e6, "tie_word_embeddings": false,
  "torch_dtype": "float32"})";

TEST(ModelConfig, MixtralFields) {
  ModelConfig c = parse(kTinyMixtral);
  EXPECT_EQ(c.modelType, "mixtral");
  EXPECT_EQ(c.headDim, 16);
  EXPECT_EQ(c.numKVHeads, 2);
  EXPECT_EQ(c.numExperts, 8);
  EXPECT_EQ(c.moeIntermediateSize, 96);
  EXPECT_TRUE(c.normTopK);
  EXPECT_EQ(c.numMoELayers(), 2);
  EXPECT_DOUBLE_EQ(c.ropeTheta, 1e6);
}

TEST(ModelConfig, MixtralCountsByHand) {
  ModelConfig c = parse(kTinyMixtral);
  const int64_t h = 64, v = 251, inter = 96, e = 8, k = 2;
  const int64_t attention = h * h + 2 * (32 * h) + h * h;
  const int64_t norms = 2 * h;
  const int64_t experts = e * 3 * inter * h;
  const int64_t router = e * h;
  const int64_t perLayer = attention + norms + experts + router;
  ParamCounts p = countParameters(c);
  EXPECT_EQ(p.total, 2 * v * h + 2 * perLayer + h);
  EXPECT_EQ(p.routedExperts, 2 * experts);
  EXPECT_EQ(p.active, p.total - 2 * experts + 2 * (k * 3 * inter * h));
  EXPECT_EQ(p.embedding, v * h);
  EXPECT_EQ(p.lmHead, v * h);
}

TEST(ModelConfig, TiedEmbeddingsAreCountedOnce) {
  ModelConfig c = parse(R"({"model_type": "llama", "vocab_size": 100,
    "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
    "num_attention_heads": 2, "tie_word_embeddings": true})");
  ParamCounts p = countParameters(c);
  EXPECT_EQ(p.lmHead, 0);
  EXPECT_EQ(p.total, p.active);
  // embed + (norm, q, k, v, o, norm, gate, up, down) + final norm
  EXPECT_EQ(p.total, 100 * 8 + (8 + 4 * 64 + 8 + 3 * 128) + 8);
}

TEST(ModelConfig, PerExpertTensorNamesAsPublished) {
  ModelConfig c = parse(kTinyMixtral);
  std::vector<TensorSpec> tensors = checkpointTensors(c);
  auto find = [&](const std::string &name) {
    for (const TensorSpec &t : tensors)
      if (t.name == name)
        return t;
    ADD_FAILURE() << "no tensor " << name;
    return TensorSpec();
  };
  EXPECT_EQ(find("model.layers.1.block_sparse_moe.experts.7.w2.weight").shape,
            (std::vector<int64_t>{64, 96}));
  EXPECT_EQ(find("model.layers.0.block_sparse_moe.gate.weight").shape,
            (std::vector<int64_t>{8, 64}));
  EXPECT_EQ(find("model.layers.0.self_attn.k_proj.weight").shape,
            (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(find("lm_head.weight").role, TensorRole::LMHead);
}

TEST(ModelConfig, DeepSeekDenseAndMoELayers) {
  ModelConfig c = parse(R"({"model_type": "deepseek_v3", "vocab_size": 97,
    "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 4,
    "topk_group": 2, "kv_lora_rank": 16, "q_lora_rank": 24,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
    "norm_topk_prob": true, "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "num_nextn_predict_layers": 1})");
  EXPECT_EQ(c.moeLayers, (std::vector<bool>{false, true, true, true}));
  EXPECT_TRUE(c.isMLA());
  EXPECT_TRUE(c.scoreCorrectionBias);
  EXPECT_EQ(c.groupScoring, GroupScoring::Top2Sum);
  EXPECT_EQ(c.headDim, 12);
  ParamCounts p = countParameters(c);
  EXPECT_GT(p.mtp, 0);
  // The MTP module is reported apart from the total.
  int64_t sum = 0;
  for (const TensorSpec &t : checkpointTensors(c))
    sum += t.numel();
  EXPECT_EQ(p.total, sum);
}

TEST(ModelConfig, QwenSparseStepAndMlpOnlyLayers) {
  ModelConfig c = parse(R"({"model_type": "qwen2_moe", "vocab_size": 97,
    "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2,
    "decoder_sparse_step": 2, "mlp_only_layers": [3]})");
  EXPECT_EQ(c.moeLayers, (std::vector<bool>{false, true, false, false}));
  EXPECT_TRUE(c.sharedExpertGate);
  EXPECT_TRUE(c.qkvBias);
}

TEST(ModelConfig, ErrorsNameFileAndField) {
  EXPECT_EQ(parseError(R"({"model_type": "mixtral"})"),
            "test/config.json: field 'vocab_size': missing (required)");
  EXPECT_EQ(parseError(R"({"model_type": "llama", "vocab_size": "many"})"),
            "test/config.json: field 'vocab_size': expected an integer but got "
            "a string");
  EXPECT_NE(parseError("{\"model_type\": \n  nope}").find(":2:"),
            std::string::npos);
}

} // namespace

namespace {

/// The tiny Mixtral with `quantization` as its quantization_config.
ModelConfig fp8Mixtral(const std::string &quantization) {
  std::string text = kTinyMixtral;
  text.insert(text.rfind('}'), ", \"quantization_config\": " + quantization);
  return parse(text);
}

} // namespace

// FP8 checkpoints store every nn.Linear weight in blocks but those
// modules_to_not_convert names, matched as transformers matches them (the
// module's last name, or a substring of its full name), and the LM head.
TEST(ModelConfig, Fp8WeightsAsTransformersConvertsThem) {
  ModelConfig c = fp8Mixtral(R"({"quant_method": "fp8", "weight_block_size": [64, 32],
      "modules_to_not_convert": ["model.layers.1.self_attn", "gate"]})");
  ASSERT_TRUE(c.fp8.has_value());
  EXPECT_EQ(c.fp8->blockRows, 64);
  EXPECT_EQ(c.fp8->blockCols, 32);
  EXPECT_TRUE(c.unsupportedFeature.empty()) << c.unsupportedFeature;
  std::map<std::string, const TensorSpec *> byName;
  std::vector<TensorSpec> specs = checkpointTensors(c);
  for (const TensorSpec &s : specs)
    byName[s.name] = &s;
  auto fp8 = [&](const std::string &name) {
    EXPECT_TRUE(byName.count(name)) << name;
    return byName.count(name) && byName[name]->isFp8();
  };
  EXPECT_TRUE(fp8("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_TRUE(fp8("model.layers.0.block_sparse_moe.experts.3.w2.weight"));
  EXPECT_FALSE(fp8("model.layers.1.self_attn.q_proj.weight")); // substring of the full name
  EXPECT_FALSE(fp8("model.layers.0.block_sparse_moe.gate.weight")); // the module's own name
  EXPECT_FALSE(fp8("lm_head.weight"));
  EXPECT_FALSE(fp8("model.embed_tokens.weight"));
  EXPECT_FALSE(fp8("model.layers.0.input_layernorm.weight"));
  // The scales beside an FP8 weight: one per block, ragged edges rounded up.
  const TensorSpec &w2 = *byName["model.layers.0.block_sparse_moe.experts.3.w2.weight"];
  TensorSpec scales = blockScalesOf(w2);
  EXPECT_EQ(scales.name, "model.layers.0.block_sparse_moe.experts.3.w2.weight_scale_inv");
  EXPECT_EQ(scales.shape, (std::vector<int64_t>{1, 3})); // [64, 96] in blocks of 64 x 32
  EXPECT_EQ(scales.expert, 3);
  EXPECT_TRUE(scales.blockScales);
  EXPECT_FALSE(scales.isFp8());
  // Parameter counts are those of the logical model (scales are not
  // parameters).
  EXPECT_EQ(countParameters(c).total, countParameters(parse(kTinyMixtral)).total);
}

TEST(ModelConfig, Fp8LayoutsNotSupportedYet) {
  EXPECT_EQ(fp8Mixtral(R"({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]})")
                .unsupportedFeature,
            "quantization fp8 of fmt 'e5m2' (quantization_config.fmt)");
  EXPECT_EQ(fp8Mixtral(R"({"quant_method": "fp8"})").unsupportedFeature,
            "quantization fp8 without weight_block_size (per-tensor scales)");
  EXPECT_EQ(fp8Mixtral(R"({"quant_method": "mxfp4"})").unsupportedFeature,
            "quantization mxfp4 (quantization_config.quant_method)");
  std::string text = kTinyMixtral;
  text.insert(text.rfind('}'),
              R"(, "quantization_config": {"quant_method": "fp8", "weight_block_size": [0, 128]})");
  EXPECT_NE(parseError(text).find("field 'quantization_config.weight_block_size': expected two "
                                  "positive integers"),
            std::string::npos)
      << parseError(text);
}
