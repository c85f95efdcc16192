// The plan as the runtime sees it: loaded from the JSON manifest written by
// `moec compile` (format documented in docs/plan-format.md) and validated in
// full before use: every id, width and shape is checked, so executing a plan
// that loaded cannot index out of bounds.
#pragma once

#include "moe/PlanSchema.h"
#include "moert/KernelTable.h"
#include "moert/Op.h"
#include "moert/PlanLayout.h"
#include "moert/Tensor.h"
#include "moert/cpu/Kernels.h"

#include <memory>
#include <string>
#include <vector>

namespace moert {

constexpr int kPlanFormatVersion = moe::plan::kFormatVersion;

struct PlanWeight {
  std::string name; ///< checkpoint name; with "{e}" for an expert stack
  std::vector<int64_t> shape;
  DType dtype = DType::F32;
  int64_t experts = 0; ///< > 0: a stack of `experts` per-expert tensors
  /// > 0 (moec compile --weight-format int8): quantised at load to
  /// symmetric int8, one f32 scale per `int8Block` columns of each row (the
  /// blocks start at multiples of it in the checkpoint tensor's columns).
  int64_t int8Block = 0;
  /// Bytes held: the dtype's, or the int8 values and their scales.
  int64_t bytes = 0;
  /// The checkpoint name of expert e's tensor.
  std::string expertName(int64_t e) const;
  /// The bytes `bytes` must say: numel x the dtype's size, or for int8
  /// weights one byte per element and an f32 scale per block.
  int64_t heldBytes() const;
  /// Shape of one checkpoint tensor (without the stack dimension).
  std::vector<int64_t> tensorShape() const;
};

struct PlanBuffer {
  /// rows x width values; rows is max_batch_tokens for per-token activations
  /// and static for others (a dispatch buffer has E x C rows of H).
  int64_t rows = 0;
  int64_t width = 0;
  DType dtype = DType::F32; ///< F32 or I32
  int64_t bytes = 0;
  /// Non-empty: a persistent buffer (zeros at first, kept between runs),
  /// shared by the rank's programs that declare this name (a train
  /// program's gradient sums, the optimizer's moments).
  std::string state;
  /// A ZeRO shard of a state (> 0): the logical state has this many rows of
  /// `width`, and data-parallel replica d holds its rows [d rows, (d + 1)
  /// rows) (those beyond the end are zeros).
  int64_t logicalRows = 0;
  /// The shard's group (shard_group): dp, or edp for an expert stack's state
  /// under expert or tensor parallelism (member d: the rank's edp coordinate).
  bool shardOverEdp = false;

