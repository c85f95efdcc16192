//===- ModelConfig.cpp - parse and validate config.json --------*- C++ -*-===//
#include "moe/Frontend/HF/ModelConfig.h"
#include "ConfigText.h"
#include "moe/Support/JsonFields.h"

#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cmath>
#include <cstdio>

using namespace llvm;
using namespace moe::hf;
using namespace moe::hf::detail;
using moe::json_fields::Fields;

namespace {

/// The most decoder layers a config may have (moec's limit; see checkLimits).
constexpr int64_t kMaxLayers = 1024;

/// What transformers' config class of a family assumes for a field that a
/// config.json leaves out (4.57 and 5.x agree on these).
struct FamilyDefaults {
  int64_t maxPositionEmbeddings = 2048;
  double rmsNormEps = 1e-6, ropeTheta = 10000.0;
  int64_t expertsPerToken = 0; ///< 0: required
};

FamilyDefaults familyDefaults(StringRef type) {
  FamilyDefaults d;
  if (type == "mixtral") {
    d.maxPositionEmbeddings = 4096 * 32;
    d.rmsNormEps = 1e-5;
    d.ropeTheta = 1e6;
    d.expertsPerToken = 2;
  } else if (type == "qwen2_moe") {
    d.maxPositionEmbeddings = 32768;
    d.expertsPerToken = 4;
  } else if (type == "qwen3_moe") {
    d.maxPositionEmbeddings = 32768;
    d.expertsPerToken = 8;
  } else if (type == "olmoe") {
    d.maxPositionEmbeddings = 4096;
    d.rmsNormEps = 1e-5;
    d.expertsPerToken = 8;
  } else if (type == "deepseek_v3") {
    d.maxPositionEmbeddings = 4096;
    d.expertsPerToken = 8;
  }
  return d;
}

/// Fields shared by the Llama-style families.
Error parseFp8(const Fields &q, ModelConfig &c);

Error parseDecoderCommon(const Fields &f, ModelConfig &c) {
  const FamilyDefaults d = familyDefaults(c.modelType);
  MOE_ASSIGN(c.vocabSize, f.positive("vocab_size"));
  MOE_ASSIGN(c.hiddenSize, f.positive("hidden_size"));
  MOE_ASSIGN(c.numLayers, f.positive("num_hidden_layers"));
  if (c.numLayers > kMaxLayers) // before anything is sized by it
    return f.fail("num_hidden_layers", formatv("expected a value <= {0} (moec's limit) but got {1}",
                                       kMaxLayers, c.numLayers));
  MOE_ASSIGN(c.numHeads, f.positive("num_attention_heads"));
  MOE_ASSIGN(c.numKVHeads, f.positiveOr("num_key_value_heads", c.numHeads));
  MOE_ASSIGN(c.maxPositionEmbeddings,
             f.positiveOr("max_position_embeddings", d.maxPositionEmbeddings));
  MOE_ASSIGN(c.normEps, f.positiveNumber("rms_norm_eps", d.rmsNormEps));
  if (c.normEps > 1)
    return f.fail("rms_norm_eps", formatv("expected a value in (0, 1] but got {0}",
                                          spell(c.normEps)));
  MOE_ASSIGN(c.ropeTheta, f.positiveNumber("rope_theta", d.ropeTheta));
  MOE_ASSIGN(c.tieWordEmbeddings, f.boolean("tie_word_embeddings", false));
  // transformers >= 4.56 writes `dtype`; older checkpoints `torch_dtype`.
  MOE_ASSIGN(c.dtype, f.string("torch_dtype", "float32"));
  MOE_ASSIGN(c.dtype, f.string("dtype", c.dtype));
  MOE_ASSIGN(c.eosTokenIds, f.integers("eos_token_id"));
  MOE_ASSIGN(c.hiddenAct, f.string("hidden_act", "silu"));
  if (c.hiddenAct != "silu" && c.hiddenAct != "gelu" && c.hiddenAct != "relu" &&
      c.hiddenAct != "gelu_pytorch_tanh")
    return f.fail("hidden_act", "expected silu, gelu, gelu_pytorch_tanh or relu "
                                "but got '" + clip(c.hiddenAct) + "'");
  if (f.has("bos_token_id")) {
    int64_t bos;
    MOE_ASSIGN(bos, f.integer("bos_token_id"));
    c.bosTokenId = bos;
  }
  if (f.has("pad_token_id")) {
    int64_t pad;
    MOE_ASSIGN(pad, f.integer("pad_token_id"));
    c.padTokenId = pad;
  }
  if (!c.isMLA()) {
    if (f.has("head_dim")) {
      MOE_ASSIGN(c.headDim, f.positive("head_dim"));
    } else {
      if (c.hiddenSize % c.numHeads != 0)
        return f.fail("hidden_size",
                      formatv("expected a multiple of num_attention_heads ({0}) "
                              "but got {1}",
                              c.numHeads, c.hiddenSize));
      c.headDim = c.hiddenSize / c.numHeads;
    }
  }
  if (c.numHeads % c.numKVHeads != 0)
    return f.fail("num_key_value_heads",
                  formatv("expected a divisor of num_attention_heads ({0}) but "
                          "got {1}",
                          c.numHeads, c.numKVHeads));
  if (c.dtype != "float32" && c.dtype != "bfloat16" && c.dtype != "float16")
    return f.fail("torch_dtype", "expected float32, bfloat16 or float16 but got '" +
                                     clip(c.dtype) + "'");
  // Quantized checkpoints: transformers dequantizes (or runs) them by
  // quantization_config. FP8 block-scaled weights (DeepSeek-V3, FP8 Qwen3)
  // are read as published (docs/quantization.md); other kinds would load
  // tensors of another layout: refused here.
  std::optional<Fields> quantization;
  MOE_ASSIGN(quantization, f.nested("quantization_config"));
  if (quantization) {
    std::string method;
    MOE_ASSIGN(method, quantization->string("quant_method", ""));
    if (method != "fp8") {
      c.unsupportedFeature =
          "quantization " + (method.empty() ? std::string("without a quant_method") : clip(method)) +
          " (quantization_config.quant_method)";
    } else if (Error e = parseFp8(*quantization, c)) {
      return e;
    }
  }
  return parseRopeScaling(f, c);
}

/// quantization_config of quant_method fp8 (transformers'
/// FineGrainedFP8Config): e4m3 weights with one scale per weight block.
/// What would change the math another way is refused.
Error parseFp8(const Fields &q, ModelConfig &c) {
  ModelConfig::Fp8Quantization fp8;
  std::string fmt, activations;
  MOE_ASSIGN(fmt, q.string("fmt", "e4m3"));
  if (fmt != "e4m3")
    c.unsupportedFeature = "quantization fp8 of fmt '" + clip(fmt) + "' (quantization_config.fmt)";
  // dynamic: activations are not stored; DeepSeek's reference forward
  // (gemm_impl bf16) dequantises the weights and keeps activations as they are.
  MOE_ASSIGN(activations, q.string("activation_scheme", "dynamic"));
  if (activations != "dynamic" && c.unsupportedFeature.empty())
    c.unsupportedFeature = "quantization fp8 with activation_scheme '" + clip(activations) +
                           "' (quantization_config.activation_scheme)";
  if (q.has("weight_block_size")) {
    std::vector<int64_t> block;
    MOE_ASSIGN(block, q.integers("weight_block_size"));
    if (block.size() != 2 || block[0] <= 0 || block[1] <= 0)
      return q.fail("weight_block_size", "expected two positive integers [rows, cols]");
    fp8.blockRows = block[0];
    fp8.blockCols = block[1];
  } else if (c.unsupportedFeature.empty()) {
    // Per-tensor FP8 (no blocks) keeps one scale per tensor: another layout.
    c.unsupportedFeature = "quantization fp8 without weight_block_size (per-tensor scales)";
  }
  if (q.has("modules_to_not_convert")) {
    const json::Array *names = q.array("modules_to_not_convert");
    if (!names)
      return q.fail("modules_to_not_convert", "expected a list of module names");
    for (const json::Value &v : *names) {
      std::optional<StringRef> name = v.getAsString();
      if (!name)
        return q.fail("modules_to_not_convert", "expected a list of module names (strings)");
      fp8.notConverted.push_back(name->str());
    }
  }
  c.fp8 = std::move(fp8);
  return Error::success();
}

Error parseExperts(const Fields &f, ModelConfig &c, StringRef expertsField) {
  MOE_ASSIGN(c.numExperts, f.positive(expertsField));
  int64_t defaultK = familyDefaults(c.modelType).expertsPerToken;
  if (defaultK > 0)
    MOE_ASSIGN(c.expertsPerToken, f.positiveOr("num_experts_per_tok", defaultK));
  else
    MOE_ASSIGN(c.expertsPerToken, f.positive("num_experts_per_tok"));
  if (c.expertsPerToken > c.numExperts)
    return f.fail("num_experts_per_tok",
                  formatv("expected at most {0} ({1}) but got {2}", c.numExperts,
                          expertsField, c.expertsPerToken));
  return Error::success();
}

Error parseMixtral(const Fields &f, ModelConfig &c) {
  MOE_ASSIGN(c.intermediateSize, f.positive("intermediate_size"));
  if (Error e = parseExperts(f, c, "num_local_experts"))
    return e;
  c.moeIntermediateSize = c.intermediateSize;
  c.normTopK = true; // softmax over the top-k logits
  c.moeLayers.assign(c.numLayers, true);
  if (f.has("sliding_window")) {
    int64_t w;
    MOE_ASSIGN(w, f.positive("sliding_window"));
    c.slidingWindow = w;
  }
  return Error::success();
}

/// Qwen2-MoE and Qwen3-MoE: sparse every `decoder_sparse_step` layers except
/// `mlp_only_layers`.
Error parseQwenMoE(const Fields &f, ModelConfig &c, bool qwen3) {
  MOE_ASSIGN(c.intermediateSize, f.positive("intermediate_size"));
  // transformers 5.x writes Qwen3-MoE's expert count as num_local_experts.
  StringRef expertsField = "num_experts";
  if (qwen3 && !f.has("num_experts") && f.has("num_local_experts"))
    expertsField = "num_local_experts";
  if (Error e = parseExperts(f, c, expertsField))
    return e;
  MOE_ASSIGN(c.moeIntermediateSize, f.positive("moe_intermediate_size"));
  MOE_ASSIGN(c.normTopK, f.boolean("norm_topk_prob", false));
  int64_t step;
  MOE_ASSIGN(step, f.positiveOr("decoder_sparse_step", 1));
  std::vector<int64_t> mlpOnly;
  MOE_ASSIGN(mlpOnly, f.integers("mlp_only_layers"));
  c.moeLayers.assign(c.numLayers, false);
  for (int64_t i = 0; i < c.numLayers; ++i)
    c.moeLayers[i] = (i + 1) % step == 0 &&
                     llvm::find(mlpOnly, i) == mlpOnly.end();
  if (qwen3) {
    c.qkNorm = QKNorm::PerHead;
    MOE_ASSIGN(c.qkvBias, f.boolean("attention_bias", false));
    c.oBias = c.qkvBias;
  } else {
    // Qwen2 attention: q/k/v biased unless `qkv_bias` says otherwise, o not.
    MOE_ASSIGN(c.qkvBias, f.boolean("qkv_bias", true));
    MOE_ASSIGN(c.sharedExpertIntermediateSize,
               f.positive("shared_expert_intermediate_size"));
    c.numSharedExperts = 1;
    c.sharedExpertGate = true;
  }
  bool useSliding;
  MOE_ASSIGN(useSliding, f.boolean("use_sliding_window", false));
  if (useSliding)
    c.unsupportedFeature = "sliding-window attention on some layers "
                           "(use_sliding_window)";
  return Error::success();
}

Error parseOlmoe(const Fields &f, ModelConfig &c) {
  MOE_ASSIGN(c.intermediateSize, f.positive("intermediate_size"));
  if (Error e = parseExperts(f, c, "num_experts"))
    return e;
  c.moeIntermediateSize = c.intermediateSize;
  MOE_ASSIGN(c.normTopK, f.boolean("norm_topk_prob", false));
  MOE_ASSIGN(c.qkvBias, f.boolean("attention_bias", false));
  c.oBias = c.qkvBias;
  c.qkNorm = QKNorm::Full;
  c.moeLayers.assign(c.numLayers, true);
  if (f.has("clip_qkv"))
    c.unsupportedFeature = "clip_qkv";
  return Error::success();
}

Error parseDeepSeek(const Fields &f, ModelConfig &c, bool v3) {
  MOE_ASSIGN(c.kvLoraRank, f.positive("kv_lora_rank"));
  // Absent: transformers' class default (1536); null: no low-rank query.
  MOE_ASSIGN(c.qLoraRank, f.nonNegativeOr("q_lora_rank", f.isNull("q_lora_rank") ? 0 : 1536));
  MOE_ASSIGN(c.qkNopeHeadDim, f.positive("qk_nope_head_dim"));
  MOE_ASSIGN(c.qkRopeHeadDim, f.positive("qk_rope_head_dim"));
  MOE_ASSIGN(c.vHeadDim, f.positive("v_head_dim"));
  if (Error e = parseDecoderCommon(f, c))
    return e;
  c.headDim = c.qkNopeHeadDim + c.qkRopeHeadDim;
  MOE_ASSIGN(c.qkvBias, f.boolean("attention_bias", false));
  c.oBias = c.qkvBias;
  MOE_ASSIGN(c.intermediateSize, f.positive("intermediate_size"));
  if (Error e = parseExperts(f, c, "n_routed_experts"))
    return e;
  MOE_ASSIGN(c.moeIntermediateSize, f.positive("moe_intermediate_size"));
  // Absent: the class default (V2 2, V3 1); null: none (DeepSeek's code;
  // transformers 4.57 crashes on it and 5.x refuses it).
  MOE_ASSIGN(c.numSharedExperts,
             f.nonNegativeOr("n_shared_experts",
                             f.isNull("n_shared_experts") ? 0 : (v3 ? 1 : 2)));
  c.sharedExpertIntermediateSize = c.numSharedExperts * c.moeIntermediateSize;
  MOE_ASSIGN(c.normTopK, f.boolean("norm_topk_prob", v3));
  MOE_ASSIGN(c.routedScalingFactor,
             f.positiveNumber("routed_scaling_factor", v3 ? 2.5 : 1.0));
  int64_t firstDense, freq;
  MOE_ASSIGN(firstDense, f.nonNegativeOr("first_k_dense_replace", v3 ? 3 : 0));
  MOE_ASSIGN(freq, f.positiveOr("moe_layer_freq", 1));
  // transformers makes every layer from first_k_dense_replace on an MoE
  // layer; DeepSeek's code also requires layer % moe_layer_freq == 0. Every
  // published config has 1, where the two agree.
  if (freq != 1)
    c.unsupportedFeature = formatv("moe_layer_freq = {0} (transformers ignores "
                                   "it, DeepSeek's code honours it)", freq).str();
  c.moeLayers.assign(c.numLayers, false);
  for (int64_t i = 0; i < c.numLayers; ++i)
    c.moeLayers[i] = i >= firstDense;
  bool mlpBias;
  MOE_ASSIGN(mlpBias, f.boolean("mlp_bias", false));
  if (mlpBias)
    c.unsupportedFeature = "mlp_bias = true (biased expert and MLP projections)";
  if (v3)
    MOE_ASSIGN(c.ropeInterleave, f.boolean("rope_interleave", true));
  // The routing transformers' ports compute, whatever the config says:
  // V3 scores with a sigmoid, adds e_score_correction_bias for the choice,
  // keeps topk_group of n_group groups by the sum of their top-2 scores
  // (noaux_tc) and honours norm_topk_prob; V2 scores with a softmax, honours
  // topk_method greedy / group_limited_greedy (groups by their maximum) and
  // never normalises. Other values are refused, not reinterpreted.
  std::string scoring, method;
  MOE_ASSIGN(scoring, f.string("scoring_func", v3 ? "sigmoid" : "softmax"));
  MOE_ASSIGN(method, f.string("topk_method", v3 ? "noaux_tc" : "greedy"));
  auto refuse = [&](StringRef field, StringRef value, StringRef why) {
    if (c.unsupportedFeature.empty())
      c.unsupportedFeature = formatv("{0} = {1} ({2})", field, value, why).str();
  };
  if (v3) {
    c.scoring = Scoring::Sigmoid;
    if (scoring != "sigmoid")
      refuse("scoring_func", scoring, "transformers' deepseek_v3 always scores "
                                      "with a sigmoid");
    if (method != "noaux_tc")
      refuse("topk_method", method, "transformers' deepseek_v3 always routes "
                                    "noaux_tc");
  } else {
    c.scoring = Scoring::Softmax;
    if (scoring != "softmax")
      refuse("scoring_func", scoring, "transformers' deepseek_v2 always scores "
                                      "with a softmax");
    if (method != "greedy" && method != "group_limited_greedy")
      refuse("topk_method", method, "transformers' deepseek_v2 routes greedy "
                                    "or group_limited_greedy");
    if (c.normTopK)
      refuse("norm_topk_prob", "true", "transformers' deepseek_v2 never "
                                       "normalises; DeepSeek's code then skips "
                                       "routed_scaling_factor");
    c.normTopK = false;
  }
  MOE_ASSIGN(c.numGroups, f.positiveOr("n_group", v3 ? 8 : 1));
  MOE_ASSIGN(c.topkGroups, f.positiveOr("topk_group", v3 ? 4 : 1));
  if (v3) {
    c.groupScoring = GroupScoring::Top2Sum;
    c.scoreCorrectionBias = true;
  } else if (method == "group_limited_greedy") {
    c.groupScoring = GroupScoring::Max;
  } else {
    c.numGroups = c.topkGroups = 1;
  }
  if (c.topkGroups > c.numGroups)
    return f.fail("topk_group", formatv("expected at most n_group ({0}) but got {1}",
                                        c.numGroups, c.topkGroups));
  if (c.numExperts % c.numGroups != 0)
    return f.fail("n_group", formatv("expected a divisor of n_routed_experts "
                                     "({0}) but got {1}",
                                     c.numExperts, c.numGroups));
  if (v3 && c.numExperts / c.numGroups < 2)
    return f.fail("n_group", formatv("expected groups of at least 2 experts (noaux_tc "
                                     "scores a group by its top 2) but got {0} groups of "
                                     "{1} routed experts",
                                     c.numGroups, c.numExperts));
  if (c.topkGroups * (c.numExperts / c.numGroups) < c.expertsPerToken)
    return f.fail("topk_group",
                  formatv("expected the {0} kept groups of {1} experts to hold "
                          "num_experts_per_tok = {2}",
                          c.topkGroups, c.numExperts / c.numGroups,
                          c.expertsPerToken));
  c.routerInF32 = true;
  MOE_ASSIGN(c.numMTPLayers, f.nonNegativeOr("num_nextn_predict_layers", 0));
  return Error::success();
}

Error parseLlama(const Fields &f, ModelConfig &c) {
  MOE_ASSIGN(c.intermediateSize, f.positive("intermediate_size"));
  MOE_ASSIGN(c.qkvBias, f.boolean("attention_bias", false));
  c.oBias = c.qkvBias;
  MOE_ASSIGN(c.mlpBias, f.boolean("mlp_bias", false));
  if (c.mlpBias)
    c.unsupportedFeature = "mlp_bias = true (biased MLP projections)";
  c.moeLayers.assign(c.numLayers, false);
  return Error::success();
}

// Families parsed and counted, not yet imported.

Error parsePhimoe(const Fields &f, ModelConfig &c) {
  c.unsupportedFeature = "sparsemixer routing (phimoe)";
  c.norm = NormKind::LayerNorm;
  MOE_ASSIGN(c.qkvBias, f.boolean("attention_bias", false));
  c.oBias = c.qkvBias;
  MOE_ASSIGN(c.intermediateSize, f.positive("intermediate_size"));
  c.moeIntermediateSize = c.intermediateSize;
  c.moeLayers.assign(c.numLayers, true);
  return parseExperts(f, c, "num_local_experts");
}

Error parseGptOss(const Fields &f, ModelConfig &c) {
  c.unsupportedFeature = "attention sinks and clamped SwiGLU experts (gpt_oss)";
  c.qkvBias = c.oBias = true;
  MOE_ASSIGN(c.intermediateSize, f.positive("intermediate_size"));
  c.moeIntermediateSize = c.intermediateSize;
  c.moeLayers.assign(c.numLayers, true);
  return parseExperts(f, c, "num_local_experts");
}

Error parseGranite(const Fields &f, ModelConfig &c) {
  c.unsupportedFeature = "fused expert tensors and embedding/residual/logit "
                         "multipliers (granitemoe)";
  MOE_ASSIGN(c.intermediateSize, f.positive("intermediate_size"));
  c.moeIntermediateSize = c.intermediateSize;
  c.moeLayers.assign(c.numLayers, true);
  return parseExperts(f, c, "num_local_experts");
}

/// DBRX nests its sizes in attn_config and ffn_config.
Error parseDbrx(const Fields &f, ModelConfig &c) {
  c.unsupportedFeature = "fused Wqkv and fused expert tensors (dbrx)";
  c.norm = NormKind::LayerNorm;
  MOE_ASSIGN(c.vocabSize, f.positive("vocab_size"));
  MOE_ASSIGN(c.hiddenSize, f.positive("d_model"));
  MOE_ASSIGN(c.numLayers, f.positive("n_layers"));
  if (c.numLayers > kMaxLayers) // before anything is sized by it
    return f.fail("n_layers", formatv("expected a value <= {0} (moec's limit) but got {1}",
                                       kMaxLayers, c.numLayers));
  MOE_ASSIGN(c.numHeads, f.positive("n_heads"));
  MOE_ASSIGN(c.maxPositionEmbeddings, f.positiveOr("max_seq_len", 2048));
  MOE_ASSIGN(c.tieWordEmbeddings, f.boolean("tie_word_embeddings", false));
  MOE_ASSIGN(c.dtype, f.string("torch_dtype", "float32"));
  if (c.hiddenSize % c.numHeads != 0)
    return f.fail("d_model", formatv("expected a multiple of n_heads ({0}) but "
                                     "got {1}", c.numHeads, c.hiddenSize));
  c.headDim = c.hiddenSize / c.numHeads;
  std::optional<Fields> attn, ffn;
  MOE_ASSIGN(attn, f.nested("attn_config"));
  MOE_ASSIGN(ffn, f.nested("ffn_config"));
  if (!attn)
    return f.fail("attn_config", "missing (required)");
  if (!ffn)
    return f.fail("ffn_config", "missing (required)");
  MOE_ASSIGN(c.numKVHeads, attn->positiveOr("kv_n_heads", c.numHeads));
  MOE_ASSIGN(c.ropeTheta, attn->positiveNumber("rope_theta", 10000.0));
  MOE_ASSIGN(c.intermediateSize, ffn->positive("ffn_hidden_size"));
  c.moeIntermediateSize = c.intermediateSize;
  MOE_ASSIGN(c.numExperts, ffn->positive("moe_num_experts"));
  MOE_ASSIGN(c.expertsPerToken, ffn->positive("moe_top_k"));
  if (c.expertsPerToken > c.numExperts)
    return ffn->fail("moe_top_k", formatv("expected at most {0} (moe_num_experts) "
                                          "but got {1}",
                                          c.numExperts, c.expertsPerToken));
  c.moeLayers.assign(c.numLayers, true);
  return Error::success();
}

/// Switch Transformers is an encoder-decoder; numLayers counts the encoder.
Error parseSwitch(const Fields &f, ModelConfig &c) {
  c.unsupportedFeature = "encoder-decoder models (switch_transformers)";
  MOE_ASSIGN(c.vocabSize, f.positive("vocab_size"));
  MOE_ASSIGN(c.hiddenSize, f.positive("d_model"));
  MOE_ASSIGN(c.numLayers, f.positive("num_layers"));
  if (c.numLayers > kMaxLayers) // before anything is sized by it
    return f.fail("num_layers", formatv("expected a value <= {0} (moec's limit) but got {1}",
                                       kMaxLayers, c.numLayers));
  MOE_ASSIGN(c.numHeads, f.positive("num_heads"));
  c.numKVHeads = c.numHeads;
  MOE_ASSIGN(c.headDim, f.positive("d_kv"));
  MOE_ASSIGN(c.intermediateSize, f.positive("d_ff"));
  c.moeIntermediateSize = c.intermediateSize;
  MOE_ASSIGN(c.numExperts, f.positive("num_experts"));
  c.expertsPerToken = 1;
  MOE_ASSIGN(c.tieWordEmbeddings, f.boolean("tie_word_embeddings", true));
  MOE_ASSIGN(c.dtype, f.string("torch_dtype", "float32"));
  c.moeLayers.assign(c.numLayers, false);
  return Error::success();
}

} // namespace

