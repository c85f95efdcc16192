//===- CostModel.h - per-rank memory and step time --------------*- C++ -*-===//
//
// The sharding planner's model of one deployment: a layout (parallel degrees
// and pipeline stages) of a model on a cluster, and what each rank needs
// (memory) and spends (time) for one step of the workload.
//
// Parallel folding (Megatron-Core): attention, dense MLPs, shared experts,
// embedding and LM head use DP x PP x TP = world; routed experts use
// EDP x PP x EP x ETP = world over the same ranks (EDP = DP x TP / (EP x ETP)).
//
// Rank order (pp outermost, so that both folds agree on a rank's stage;
// tp / etp innermost, so that TP groups stay inside a node):
//
//   attention fold: rank = (pp * DP + dp) * TP + tp
//   expert fold:    rank = ((pp * EDP + edp) * EP + ep) * ETP + etp
//
// i.e. the device meshes are @mesh(PP x DP x TP) and
// @experts(PP x EDP x EP x ETP) in row-major order.
//
// Workload semantics: figures are per DP rank. Every DP rank (one attention
// replica) runs a prefill step of `maxBatchTokens` tokens and holds the KV
// cache of `maxSequences` sequences of `maxSeqLen` tokens; a step of the
// whole world processes dp x maxBatchTokens tokens. The step modelled is the
// worst prefill step: a chunk of maxBatchTokens tokens at the end of a
// maxSeqLen prompt (or maxBatchTokens / maxSeqLen whole prompts when the
// chunk is longer). Layouts are compared by throughput (tokens per second of
// the whole world), since layouts with different DP run different batches.
//
// Time model (no overlap between categories; an optimistic roofline):
//   gemm         every linear layer: max(flops / peak, bytes / HBM bandwidth)
//   attention    softmax(QK^T)V over the context: the same roofline, KV read
//   memory_bound norms, RoPE, activations, residual adds, routing, gathers
//   all_to_all   MoE dispatch + combine: tokens x hidden x bytes x k(ep-1)/ep
//                each way; intra- and inter-node parts concurrently
//   all_reduce   TP / ETP collectives (ring: 2(n-1)/n x bytes / bw + latency;
//                all-gather and reduce-scatter (n-1)/n), logits gather
//   p2p          pipeline sends: (microbatches + pp - 2) x (bytes/bw + latency)
//   bubble       (pp - 1) x the slowest stage's microbatch time, i.e. a
//                fraction (pp-1)/(microbatches+pp-1) of the pipelined time
//
//===----------------------------------------------------------------------===//
#ifndef MOE_ANALYSIS_COSTMODEL_H
#define MOE_ANALYSIS_COSTMODEL_H

#include "moe/Analysis/Cluster.h"
#include "moe/Frontend/HF/ModelConfig.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moe::sharding {

//===----------------------------------------------------------------------===//
// Degrees, coordinates, layouts
//===----------------------------------------------------------------------===//

/// Parallel degrees. world = dp x pp x tp = edp x pp x ep x etp.
struct Degrees {
  int64_t dp = 1, pp = 1, tp = 1, ep = 1, etp = 1;
  int64_t world() const { return dp * pp * tp; }
  /// Expert data parallelism: replicas of the routed experts per stage.
  int64_t edp() const { return dp * tp / (ep * etp); }
  /// "dp=8 pp=1 tp=1 ep=8 etp=1"
  std::string str() const;
  bool operator==(const Degrees &o) const {
    return dp == o.dp && pp == o.pp && tp == o.tp && ep == o.ep && etp == o.etp;
  }
};

/// A rank's coordinates in both folds (see the rank order above).
struct RankCoords {
  int64_t dp = 0, pp = 0, tp = 0;   ///< attention fold
  int64_t edp = 0, ep = 0, etp = 0; ///< expert fold (same pp)
};
RankCoords rankCoords(const Degrees &d, int64_t rank);
/// The rank of attention-fold coordinates.
int64_t attentionRank(const Degrees &d, int64_t pp, int64_t dp, int64_t tp);
/// The rank of expert-fold coordinates.
int64_t expertRank(const Degrees &d, int64_t pp, int64_t edp, int64_t ep,
                   int64_t etp);