  /// A pipeline stage's value kept from its forward program for its
  /// backward one (state "stash:<i>", one copy per micro-batch in flight):
  /// read by steps as the activation it is.
  bool kept() const { return state.rfind("stash:", 0) == 0; }
};

struct PlanCache {
  int64_t keyWidth = 0, valueWidth = 0, bytes = 0;
};

/// A collective's group: the ranks that agree with the caller on every axis
/// of `mesh` but `axis` (docs/partitioned-execution.md).
struct CollectiveGroup {
  enum class Mesh { Attention, Experts } mesh = Mesh::Attention; ///< "mesh" / "experts"
  enum class Axis { PP, DP, TP, EDP, EP, ETP } axis = Axis::TP;
};

/// moe.dispatch's attributes (defined beside the kernels that read them).
using DispatchParams = cpu::DispatchParams;

/// One step: an op over buffers and weights, with its attributes decoded.
/// The training steps' attributes (cross_entropy: vocab; router_stats:
/// top_k; lm_loss and router_stats_grad: the coefficients; embedding_grad:
/// padding_idx).
struct LossParams {
  int64_t vocab = 0, topK = 0;
  /// Per-sequence router statistics (DeepSeek-V3's sequence-wise loss): B,
  /// 0 for none (router_stats, lm_loss, router_stats_grad).
  int64_t sequences = 0;
  double auxCoef = 0, zCoef = 0;
  int64_t paddingIdx = -1; ///< embedding_grad: the row that gets no gradient (-1: none)
};

/// The optimizer's steps (lr_schedule, grad_norm, adamw: moe-append-optimizer).
struct OptimizerParams {
  bool cosine = false; ///< lr_schedule: cosine decay after the warmup (else constant)
  double lr = 0, minLr = 0, beta1 = 0, beta2 = 0, weightDecay = 0;
  double maxNorm = 0; ///< grad_norm: the clipping norm (0: none)
  int64_t warmupSteps = 0, decaySteps = 0;
  int64_t microBatches = 1; ///< grad_norm, adamw: the gradient sums are of this many
  /// grad_norm: reads the sum of squares (a value and its error, ZeRO-2)
  /// instead of the gradient sums.
  bool fromSquares = false;
  /// sum_squares over ZeRO-1's whole sums: each replica's rows only, of
  /// this many replicas (0: every row).
  int64_t replicas = 0;
  /// sum_squares' rows: of the rank's edp member (an expert stack's sums
  /// under EP or TP, shard_group "edp"), not its dp one.
  bool shardOverEdp = false;
  /// adamw: leaves the gradient sum as it is (the backward pass writes it
  /// whole before it is read again: moe-append-optimizer's direct sums).
  bool keepSum = false;
};

struct PlanStep {
  const OpDef *op = nullptr; ///< never null in a loaded plan
  std::vector<int64_t> in, weights, out;
  /// Per input: the step that last wrote it (-1: the program's token or
  /// position input), as moec computed it; checked against the steps.
  std::vector<int64_t> inFrom;
  double eps = 0, scale = 0;
  int64_t headDim = 0, heads = 0, kvHeads = 0, slidingWindow = 0, kvCache = -1;
  cpu::RopeParams rope;
  cpu::RoutingParams routing;
  cpu::Activation activation = cpu::Activation::Silu;
  std::vector<int64_t> widths; ///< split
  CollectiveGroup group;       ///< all_reduce, all_gather, all_to_all
  DispatchParams dispatch;     ///< dispatch
  bool vocabShard = false;     ///< embedding: this rank's rows of the padded vocabulary
  bool head = false;           ///< linear: the LM head (computes the logit rows only)
  bool layerNorm = false;      ///< add_norm: its norm is a layer_norm (else rms_norm)
  /// expert_ffn_grad with errors: adds its sources' gradients into the
  /// compensated sums it is given (a train program's gradient sums); else
  /// into zeros (a micro-batch's gradient and its error, ZeRO-2's).
  bool addIntoSums = false;
  /// reduce_scatter (ZeRO-2): its gradient comes with its error (in[1]).
  bool gradientError = false;
  /// A train program's forward step computed again in the backward pass
  /// (--recompute full): it binds the weights of the step it repeats and an
  /// attention writes that step's KV cache again.
  bool recompute = false;
  LossParams loss;             ///< cross_entropy, router_stats, lm_loss
  OptimizerParams optimizer;   ///< lr_schedule, grad_norm, adamw
  /// add of two static tensors (weight gradients): their elements (0: an
  /// add of the step's rows).
  int64_t elements = 0;
  /// all_gather of a weight (ZeRO): the rows of its state view each
  /// data-parallel replica updated.
  int64_t shardRows = 0;
  /// A send's or recv's other pipeline stage (its "stage" attribute; -1,
  /// absent: the next stage of a send, the one before of a recv; see
  /// moert::peerStage).
  int64_t peerStage = -1;
  /// rms_norm of a part of rows tensor parallelism splits: the whole row's
  /// width (its mean is the sum_squares input over it; 0: none).
  int64_t rowWidth = 0;
};

/// The stage a send (or recv) step of a program of `stage` sends to
/// (receives from).
inline int64_t peerStage(const PlanStep &step, int64_t stage) {
  if (step.peerStage >= 0)
    return step.peerStage;
  return stage + (step.op && step.op->collective == Collective::Send ? 1 : -1);
}

/// The program of one pipeline stage, run by every rank of the stage. Its
/// weights have the rank-local shapes; steps index them and its buffers.
struct PlanProgram {
  int64_t stage = 0;
  /// What the program computes (its exec.program's entry): "forward" (every
  /// step of generation), or an entry the plan's schedule names ("prefill",
  /// "decode"; "train" and "optimizer" of a training plan); absent means
  /// "forward".
  std::string entry = "forward";
  /// The most tokens of one of its steps: the plan's max_batch_tokens, or
  /// fewer for an entry compiled for smaller steps (decode).
  int64_t maxBatchTokens = 0;
  std::vector<PlanWeight> weights;
  std::vector<PlanBuffer> buffers;
  std::vector<PlanCache> caches;
  int64_t tokensBuffer = 0, positionsBuffer = 0;
  int64_t logitsBuffer = -1; ///< -1: not the last stage, or a train program
  /// A train program's labels (the next token of each row, -100: none) and,
  /// on the last stage, its loss [loss, ce, aux, z]; -1 otherwise.
  int64_t labelsBuffer = -1, lossBuffer = -1;
  /// A differentiated train program's gradients: the f32 buffer holding the
  /// gradient of each weight (moe-differentiate), in the weight's shape.
  struct Gradient {
    int64_t weight = 0, buffer = 0;
  };
  std::vector<Gradient> gradients;
  /// An optimizer program's input (the update's number, I32, from 1), its
  /// stats [lr, grad_norm, clip_coef, skipped] and the micro-batches of each
  /// update (the train steps between two runs of it); -1 / 0 otherwise.
  int64_t stepBuffer = -1, statsBuffer = -1, microBatches = 0;
  std::vector<PlanStep> steps;
  /// The program's CUDA kernel table (moec --target cuda, docs/cuda.md),
  /// read and checked with the plan; null for a CPU plan.
  std::shared_ptr<const KernelTable> cuda;
  /// The compiler's figures (program.memory): local weights, activation
  /// buffers, KV caches.
  int64_t weightBytes = 0, activationBytes = 0, cacheBytes = 0;
};

struct RankCoords {
  int64_t dp = 0, pp = 0, tp = 0, edp = 0, ep = 0, etp = 0;
};

struct PlanRank {
  int64_t rank = 0;
  RankCoords coords;
  int64_t program = 0;
  /// ranks[].memory.weights (exact bytes of its slices), and the program's
  /// weights + activations + kv_cache (what --report-memory compares with).
  int64_t predictedWeightBytes = 0, predictedPeakBytes = 0;
};

struct Degrees {
  int64_t dp = 1, pp = 1, tp = 1, ep = 1, etp = 1, edp = 1;
};

struct Plan {
  std::string path;
  /// Which slice of which checkpoint tensor each rank holds.
  std::shared_ptr<const PlanLayout> layout;
  std::string modelType;
  int64_t vocabSize = 0, maxPositionEmbeddings = 0;
  std::vector<int64_t> eosTokenIds;
  /// Checkpoint tensors under these prefixes are not part of the model
  /// (e.g. multi-token-prediction layers) and are skipped.
  std::vector<std::string> unusedTensorPrefixes;
  int64_t maxBatchTokens = 0, maxSeqLen = 0, maxSequences = 0;
  int64_t worldSize = 1;
  /// The ranks one process runs, each on its own thread (moec compile
  /// --tp-arithmetic): moert runs such a plan as `--in-process` does.
  int64_t ranksPerProcess = 1;
  /// moec compile --fp8-activations: every FP8 GEMM multiplies activations
  /// quantised per 1 x 128 (`fp8_activations: "dynamic"`; the CUDA device
  /// only), or unquantised ones (absent).
  bool fp8DynamicActivations = false;
  Degrees degrees;
  int64_t paddedVocab = 0; ///< vocab.padded (== vocabSize with tp = 1)
  /// The model's logical (checkpoint) tensors, whole shapes.
  std::vector<PlanWeight> weights;
  /// The first entry's programs, one per stage in order (a rank's
  /// "program"), then each other entry's, the same stages.
  std::vector<PlanProgram> programs;
  std::vector<PlanRank> ranks; ///< ranks[r].rank == r
  /// The schedule: the entry that runs prompt chunks and the one that runs
  /// generated tokens (both the first entry in a plan without a schedule).
  std::string prefillEntry, decodeEntry;
  /// A training plan (moec compile --train): one entry, "train", whose
  /// steps take micro-batch sequences of max_seq_len tokens with their
  /// labels and give the loss (moert train runs it, moert run does not).
  bool training = false;
  /// A training plan with an optimizer entry (moec compile --optimizer):
  /// its weights are written by the optimizer (the device owns them).
  bool optimizer = false;
  /// A pipelined training plan (pp > 1): each stage's forward programs
  /// (entry "train_forward") and backward ones ("train") run in this order
  /// per update, per stage (moe-schedule-pipeline; docs/training.md).
  struct PipelineStep {
    bool backward = false;
    bool fused = false; ///< its receives and the step before's sends are one exchange
    int64_t microBatch = 0;
  };
  std::vector<std::vector<PipelineStep>> pipelineSchedule;
  /// The most micro-batches stage `stage` holds between their forward and
  /// backward steps (the slots of its kept values, "stash:<i>" states).
  int64_t stashSlots(int64_t stage) const;

  const PlanProgram &programOf(int64_t rank) const { return programs[ranks[rank].program]; }
  /// The programs of `rank`'s stage, its own program first, one per entry.
  std::vector<const PlanProgram *> entriesOf(int64_t rank) const;
  /// The most tokens of a step of `entry`'s programs (every stage's).
  int64_t maxBatchTokensOf(const std::string &entry) const;
  /// The world ranks of `group` as seen from `rank`, ordered by their
  /// coordinate on the group's axis (the caller is among them).
  std::vector<int> groupOf(int64_t rank, const CollectiveGroup &group) const;
  /// The rank with the same dp and tp on stage `stage`.
  int64_t stageRank(int64_t rank, int64_t stage) const;

  /// Reads and validates `path`; InputError naming the plan and the field.
  static Plan load(const std::string &path);
};

class Checkpoint;
/// InputError naming the file and the tensor when the checkpoint holds a
/// tensor that is neither a weight of the plan nor under an unused prefix.
void checkNoUnexpectedTensors(const Plan &plan, const Checkpoint &checkpoint);

} // namespace moert