namespace {

/// moec's limits on sizes from config.json (docs/conformance.md): far above
/// every published model (DeepSeek-V3: 61 layers, 256 experts, hidden 7168,
/// vocab 129280), and low enough that every count and byte size computed
/// from them fits in 64 bits (experts x layers x 3 x width x hidden < 2^61)
/// and that listing a checkpoint's tensors stays cheap.
Error checkLimits(const Fields &f, const ModelConfig &c) {
  StringRef type = c.modelType;
  StringRef expertsField = type.starts_with("deepseek")       ? "n_routed_experts"
                           : type == "qwen2_moe" || type == "olmoe" ||
                                   type == "switch_transformers"
                               ? "num_experts"
                           : type == "dbrx" ? "ffn_config.moe_num_experts"
                                            : "num_local_experts";
  struct Limit {
    int64_t value;
    StringRef field;
    int64_t max;
  };
  const Limit limits[] = {
      {c.numExperts, expertsField, 4096},
      {c.expertsPerToken, "num_experts_per_tok", 4096},
      {c.hiddenSize, "hidden_size", 1 << 17},
      {c.vocabSize, "vocab_size", 1 << 23},
      {c.numHeads, "num_attention_heads", 4096},
      {c.numKVHeads, "num_key_value_heads", 4096},
      {c.headDim, "head_dim", 1 << 13},
      {c.intermediateSize, "intermediate_size", 1 << 19},
      {c.moeIntermediateSize, "moe_intermediate_size", 1 << 19},
      {c.sharedExpertIntermediateSize, "shared_expert_intermediate_size", 1 << 20},
      {c.maxPositionEmbeddings, "max_position_embeddings", 1 << 27},
      {c.qLoraRank, "q_lora_rank", 1 << 16},
      {c.kvLoraRank, "kv_lora_rank", 1 << 16},
      {c.qkNopeHeadDim, "qk_nope_head_dim", 1 << 13},
      {c.qkRopeHeadDim, "qk_rope_head_dim", 1 << 13},
      {c.vHeadDim, "v_head_dim", 1 << 13},
      {c.numMTPLayers, "num_nextn_predict_layers", 64},
      {c.numGroups, "n_group", 4096},
  };
  for (const Limit &l : limits)
    if (l.value > l.max)
      return f.fail(l.field, formatv("expected a value <= {0} (moec's limit) but got {1}",
                                     l.max, l.value));
  return Error::success();
}

} // namespace

