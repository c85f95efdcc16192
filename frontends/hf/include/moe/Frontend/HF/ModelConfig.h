//===- ModelConfig.h - a Hugging Face config.json, validated ----*- C++ -*-===//
//
// The one place that knows the spelling of config.json fields and the
// checkpoint tensor names of each model family. Everything downstream (IR
// import, parameter counts, later the planner) reads this struct, never JSON.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_FRONTEND_HF_MODELCONFIG_H
#define MOE_FRONTEND_HF_MODELCONFIG_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moe::hf {

enum class RopeScalingKind { None, Linear, Dynamic, Llama3, Yarn, LongRope };

/// `rope_scaling` (transformers 4.x) or `rope_parameters` (5.x), as read.
struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::None;
  double factor = 1.0;
  int64_t originalMaxPosition = 0;
  double lowFreqFactor = 1.0, highFreqFactor = 4.0; // llama3
  double betaFast = 32.0, betaSlow = 1.0;           // yarn
  bool truncate = true;                             // yarn
  /// Absent (or 0, which transformers treats as absent) when not given.
  std::optional<double> mscale, mscaleAllDim, attentionFactor;
  /// The config has a rope_scaling / rope_parameters block at all (DeepSeek
  /// scales its softmax from it whatever the kind).
  bool present = false;
};

/// The factor transformers multiplies cos and sin by (its `attention_factor`):
/// YaRN's explicit `attention_factor`, else mscale(factor, mscale) /
/// mscale(factor, mscale_all_dim) when both are set, else mscale(factor, 1);
/// 1 for the other kinds.
double ropeAttentionFactor(const RopeScaling &s);
/// mscale(s, m) = 0.1 * m * ln(s) + 1, or 1 when s <= 1 (YaRN's get_mscale).
double yarnMscale(double scale, double m);

enum class NormKind { RMSNorm, LayerNorm };
/// Where q/k normalisation applies: nowhere, per head (Qwen3), or over the
/// whole projection (OLMoE).
enum class QKNorm { None, PerHead, Full };
enum class Scoring { Softmax, Sigmoid };
enum class GroupScoring { Top2Sum, Max };

/// A validated model description. Sizes are > 0 unless documented otherwise.
struct ModelConfig {
  std::string path;      ///< the config.json it came from (for messages)
  /// The config.json it was parsed from, as compact JSON: the importer keeps
  /// it on the module (`moe.config`), so that the passes that read the
  /// model's sizes need no file.
  std::string text;
  std::string modelType; ///< config.json `model_type`
  /// Non-empty when the family is parsed and counted but cannot be imported
  /// into IR yet: names the missing feature.
  std::string unsupportedFeature;

  // Sizes.
  int64_t vocabSize = 0, hiddenSize = 0, numLayers = 0;
  int64_t numHeads = 0, numKVHeads = 0, headDim = 0;
  int64_t intermediateSize = 0; ///< dense MLP width
  int64_t maxPositionEmbeddings = 0;

  // Attention details.
  bool qkvBias = false, oBias = false, mlpBias = false;
  QKNorm qkNorm = QKNorm::None;
  std::optional<int64_t> slidingWindow;
  // Multi-head latent attention (DeepSeek); kvLoraRank == 0 means plain MHA.
  int64_t qLoraRank = 0, kvLoraRank = 0;
  int64_t qkNopeHeadDim = 0, qkRopeHeadDim = 0, vHeadDim = 0;
  /// eps of q_a_layernorm / kv_a_layernorm: DeepSeek's code (and
  /// transformers' port) builds them with the RMSNorm default 1e-6 whatever
  /// `rms_norm_eps` says.
  double latentNormEps = 1e-6;
  /// MLA's RoPE pairs (2i, 2i+1) (DeepSeek-V2 always; V3's `rope_interleave`,
  /// default true) instead of (i, i + R/2).
  bool ropeInterleave = true;
  bool isMLA() const { return kvLoraRank > 0; }

  // Norms, RoPE.
  NormKind norm = NormKind::RMSNorm;
  double normEps = 1e-6;
  double ropeTheta = 10000.0;
  RopeScaling ropeScaling;

  // Mixture of experts. numExperts == 0: a dense model.
  int64_t numExperts = 0, expertsPerToken = 0;
  int64_t moeIntermediateSize = 0;
  int64_t numSharedExperts = 0;           ///< DeepSeek: fused into one MLP
  int64_t sharedExpertIntermediateSize = 0; ///< total width of the shared MLP
  bool sharedExpertGate = false;           ///< Qwen2-MoE's sigmoid gate
  Scoring scoring = Scoring::Softmax;
  bool normTopK = false;
  double routedScalingFactor = 1.0;
  int64_t numGroups = 1, topkGroups = 1;
  GroupScoring groupScoring = GroupScoring::Top2Sum;
  bool scoreCorrectionBias = false;
  bool routerInF32 = false; ///< DeepSeek computes router logits in fp32
  /// e_score_correction_bias imported as f32 whatever `dtype` (moec compile
  /// --param-dtype bf16 of an f32 checkpoint: the bias update needs f32)
  bool correctionBiasF32 = false;
  /// Per layer: true when its feed-forward is the routed-expert block.
  std::vector<bool> moeLayers;
  int64_t numMTPLayers = 0; ///< DeepSeek-V3 multi-token prediction modules