/// Vocabulary rows padded for TP: ceil(V / (padTo x tp)) x padTo x tp.
/// Llama-3.1 (128256) at tp=8: 128512 with padTo 64, 128256 with padTo 32.
int64_t paddedVocabSize(int64_t vocab, int64_t tp, int64_t padTo);

/// Everything that decides which rank owns what: degrees, stages, padding.
struct ShardingLayout {
  Degrees degrees;
  /// Pipeline stage s holds decoder layers [stageBegin[s], stageBegin[s+1]);
  /// size pp + 1, stageBegin[0] = 0, stageBegin[pp] = num layers. Stage 0
  /// also holds the embedding; the last stage the final norm and LM head
  /// (and, with tied embeddings and pp > 1, a copy of the embedding).
  std::vector<int64_t> stageBegin;
  int64_t vocabPadTo = 64;
  int64_t paddedVocab = 0; ///< paddedVocabSize(V, tp, vocabPadTo)

  int64_t stageOfLayer(int64_t layer) const;
  /// Rows of the embedding / LM head per TP rank (paddedVocab / tp).
  int64_t vocabRowsPerRank() const { return paddedVocab / degrees.tp; }
};

//===----------------------------------------------------------------------===//
// The model as the planner sees it
//===----------------------------------------------------------------------===//

/// How a checkpoint tensor is distributed.
enum class Split : uint8_t {
  Replicated, ///< whole on every TP rank of its stage (norms, routers,
              ///< q_a/kv_a)
  Column, ///< dim 0 in tp equal parts (q/k/v, q_b, kv_b, gate/up; their biases)
  Row,    ///< dim 1 in tp equal parts (o_proj, down_proj)
  Vocab,  ///< dim 0 in parts of paddedVocab/tp rows, clipped to the vocabulary
  Expert, ///< one routed expert: whole on EP rank e / (E/ep), dim etpDim split
          ///< by ETP
  FusedExperts, ///< every expert in dim 0 (gpt_oss, granitemoe): E/ep per EP
                ///< rank
};
llvm::StringRef splitName(Split s);

/// Where a tensor lives in the pipeline.
enum class Place : uint8_t { Layer, FirstStage, LastStage };

struct PlannedTensor {
  hf::TensorSpec spec; ///< name, shape, role, layer (as the checkpoint has it)
  Split split = Split::Replicated;
  Place place = Place::Layer;
  int64_t expert = -1; ///< Split::Expert: the expert index
  int etpDim = 0;      ///< Split::Expert: the dimension ETP splits
  /// Split::Expert: held whole by each rank of the expert's ETP group (FP8
  /// block scales: a block may span the ETP parts).
  bool wholeInEtpGroup = false;
  /// As the checkpoint stores it: weightDtype, or FP8 blocks, their f32
  /// scales, an f32 weight of a model of another dtype (no explicit dtype).
  DType dtype = DType::BF16;
  int64_t elementBytes = 2; ///< dtype's size
  /// The input embedding when the LM head is tied to it: also needed on the
  /// last stage (a non-primary copy when pp > 1).
  bool alsoOnLastStage = false;
};

/// A model's checkpoint tensors classified for sharding, with per-layer byte
/// sums so that the cost of a layout is O(layers), never O(tensors x ranks).
struct ModelInfo {
  hf::ModelConfig config;
  DType weightDtype = DType::BF16;     ///< checkpoint / GEMM dtype
  DType activationDtype = DType::BF16; ///< activations, KV cache, dispatch
  /// Some weights are stored as FP8 blocks (the config's quantization_config,
  /// no explicit dtype): each tensor counts its own bytes.
  bool fp8Blocks = false;
  /// The most elements of one FP8 tensor: whole on every TP rank, split
  /// by TP, one routed expert's (split by ETP). A GPU rank dequantises each
  /// for its GEMM (the CUDA device's scratch, CostModel's workspace).
  int64_t fp8Replicated = 0, fp8TpSplit = 0, fp8Expert = 0;
  std::vector<PlannedTensor> tensors;  ///< checkpoint order