int64_t ModelConfig::numMoELayers() const {
  return llvm::count(moeLayers, true);
}

Expected<ModelConfig> moe::hf::parseModelConfig(StringRef text, StringRef path) {
  Expected<json::Object> object = moe::json_fields::parseObject(text, path);
  if (!object)
    return object.takeError();
  Fields f(*object, path);
  ModelConfig c;
  c.path = path.str();
  {
    llvm::raw_string_ostream os(c.text);
    os << json::Value(json::Object(*object));
  }
  if (!f.has("model_type"))
    return f.fail("model_type", "missing (required)");
  MOE_ASSIGN(c.modelType, f.string("model_type", ""));

  StringRef type = c.modelType;
  bool llamaLike = type == "mixtral" || type == "qwen2_moe" ||
                   type == "qwen3_moe" || type == "olmoe" || type == "llama" ||
                   type == "phimoe" || type == "gpt_oss" || type == "granitemoe";
  if (llamaLike)
    if (Error e = parseDecoderCommon(f, c))
      return std::move(e);

  Error e = Error::success();
  if (type == "mixtral")
    e = parseMixtral(f, c);
  else if (type == "qwen2_moe" || type == "qwen3_moe")
    e = parseQwenMoE(f, c, type == "qwen3_moe");
  else if (type == "olmoe")
    e = parseOlmoe(f, c);
  else if (type == "deepseek_v2" || type == "deepseek_v3")
    e = parseDeepSeek(f, c, type == "deepseek_v3");
  else if (type == "llama")
    e = parseLlama(f, c);
  else if (type == "phimoe")
    e = parsePhimoe(f, c);
  else if (type == "gpt_oss")
    e = parseGptOss(f, c);
  else if (type == "granitemoe")
    e = parseGranite(f, c);
  else if (type == "dbrx")
    e = parseDbrx(f, c);
  else if (type == "switch_transformers")
    e = parseSwitch(f, c);
  else
    return f.fail("model_type",
                  "unknown model_type '" + clip(c.modelType) +
                      "' (supported: mixtral, qwen2_moe, qwen3_moe, olmoe, "
                      "deepseek_v2, deepseek_v3, llama; parsed only: phimoe, "
                      "gpt_oss, granitemoe, dbrx, switch_transformers)");
  if (e)
    return std::move(e);
  if (c.isMoE() && c.moeIntermediateSize <= 0)
    return f.fail("moe_intermediate_size", "expected a value > 0");
  // DeepSeek's FP8 releases store the routing correction bias in float32
  // (their code's Gate keeps it f32 whatever the model dtype), not in
  // torch_dtype as transformers' save_pretrained would.
  if (c.fp8 && c.scoreCorrectionBias)
    c.correctionBiasF32 = true;
  if (Error e = checkLimits(f, c))
    return std::move(e);
  return c;
}

Expected<ModelConfig> moe::hf::loadModelConfig(StringRef path) {
  // A config.json is a few KiB; 16 MiB leaves room for anything real.
  Expected<std::unique_ptr<MemoryBuffer>> buffer =
      moe::json_fields::readInputFile(path, 16 << 20);
  if (!buffer)
    return buffer.takeError();
  return parseModelConfig((*buffer)->getBuffer(), path);
}

bool ModelConfig::Fp8Quantization::quantizes(StringRef weightName) const {
  StringRef module = weightName;
  if (!module.consume_back(".weight"))
    return false;
  StringRef last = module.rsplit('.').second.empty() ? module : module.rsplit('.').second;
  if (last == "lm_head")
    return false;
  return llvm::none_of(notConverted, [&](const std::string &entry) {
    return last == entry || module.contains(entry);
  });
}
