// CPU kernels: the math of every `moe` dialect op, on f32 activations with
// weights in F32, BF16 or F16 (widened to f32 as they are read; accumulation
// in f32). Row-major everywhere; a linear weight is the checkpoint's
// [out, in]. Multi-threaded through moert::parallelFor. The exact math of
// each kernel is the description of the matching op in
// dialects/include/moe/Dialect/MoE/IR/MoEOps.td and the #moe.routing /
// #moe.rope attributes in MoEBase.td.
#pragma once

#include "moert/Tensor.h"

#include <cstdint>
#include <vector>

namespace moert::cpu {

/// A 2-D weight matrix [rows, cols] (rows = out features) of any float dtype
/// (or FP8 with block scales), with a row stride in elements (== cols unless
/// it is a slice).
struct Matrix {
  DType dtype = DType::F32;
  const void *data = nullptr;
  int64_t rows = 0, cols = 0, rowStride = 0;
  /// Stored [cols, rows]: element (r, c) at c * rowStride + r. Only linear()
  /// takes such a view (the backward's products with a weight's transpose,
  /// packed straight from the weight instead of a transposed copy).
  bool transposed = false;
  /// F8E4M3 and I8 weights: their block scales, origins relative to this
  /// view.
  BlockScales scales;
  static Matrix of(const TensorView &view); ///< a [rows, cols] view
  /// The [cols, rows] transpose of a row-major matrix, as a view.
  Matrix transpose() const;
  /// Rows [begin, begin + count) of this matrix.
  Matrix sliceRows(int64_t begin, int64_t count) const;
};

/// y[T, w.rows] = x[T, w.cols] * w^T (+ bias[w.rows]); `ldx`/`ldy` are the row
/// strides of x and y (0: dense). The GEMM everything else is built on.
void linear(const float *x, int64_t tokens, const Matrix &w, const TensorView *bias,
            float *y, int64_t ldx = 0, int64_t ldy = 0);

/// linear() for x stored transposed (element (t, k) at xT[k * ldx + t]; no
/// bias; y's row stride ldy): a weight gradient's a^T b without transposing
/// a, where the GEMM packs x^T directly (BF16 weights under bf16Products(),
/// more than 16 tokens): the bits of linear() on the transposed copy. False
/// (nothing computed) where that does not apply.
bool linearLeftTransposed(const float *xT, int64_t ldx, int64_t tokens, const Matrix &w, float *y,
                          int64_t ldy);

/// Row lookup: out[t] = table[tokens[t]] (ids already checked against rows).
void embedding(const Matrix &table, const int32_t *tokens, int64_t count, float *out);

/// RMSNorm in groups of weight.numel() along each row of width `width`:
/// g / sqrt(mean(g^2) + eps) * weight.
void rmsNorm(const float *x, int64_t tokens, int64_t width, const TensorView &weight,
             double eps, float *out);
/// rmsNorm of parts of rows that tensor parallelism splits: each row of
/// `width` values is normalised by its whole row's mean square,
/// squares[t] / rowWidth (the row's sum of squares), times weight (width).
void rmsNormOfSquares(const float *x, int64_t tokens, int64_t width, const TensorView &weight,
                      const float *squares, int64_t rowWidth, double eps, float *out);
/// Each row's sum of squares (accumulated in double), in f32: out[t].
void rowSumSquares(const float *x, int64_t tokens, int64_t width, float *out);
/// LayerNorm over each row (biased variance); bias may be null.
void layerNorm(const float *x, int64_t tokens, int64_t width, const TensorView &weight,
               const TensorView *bias, double eps, float *out);

/// Elementwise out = a + b over n values (out may alias a or b).
void add(const float *a, const float *b, int64_t n, float *out);
/// out[t, :] = x[t, :] * sigmoid(gate[t]).
void sigmoidGate(const float *x, const float *gate, int64_t tokens, int64_t width, float *out);

/// Rotary embedding parameters (#moe.rope) and their cos/sin tables.
struct RopeParams {
  enum class Kind { Default, Linear, Dynamic, Llama3, Yarn } kind = Kind::Default;
  double theta = 10000.0;
  int64_t rotaryDim = 0;
  bool interleaved = false;
  double factor = 1.0;
  int64_t originalMaxPosition = 0;
  double lowFreqFactor = 1.0, highFreqFactor = 4.0;
  double betaFast = 32.0, betaSlow = 1.0;
  bool truncate = true;          ///< yarn: correction range rounded to integers
  double attentionFactor = 1.0;  ///< cos and sin are multiplied by it
  bool operator==(const RopeParams &o) const {
    return kind == o.kind && theta == o.theta && rotaryDim == o.rotaryDim &&
           interleaved == o.interleaved && factor == o.factor &&
           originalMaxPosition == o.originalMaxPosition && lowFreqFactor == o.lowFreqFactor &&
           highFreqFactor == o.highFreqFactor && betaFast == o.betaFast && betaSlow == o.betaSlow &&
           truncate == o.truncate && attentionFactor == o.attentionFactor;
  }
};
/// Precomputed cos/sin for positions [0, maxPositions), as transformers
/// computes them (inv_freq in f32, the attention scaling of yarn folded in).
class RopeTable {
public:
  RopeTable(const RopeParams &params, int64_t maxPositions);
  /// Rotates, in place, the first rotaryDim values of every head (of width
  /// headDim) of each row of x [tokens, width].
  void apply(float *x, int64_t tokens, int64_t width, int64_t headDim,
             const int32_t *positions, int64_t ldx = 0) const;
  /// The transpose of apply (moe.rope_grad): each pair rotated back by its
  /// angle, with the same attention factor.
  void applyTransposed(float *x, int64_t tokens, int64_t width, int64_t headDim,
                       const int32_t *positions) const;
  const RopeParams &params() const { return p; }
  /// [maxPositions, rotaryDim / 2] cosines and sines (the CUDA device
  /// uploads them, so that GPU rotations equal these).
  const std::vector<float> &cosines() const { return cosTable; }
  const std::vector<float> &sines() const { return sinTable; }

private:
  RopeParams p;
  int64_t maxPositions;
  std::vector<float> cosTable, sinTable; // [maxPositions, rotaryDim / 2]
};

/// Where each token of a batch goes: its sequence (a KV-cache slot) and its
/// position in that sequence. Tokens of one sequence are contiguous and in
/// increasing position order.
struct TokenLayout {
  const int32_t *sequence = nullptr; ///< cache slot per token
  const int32_t *position = nullptr; ///< position per token
  int64_t tokens = 0;
};

/// A KV cache for one attention op: per slot, up to maxSeqLen rows of
/// key and value (f32).
/// Keys and values [slots, maxSeqLen, width] of one attention layer: in
/// memory the cache owns (allocate) or memory the caller gives it (bind:
/// the program's, RankProgram), zero-filled either way.
struct KVCache {
  int64_t slots = 0, maxSeqLen = 0, keyWidth = 0, valueWidth = 0;
  float *keyData = nullptr, *valueData = nullptr;
  std::vector<float> keys, values; ///< the storage of allocate() (empty when bound)
  KVCache() = default;
  KVCache(KVCache &&) = default;
  KVCache &operator=(KVCache &&) = default;
  /// A copy of an allocated cache owns a copy of its storage; of a bound
  /// one, shares the caller's memory.
  KVCache(const KVCache &other) { *this = other; }
  KVCache &operator=(const KVCache &other) {
    slots = other.slots, maxSeqLen = other.maxSeqLen;
    keyWidth = other.keyWidth, valueWidth = other.valueWidth;
    keys = other.keys, values = other.values;
    const bool owned = other.keyData == other.keys.data() && !other.keys.empty();
    keyData = owned ? keys.data() : other.keyData;
    valueData = owned ? values.data() : other.valueData;
    return *this;
  }
  void allocate(int64_t slots, int64_t maxSeqLen, int64_t keyWidth, int64_t valueWidth);
  void bind(float *keys, float *values, int64_t slots, int64_t maxSeqLen, int64_t keyWidth,
            int64_t valueWidth);
  float *key(int64_t slot, int64_t pos) { return keyData + (slot * maxSeqLen + pos) * keyWidth; }
  float *value(int64_t slot, int64_t pos) {
    return valueData + (slot * maxSeqLen + pos) * valueWidth;
  }
};

/// Causal GQA attention with a cache: writes k/v of the batch's tokens into
/// the cache at (sequence, position), then each token attends to positions
/// <= its own of its sequence (and > pos - slidingWindow when > 0).
/// q [T, heads*dq], k [T, kvHeads*dq], v [T, kvHeads*dv] -> out [T, heads*dv].
void attention(const float *q, const float *k, const float *v, const TokenLayout &layout,
               int64_t heads, int64_t kvHeads, int64_t dq, int64_t dv, double scale,
               int64_t slidingWindow, KVCache &cache, float *out);

/// DeepSeek MLA core (moe.mla_attention): q [T, H*(n+r)], kv [T, H*(n+v)],
/// keyRope [T, r]; rope (interleaved per the table) on q's rotary part and
/// keyRope; per head key = [kv_h[:n], rope(keyRope)], value = kv_h[n:].
/// The cache holds per-head keys (n+r) and values (v).
void mlaAttention(const float *q, const float *kv, const float *keyRope,
                  const TokenLayout &layout, int64_t heads, int64_t nope, int64_t rope,
                  int64_t vdim, double scale, const RopeTable &table, KVCache &cache,
                  float *out);

enum class Activation { Silu, Gelu, GeluTanh, Relu };

/// Gated MLP: down(act(x gate^T) * (x up^T)); `scratch` >= 2 * T * I floats.
void mlp(const float *x, int64_t tokens, const Matrix &gate, const Matrix &up,
         const Matrix &down, Activation act, float *scratch, float *out);

/// One group of rows for expertMlps: `count` rows of x (row stride = the
/// matrices' hidden width) through one expert's gate/up/down into y.
struct ExpertRows {
  const Matrix *gate, *up, *down;
  const float *x;
  float *y;
  int64_t count;
};

/// The groups' MLPs with cpu::experts' arithmetic in a training plan
/// (moe.experts_saved's: linear, the activation, linear, group by group).
void expertMlpsAsTraining(const std::vector<ExpertRows> &groups, Activation act);

/// Groups with at most this many rows each take expertMlps' few-row path.
constexpr int64_t kFewExpertRows = 16;

/// The gated MLPs of several experts, each over its own rows (cpu::mlp's
/// math). When every group has at most kFewExpertRows rows (decoding), all
/// groups share two parallel loops (gate + up + activation, then down), so
/// the threads split the weights of every expert at once; otherwise one
/// cpu::mlp per group. `scratch` holds expertMlpsScratch(groups) floats.
void expertMlps(const std::vector<ExpertRows> &groups, Activation act, float *scratch);
int64_t expertMlpsScratch(const std::vector<ExpertRows> &groups);

/// #moe.routing parameters.
struct RoutingParams {
  bool sigmoid = false;        ///< scoring: sigmoid instead of softmax
  int64_t topK = 1;
  bool topkOnLogits = false;
  bool normalize = false;
  double scalingFactor = 1.0;
  int64_t numGroups = 1, topkGroups = 1;
  bool groupScoreMax = false;  ///< group score = max instead of top-2 sum
  bool computeBf16 = false;    ///< logits and weights rounded to bf16
};

/// From router logits [T, E] (already computed by `linear`, f32) and an
/// optional correction bias [E], selects top-k experts per token:
/// weights [T, k], experts [T, k], in descending order of the selection key
/// (ties: lower expert index first).
void route(const float *logits, int64_t tokens, int64_t numExperts,
           const TensorView *correctionBias, const RoutingParams &params,
           float *weights, int32_t *experts);

/// Routed experts: out[t] = sum_j weights[t,j] * mlp_{experts[t,j]}(x[t]),
/// computed per expert over the tokens routed to it (gather, two GEMMs,
/// activation, weighted scatter-add), never token by token. gate/up/down
/// hold one Matrix per expert.
/// moe.experts_saved's saved activations: per token t and slot j, in row t's
/// block j, the gate and up products ([T, k*I] each) and the expert's output
/// before its routing weight ([T, k*H]).
struct ExpertsSaved {
  float *gate = nullptr, *up = nullptr, *output = nullptr;
};
/// The (token, slot) pairs p = t * k + j grouped by expert: order[start[e]
/// .. start[e + 1]) are expert e's, in p order. With capacityFactor > 0
/// each expert keeps only its first stepCapacity(cf, T, k, E, T) (the
/// position drop policy of moe.dispatch). `what` names the kernel in the
/// error for an expert outside [0, E).
struct ExpertAssignments {
  std::vector<int64_t> start, order;
};
ExpertAssignments assignmentsByExpert(const int32_t *experts, int64_t tokens, int64_t k,
                                      int64_t numExperts, double capacityFactor,
                                      const char *what);
/// With `saved`, also writes them (zero for a dropped assignment); a
/// `saved` of null pointers keeps none but computes as the saving path does
/// (a training plan's experts whose backward recomputes them: the same bits
/// as a plan that saves them). With
/// capacityFactor > 0, each expert takes only its first stepCapacity(cf, T,
/// k, E, T) assignments in (t, j) order (the position drop policy of
/// moe.dispatch: a dropped one contributes nothing).
void experts(const float *x, int64_t tokens, int64_t hidden, const float *weights,
             const int32_t *experts, int64_t k, const std::vector<Matrix> &gate,
             const std::vector<Matrix> &up, const std::vector<Matrix> &down,
             Activation act, float *out, const ExpertsSaved *saved = nullptr,
             double capacityFactor = 0);

/// Index of the largest value (lowest index on ties).
int64_t argmax(const float *x, int64_t n);

//===----------------------------------------------------------------------===//
// Capacity-limited dispatch (docs/partitioned-execution.md): dispatch,
// expert_ffn and combine of partitioned programs. Buffers are [E, C, H]:
// expert e's rows start at row e * C.
//===----------------------------------------------------------------------===//

/// moe.dispatch's attributes.
struct DispatchParams {
  int64_t numExperts = 0, capacity = 0, topK = 0; ///< E, static C, k
  double capacityFactor = 0;                      ///< 0: dropless
  /// This rank dispatches rows [T*p/P, T*(p+1)/P) of part p = tp / stride.
  int64_t rowParts = 1, rowPartStride = 1;
};

/// The capacity of a step of T tokens: min(T, ceil(cf * T * k / E)) (the
/// ceiling of the double product), T when cf == 0 (dropless); at most C.
int64_t stepCapacity(double cf, int64_t T, int64_t k, int64_t E, int64_t C);

/// x [T, H], experts [T, k] -> buf [E, C, H], counts [E], slots [T, k].
/// Keeps assignment (t, j) to e when fewer than stepCapacity(T) assignments
/// to e came before it in (t, j) order, over all T rows; rows of part `part`
/// (of params.rowParts) copy their kept assignments to buf[e, counts[e]++]
/// and get slots[t, j] = e * C + n; every other slot is -1. Rows of buf past
/// counts[e] are left as they were. RuntimeError for an expert id outside
/// [0, E).
void dispatch(const float *x, int64_t T, int64_t H, const int32_t *experts, int64_t k,
              const DispatchParams &params, int64_t part, float *buf, int32_t *counts,
              int32_t *slots);

/// moe.expert_ffn: buf read as [sources, El, C, H]; for each (q, l) the
/// first counts[q*El + l] rows go through expert l's gated MLP (gate/up/down:
/// El matrices) into the same rows of y [sources * El, C, H]. The math is
/// cpu::mlp's, as in cpu::experts. RuntimeError for a count outside [0, C].
/// `training`: with moe.experts_saved's arithmetic instead (a training
/// plan: each block as one rank's experts computes its rows).
void expertFfn(const float *buf, const int32_t *counts, int64_t sources, int64_t El, int64_t C,
               int64_t H, const std::vector<Matrix> &gate, const std::vector<Matrix> &up,
               const std::vector<Matrix> &down, Activation act, float *y, bool training = false);

/// moe.combine: out[t] = sum over j (in order) with slots[t, j] >= 0 of
/// weights[t, j] * y[slots[t, j]] (a row of y [E * C, H]: dispatch's slots
/// e * C + n are rows, so C is not needed); rows with no kept assignment are
/// 0. The caller checks the slots against y's E * C rows.
/// `expertOrder`: each token's outputs added in expert order instead (a
/// training plan: as cpu::experts adds them).
void combine(const float *y, int64_t H, const int32_t *slots, const float *weights, int64_t T,
             int64_t k, float *out, bool expertOrder = false);

// The training loss (moe.cross_entropy, moe.router_stats, moe.lm_loss in
// MoETrainingOps.td), accumulated in f64.

/// out = [sum over rows with labels[t] != -100 of lse(logits[t, :vocab]) -
/// logits[t, labels[t]], number of those rows]; logits [T, width], width >=
/// vocab. InputError for a label outside [0, vocab) other than -100.
void crossEntropy(const float *logits, int64_t tokens, int64_t width, int64_t vocab,
                  const int32_t *labels, float out[2]);

/// Megatron's vocabulary-parallel cross-entropy (moe.vocab_stats): per row
/// of a part's logits [T, width] (columns [first, first + width) of the
/// padded vocabulary, the first `real` of them below vocab) out[t] = [max,
/// sum of exp(x - max) (f64 as two f32), the label's logit if the part holds
/// it, else 0].
void vocabStats(const float *logits, int64_t tokens, int64_t width, int64_t real, int64_t first,
                const int32_t *labels, float *out);
/// One row's parts' statistics [4 parts] combined: the largest logit, the
/// sum of exp(x - peak) over the vocabulary (f64), the label's logit.
struct VocabTotals {
  float peak = 0;
  double sum = 0;
  float target = 0;
};
VocabTotals vocabTotals(const float *stats, int64_t parts);
/// moe.cross_entropy_of_stats: crossEntropy's [sum, rows] from the parts'
/// statistics [T, 4 parts]: lse = peak + log(sum).
void crossEntropyOfStats(const float *stats, int64_t tokens, int64_t parts, int64_t vocab,
                         const int32_t *labels, float out[2]);

/// out [3, E]: row 0 sum_t softmax(l_t), row 1 the tokens whose top-k (of
/// the softmax, ties to the lower index) holds e, row 2 [sum_t lse(l_t)^2,
/// T, 0, ...]; logits [T, E]. With sequences B > 0, out [3 + 2B, E]: row 2
/// column 2 is topK, then per sequence (T / B consecutive rows; InputError
/// if B does not divide T) the sums of s / sum(s), s = sigmoid(l_t), and
/// the counts of the top-k of s (moe.router_stats' `sequences`).
void routerStats(const float *logits, int64_t tokens, int64_t experts, int64_t topK,
                 float *out, int64_t sequences = 0);

/// out = [loss, ce, aux, z] from the cross-entropy [sum, n] and `layers`
/// router statistics [3 (+ 2 sequences), E] (moe.lm_loss; aux = 0 when
/// auxCoef is; with sequences > 0, DeepSeek-V3's sequence-wise loss).
void lmLoss(const float ce[2], const float *const *stats, int64_t layers, int64_t experts,
            double auxCoef, double zCoef, float out[4], int64_t sequences = 0);

/// The top-k of the sigmoid scores of each of the `sequences` equal runs of
/// logits [T, E] (ties to the lower index), counted per sequence and expert:
/// counts [sequences, E]. The V3 sequence-wise loss's f (routerStats,
/// routerStatsGrad).
std::vector<double> sequenceTopKCounts(const float *logits, int64_t tokens, int64_t experts,
                                       int64_t topK, int64_t sequences);

} // namespace moert::cpu