  /// Per decoder layer: indices into `tensors` of its non-expert tensors and
  /// of each expert's tensors (fused expert tensors count as expert 0..E-1
  /// all at once and are listed in `fusedExperts`).
  std::vector<std::vector<int32_t>> layerTensors;
  std::vector<std::vector<std::vector<int32_t>>> expertTensors;
  std::vector<std::vector<int32_t>> fusedExperts;
  std::vector<int32_t> firstStageTensors, lastStageTensors;

  /// Bytes per layer by distribution class (exact).
  struct LayerBytes {
    int64_t replicated = 0; ///< on every TP rank
    int64_t tpSplit = 0;    ///< Column + Row: / tp
    int64_t experts = 0;    ///< all routed experts: / (ep x etp)
  };
  std::vector<LayerBytes> layerBytes;
  int64_t finalNormBytes = 0; ///< replicated, last stage
  /// Vocabulary-split tensors' bytes per vocabulary row (embedding; LM head
  /// with its bias); 0 for a tied head.
  int64_t embeddingBytesPerRow = 0, headBytesPerRow = 0;
  bool fusedExpertTensors = false;
  int64_t totalBytes = 0; ///< the whole checkpoint in weightDtype

  /// Classifies `config`'s checkpoint (hf::checkpointTensors with the block
  /// scales of FP8 weights; DeepSeek's MTP module is not placed).
  /// `weightDtype` defaults to config.json's torch_dtype, with the weights a
  /// quantization_config stores as FP8 blocks at one byte per element plus
  /// their f32 scales (DeepSeek-V3's published checkpoint); an explicit
  /// dtype counts every weight in it, without blocks.
  /// Fails for families the planner cannot shard yet (dbrx's fused Wqkv,
  /// switch_transformers' encoder-decoder).
  static llvm::Expected<ModelInfo>
  build(const hf::ModelConfig &config,
        std::optional<DType> weightDtype = std::nullopt);
  /// The same over `tensors` (a module's weights with the roles the
  /// importer recorded on them: moe::modelWeights) instead of the config's
  /// checkpoint layout; the config gives the model's sizes.
  static llvm::Expected<ModelInfo>
  build(const hf::ModelConfig &config, std::vector<hf::TensorSpec> tensors,
        std::optional<DType> weightDtype = std::nullopt);

  int64_t numLayers() const { return config.numLayers; }
  bool isMoE() const { return config.isMoE(); }
  /// config.json's spelling of the expert count / expert width / shared
  /// expert width, for messages ("num_local_experts", "n_routed_experts").
  std::string expertsField() const;
  std::string expertWidthField() const;
  std::string sharedWidthField() const;
};

//===----------------------------------------------------------------------===//
// Workload and options
//===----------------------------------------------------------------------===//

struct Workload {
  int64_t maxBatchTokens = 512; ///< tokens per step per DP rank
  int64_t maxSeqLen = 4096;     ///< context of a sequence (KV-cache rows)
  int64_t maxSequences = 8;     ///< KV-cache slots per DP rank
};
/// `--max-batch-tokens 0: expected a positive integer`, ...
llvm::Error validateWorkload(const Workload &w);

struct PlanOptions {
  int64_t vocabPadTo = 64; ///< --vocab-pad-to
  /// Fraction of device memory a rank may plan for (the rest: CUDA context,
  /// allocator fragmentation), as vLLM's gpu_memory_utilization.
  double memoryUtilization = 0.9;
  /// Pipeline microbatches per step; 0: pp (one per stage). 1 when pp = 1.
  int64_t microbatches = 0;
  /// MoE receive buffers: 0 sizes them for the dropless worst case (every
  /// token of the EP x ETP group sent to min(k, local experts) local
  /// experts); c > 0 sizes them c x the expected load (capacity factor).
  double capacityFactor = 0;
  /// MLA (DeepSeek) caches the compressed latent (kv_lora_rank + rope dims
  /// per token, not split by TP), as production engines do; false: the
  /// decompressed keys and values per head (what moert v1 stores).
  bool mlaLatentCache = true;
  int64_t gemmWorkspaceBytes = int64_t(32) << 20; ///< cuBLAS-style workspace
  int64_t commBytesPerPeer = int64_t(4) << 20;    ///< NCCL buffer per peer
  /// Dynamic FP8 activations (moe.fp8_activations): reject the layouts that
  /// cut an FP8 weight's input group (fp8GroupCut).
  bool wholeFp8Groups = false;
  /// moe-partition runs expert tensor parallelism only inside the TP group:
  /// reject the layouts whose etp does not divide tp (ETP across
  /// data-parallel replicas), which the cost model itself can estimate.
  bool etpWithinTp = false;
};
/// `--vocab-pad-to 0: expected a positive integer`, ...
llvm::Error validateOptions(const PlanOptions &o);