  /// quantization_config of an FP8 block-scaled checkpoint (DeepSeek-V3, the
  /// FP8 Qwen3 releases): every nn.Linear weight but the excluded ones is
  /// stored as float8_e4m3fn with a float32 `<weight>_scale_inv` of one
  /// value per block beside it (weight = q * scale_inv over its block).
  struct Fp8Quantization {
    int64_t blockRows = 128, blockCols = 128; ///< weight_block_size
    /// modules_to_not_convert, as transformers matches them: a module stays
    /// in `dtype` when an entry equals its name's last component or is a
    /// substring of its full name (lm_head is always excluded).
    std::vector<std::string> notConverted;
    /// Whether the nn.Linear of weight `name` ("<module>.weight") is stored
    /// in FP8.
    bool quantizes(llvm::StringRef weightName) const;
  };
  std::optional<Fp8Quantization> fp8;

  std::string hiddenAct = "silu"; ///< silu | gelu | gelu_pytorch_tanh | relu
  bool tieWordEmbeddings = false;
  std::string dtype = "bfloat16"; ///< `torch_dtype`: float32|bfloat16|float16
  std::vector<int64_t> eosTokenIds;
  std::optional<int64_t> bosTokenId;
  /// pad_token_id: transformers' nn.Embedding padding_idx (no gradient for
  /// that row); absent or null: none.
  std::optional<int64_t> padTokenId;

  int64_t numMoELayers() const;
  bool isMoE() const { return numExperts > 0; }
};

/// Parses and validates `path`. Errors name the file and the field, e.g.
/// `config.json: field 'hidden_size': expected an integer but got a string`.
llvm::Expected<ModelConfig> loadModelConfig(llvm::StringRef path);
/// The same from text already read (`path` only names it in messages).
llvm::Expected<ModelConfig> parseModelConfig(llvm::StringRef text,
                                             llvm::StringRef path);

/// What a parameter tensor is, for counting and (later) placement.
enum class TensorRole { Embedding, LMHead, RoutedExperts, Other };

/// One checkpoint tensor as published (or, for fused expert tensors, the one
/// tensor that holds every expert).
/// How tensor parallelism splits a tensor of the decoder layers (set by
/// checkpointTensors from the module it belongs to: the planner never reads
/// tensor names).
enum class TensorSplit {
  Replicated, ///< norms, routers, q_a / kv_a, gates, row-parallel biases
  Column,     ///< split by output rows: q/k/v, q_b / kv_b, gate / up, sinks
  Row,        ///< split by input columns: o_proj, down_proj
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  TensorRole role = TensorRole::Other;
  int64_t layer = -1; ///< decoder layer, -1 outside the layers
  /// RoutedExperts: the expert of a per-expert tensor, -1 for a fused one
  /// (every expert stacked along dimension 0).
  int64_t expert = -1;
  /// RoutedExperts: the dimension expert tensor parallelism splits (gate /
  /// up: 0, their output rows; down: 1, its input columns).
  int etpDim = 0;
  /// Other tensors of the decoder layers: how tensor parallelism splits them.
  TensorSplit tpSplit = TensorSplit::Replicated;
  /// An nn.Linear weight the checkpoint stores as float8_e4m3fn blocks
  /// (ModelConfig::fp8): the block's rows and columns; 0 otherwise.
  int64_t fp8BlockRows = 0, fp8BlockCols = 0;
  /// The `<weight>_scale_inv` of an FP8 weight (float32, one value per
  /// block): whole on every rank that holds a part of its weight.
  bool blockScales = false;
  /// Stored in float32 whatever the model's dtype (DeepSeek's FP8 releases'
  /// e_score_correction_bias: ModelConfig::correctionBiasF32).
  bool storedF32 = false;
  bool isFp8() const { return fp8BlockRows > 0; }
  int64_t numel() const;
};

/// The `<weight>_scale_inv` tensor of FP8 weight `weight`: [ceil(rows /
/// block rows), ceil(cols / block cols)], the weight's role, layer and expert.
TensorSpec blockScalesOf(const TensorSpec &weight);
/// `specs` with each FP8 weight followed by its block scales: the tensors an
/// FP8 checkpoint stores.
std::vector<TensorSpec> withBlockScales(std::vector<TensorSpec> specs);

/// Every tensor of the checkpoint in its order, per-expert tensors expanded.
/// MTP modules are listed separately by `mtpTensors`.
std::vector<TensorSpec> checkpointTensors(const ModelConfig &config);
std::vector<TensorSpec> mtpTensors(const ModelConfig &config);

struct ParamCounts {
  int64_t total = 0;  ///< every tensor of the checkpoint (tied: once)
  int64_t active = 0; ///< what one token touches: all but the unselected experts
  int64_t embedding = 0, lmHead = 0, routedExperts = 0, mtp = 0;
};
ParamCounts countParameters(const ModelConfig &config);

} // namespace moe::hf

#endif // MOE_FRONTEND_HF_MODELCONFIG_H