//===----------------------------------------------------------------------===//
// Estimates
//===----------------------------------------------------------------------===//

/// Bytes one rank needs.
struct MemoryEstimate {
  int64_t weights = 0; ///< exact checkpoint bytes of its slices
  int64_t kvCache = 0; ///< maxSequences x maxSeqLen of its layers (and heads)
  int64_t activations = 0; ///< live activations of one microbatch (+ logits)
  int64_t workspace = 0;   ///< MoE dispatch buffers, GEMM and comm workspace
  int64_t peak = 0;        ///< the sum
};

/// Seconds of one step (see the time model above).
struct TimeEstimate {
  double gemm = 0, attention = 0, memoryBound = 0, allToAll = 0, allReduce = 0,
         p2p = 0, bubble = 0, total = 0;
};

struct StageEstimate {
  int64_t firstLayer = 0, numLayers = 0;
  int64_t denseLayers = 0, moeLayers = 0;
  bool embedding = false, head = false;
  MemoryEstimate memory;   ///< of the stage's largest rank (tp = ep = etp = 0)
  TimeEstimate microbatch; ///< one microbatch through the stage (no p2p/bubble)
};

struct LayoutEstimate {
  ShardingLayout layout;
  int64_t microbatches = 1;
  int64_t microbatchTokens = 0; ///< tokens per microbatch per DP rank
  std::vector<StageEstimate> stages;
  MemoryEstimate memory; ///< the largest rank's (max peak over stages)
  TimeEstimate time; ///< the step: slowest stage x microbatches + p2p + bubble
  double tokensPerSecond = 0; ///< dp x maxBatchTokens / time.total
  int64_t memoryBudget = 0;   ///< memoryUtilization x device memory
  bool fits = false;
  std::string reason; ///< why it does not fit (empty when it fits)
  /// Whether each group's ranks span nodes (then it runs at inter-node bw).
  bool tpSpansNodes = false, epSpansNodes = false, etpSpansNodes = false,
       ppSpansNodes = false;
  /// Largest fraction of a rank's EP peers on other nodes.
  double epOffNodeFraction = 0;
};

/// Checks one complete set of degrees against the model and the world size;
/// the message names the offending option, e.g. `--tp 3: expected a divisor
/// of num_attention_heads (32) and num_key_value_heads (8)`.
llvm::Error validateDegrees(const ModelInfo &m, int64_t worldSize,
                            const Degrees &d);

/// Estimates `d` (validated first) on `cluster` (its worldSize must equal
/// d.world()): places the stages by balancing their time (subject to the
/// memory budget), then estimates every stage. `fits` is false, with a
/// reason, when the largest rank exceeds the budget.
llvm::Expected<LayoutEstimate>
estimateLayout(const ModelInfo &m, const Cluster &cluster, const Workload &w,
               const PlanOptions &o, const Degrees &d);

/// The memory of one rank of an estimated layout: its stage's figures with
/// the rank's exact weight bytes (only the vocabulary's last TP parts differ).
MemoryEstimate rankMemory(const ModelInfo &m, const LayoutEstimate &e,
                          int64_t rank);

llvm::json::Value toJSON(const Degrees &d);
llvm::json::Value toJSON(const MemoryEstimate &m);
llvm::json::Value toJSON(const TimeEstimate &t);
llvm::json::Value toJSON(const LayoutEstimate &e);

} // namespace moe::sharding

#endif // MOE_ANALYSIS_COSTMODEL_H
