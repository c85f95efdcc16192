// The backward pass's steps (moe-differentiate; MoEGradientOps.td has their
// math, moert/cpu/Gradients.h their CPU kernels).
#include "Ops.h"
#include "moert/cpu/Gradients.h"

#include <algorithm>

namespace moert::ops {

void expectWeightGradient(const StepChecker &c, int64_t buffer, const PlanWeight &w) {
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < w.shape.size(); ++d)
    rows *= w.shape[d];
  const int64_t width = w.shape.back();
  c.expect(c.rows(buffer) == rows && c.width(buffer) == width,
           fmt::format("the gradient of '{}' is not {} rows of {} (f32)", w.name, rows, width));
}

namespace {

void parseVocab(const JsonFields &a, PlanStep &step) { step.loss.vocab = a.integer("vocab", 1); }

/// in: the logits, labels, the cross-entropy (and with vocab_shard the
/// parts' statistics [T, 4 tp]: the rank's part of the logits); out: their
/// gradient.
void checkCrossEntropyGrad(const StepChecker &c, const PlanStep &step) {
  c.expect(step.in.size() == (step.vocabShard ? 4u : 3u),
           step.vocabShard ? "vocab_shard: expected the logits part, labels, the cross-entropy "
                             "and the parts' statistics"
                           : "expected the logits, labels and the cross-entropy");
  c.arity(step.in.size(), 0, 0, 1);
  const int64_t width = c.tokens(step.in[0]);
  c.expect(c.tokens(step.in[1], DType::I32) == 1, "expected one label per row");
  c.expect(c.rows(step.in[2]) == 1 && c.width(step.in[2]) == 2,
           "expected the cross-entropy (1 row of 2) as input 2");
  c.expect(c.tokens(step.out[0]) == width, "expected the logits' width");
  if (!step.vocabShard) {
    c.expect(step.loss.vocab <= width, "vocab is wider than the logits");
    return;
  }
  c.expect(width * c.plan.degrees.tp == c.plan.paddedVocab,
           fmt::format("a part {} wide x tp {} is not the padded vocabulary ({})", width,
                       c.plan.degrees.tp, c.plan.paddedVocab));
  c.expect(c.tokens(step.in[3]) == 4 * c.plan.degrees.tp,
           fmt::format("expected the statistics of the {} parts (4 each)", c.plan.degrees.tp));
}

int64_t runCrossEntropyGrad(cpu::StepContext &c) {
  const int64_t T = c.rows, W = c.inWidth(0);
  if (!c.step->vocabShard) {
    cpu::crossEntropyGrad(c.in(0), T, W, c.step->loss.vocab, c.inInts(1), c.in(2), c.out(0));
    return T;
  }
  // The rank's columns [tp W, (tp + 1) W) of the padded vocabulary.
  const int64_t first = c.coords.tp * W,
                real = std::clamp<int64_t>(c.step->loss.vocab - first, 0, W);
  cpu::crossEntropyGradPart(c.in(0), T, W, real, first, c.step->loss.vocab, c.inInts(1), c.in(2),
                            c.in(3), c.inWidth(3) / 4, c.out(0));
  return T;
}

void checkLinearGrad(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 1, 1, 2);
  const PlanWeight &w = c.weight(0, 2);
  c.expect(c.tokens(step.in[0]) == w.shape[0] && c.tokens(step.in[1]) == w.shape[1] &&
               c.tokens(step.out[0]) == w.shape[1],
           "dy, x and dx do not fit the weight [out, in]");
  expectWeightGradient(c, step.out[1], w);
}

int64_t runLinearGrad(cpu::StepContext &c) {
  cpu::linearGrad(c.in(0), c.in(1), c.rows, cpu::Matrix::of(c.weight(0)), c.out(0), c.out(1));
  return c.rows;
}

/// in: dy, x (and with row_width the rows' [sum of squares, sum of dy w x]
/// over their whole rows: a part of rows tensor parallelism splits).
void checkRmsNormGrad(const StepChecker &c, const PlanStep &step) {
  c.arity(step.rowWidth > 0 ? 3 : 2, 1, 1, 2);
  const PlanWeight &w = c.weight(0, 1);
  const int64_t width = c.tokens(step.in[0]);
  c.expect(c.tokens(step.in[1]) == width && c.tokens(step.out[0]) == width &&
               width % w.shape[0] == 0,
           "dy, x and dx differ in width or the weight does not divide it");
  if (step.rowWidth > 0) {
    c.expect(c.tokens(step.in[2]) == 2, "input 2: expected the rows' statistics, [T, 2]");
    c.expect(w.shape[0] == width && step.rowWidth % width == 0,
             fmt::format("row_width {}: expected a multiple of the part's width {}, and the "
                         "weight of the part",
                         step.rowWidth, width));
  }
  expectWeightGradient(c, step.out[1], w);
}

void parseRmsNormGrad(const JsonFields &a, PlanStep &step) {
  if (a.has("row_width"))
    step.rowWidth = a.bounded("row_width", 1, int64_t(1) << 40);
}

int64_t runRmsNormGrad(cpu::StepContext &c) {
  if (c.step->rowWidth > 0)
    cpu::rmsNormGradOfStats(c.in(0), c.in(1), c.rows, c.inWidth(0), c.weight(0), c.in(2),
                            c.step->rowWidth, c.step->eps, c.out(0), c.out(1));
  else
    cpu::rmsNormGrad(c.in(0), c.in(1), c.rows, c.inWidth(0), c.weight(0), c.step->eps,
                     c.out(0), c.out(1));
  return c.rows;
}

/// rms_norm_grad_stats: in dy, x; weight w; out [T, 2].
void checkRmsNormGradStats(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 1, 1, 1);
  const int64_t width = c.tokens(step.in[0]);
  c.expect(c.tokens(step.in[1]) == width && c.weight(0, 1).shape[0] == width,
           "dy, x and the weight differ in width");
  c.expect(c.tokens(step.out[0]) == 2, "expected an output of [T, 2]");
}

int64_t runRmsNormGradStats(cpu::StepContext &c) {
  cpu::rmsNormGradStats(c.in(0), c.in(1), c.rows, c.inWidth(0), c.weight(0), c.out(0));
  return c.rows;
}

void checkRopeGrad(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 0, 0, 1);
  const int64_t w = c.tokens(step.in[0]);
  c.tokens(step.in[1], DType::I32);
  c.expect(step.headDim > 0 && w % step.headDim == 0 && step.rope.rotaryDim <= step.headDim,
           "head_dim does not divide the width or rotary_dim exceeds it");
  c.expect(c.tokens(step.out[0]) == w, "output width differs from the input's");
}

int64_t runRopeGrad(cpu::StepContext &c) {
  const PlanStep &s = *c.step;
  const int64_t T = c.rows, wd = c.inWidth(0);
  if (s.out[0] != s.in[0])
    std::copy_n(c.in(0), T * wd, c.out(0));
  c.rope(s.rope).applyTransposed(c.out(0), T, wd, s.headDim, c.inInts(1));
  return T;
}

void checkAttentionGrad(const StepChecker &c, const PlanStep &step) {
  c.arity(4, 0, 0, 3);
  const int64_t q = c.tokens(step.in[1]), k = c.tokens(step.in[2]), v = c.tokens(step.in[3]);
  c.expect(step.heads > 0 && step.kvHeads > 0 && step.heads % step.kvHeads == 0 &&
               q % step.heads == 0 && k % step.kvHeads == 0 && v % step.kvHeads == 0 &&
               q / step.heads == k / step.kvHeads,
           "query, key and value are not whole heads of one head dim");
  c.expect(c.tokens(step.in[0]) == step.heads * (v / step.kvHeads),
           "dO is not heads x value dim wide");
  c.expect(c.tokens(step.out[0]) == q && c.tokens(step.out[1]) == k &&
               c.tokens(step.out[2]) == v,
           "the gradients are not as wide as query, key and value");
}

int64_t runAttentionGrad(cpu::StepContext &c) {
  const PlanStep &s = *c.step;
  const int64_t q = c.inWidth(1), v = c.inWidth(3);
  cpu::attentionGrad(c.in(0), c.in(1), c.in(2), c.in(3), *c.layout, s.heads, s.kvHeads,
                     q / s.heads, v / s.kvHeads, s.scale, s.slidingWindow, c.out(0), c.out(1),
                     c.out(2));
  return c.rows;
}

void checkMlpGrad(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 3, 3, 4);
  const int64_t h = c.tokens(step.in[0]);
  const PlanWeight &g = c.weight(0, 2), &u = c.weight(1, 2), &d = c.weight(2, 2);
  c.expect(g.shape == u.shape && g.shape[1] == h && d.shape[0] == h && d.shape[1] == g.shape[0] &&
               c.tokens(step.in[1]) == h && c.tokens(step.out[0]) == h,
           "gate/up/down shapes do not form an MLP of the input width");
  expectWeightGradient(c, step.out[1], g);
  expectWeightGradient(c, step.out[2], u);
  expectWeightGradient(c, step.out[3], d);
}

int64_t runMlpGrad(cpu::StepContext &c) {
  cpu::mlpGrad(c.in(0), c.in(1), c.rows, cpu::Matrix::of(c.weight(0)),
               cpu::Matrix::of(c.weight(1)), cpu::Matrix::of(c.weight(2)), c.step->activation,
               c.out(0), c.out(1), c.out(2), c.out(3));
  return c.rows;
}

void checkEmbeddingGrad(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 0, 0, 1);
  c.expect(c.tokens(step.in[1], DType::I32) == 1, "expected one id per row");
  c.expect(c.width(step.out[0]) == c.tokens(step.in[0]),
           "the table's gradient is not as wide as dy");
}

void parsePaddingIdx(const JsonFields &a, PlanStep &step) {
  if (a.has("padding_idx"))
    step.loss.paddingIdx = a.integer("padding_idx", 0);
}

int64_t runEmbeddingGrad(cpu::StepContext &c) {
  const int64_t out = c.step->out[0], rows = c.bufferRows(out), width = c.inWidth(0);
  int64_t pad = c.step->loss.paddingIdx;
  if (!c.step->vocabShard) {
    cpu::embeddingGrad(c.in(0), c.inInts(1), c.rows, width, rows, c.out(0));
  } else {
    // The rank's rows [tp * R, (tp + 1) * R) of the padded vocabulary: the
    // tokens whose ids it holds, in order.
    const int64_t first = c.coords.tp * rows;
    const int32_t *ids = c.inInts(1);
    int32_t *local = c.intScratch(c.rows);
    float *dy = c.scratch(cpu::StepContext::Scratch::Work, c.rows * width);
    int64_t n = 0;
    for (int64_t t = 0; t < c.rows; ++t)
      if (ids[t] >= first && ids[t] < first + rows) {
        local[n] = static_cast<int32_t>(ids[t] - first);
        std::copy_n(c.in(0) + t * width, width, dy + n * width);
        ++n;
      }
    cpu::embeddingGrad(dy, local, n, width, rows, c.out(0));
    pad = pad >= 0 ? pad - first : pad;
  }
  if (pad >= 0 && pad < rows)
    std::fill_n(c.out(0) + pad * width, width, 0.0f);
  return c.rows;
}

/// in: dw [T, k], the logits [T, E], the experts [T, k]; out: dlogits.
void checkRouteGrad(const StepChecker &c, const PlanStep &step) {
  c.arity(3, 0, 0, 1);
  const int64_t k = c.tokens(step.in[0]), e = c.tokens(step.in[1]);
  c.expect(k == step.routing.topK && c.tokens(step.in[2], DType::I32) == k && k <= e,
           "dw and the experts are not top_k wide");
  c.expect(c.tokens(step.out[0]) == e, "dlogits is not as wide as the logits");
}

int64_t runRouteGrad(cpu::StepContext &c) {
  cpu::routeGrad(c.in(0), c.in(1), c.inInts(2), c.rows, c.inWidth(1), c.step->routing,
                 c.out(0));
  return c.rows;
}

/// in: dy, x, the routing weights, the experts; weights: the three stacks;
/// out: dx, dweights and the stacks' gradients.
void checkExpertsGrad(const StepChecker &c, const PlanStep &step) {
  c.expect(step.in.size() == 4 || step.in.size() == 7,
           "expected dy, x, the routing weights and experts, and none or three saved "
           "activations (gate, up, output) in");
  c.arity(step.in.size(), 3, 3, 5);
  const int64_t h = c.tokens(step.in[0]), k = c.tokens(step.in[2]);
  const PlanWeight &g = c.weight(0, 3), &u = c.weight(1, 3), &d = c.weight(2, 3);
  c.expect(c.tokens(step.in[1]) == h && c.tokens(step.in[3], DType::I32) == k &&
               g.shape == u.shape && g.shape[2] == h && d.shape[0] == g.shape[0] &&
               d.shape[1] == h && d.shape[2] == g.shape[1] && k <= g.experts,
           "dy, x, the routing and the stacks do not form the experts of the input width");
  c.expect(c.tokens(step.out[0]) == h && c.tokens(step.out[1]) == k,
           "dx or dweights differ in width from x or the weights");
  expectWeightGradient(c, step.out[2], g);
  expectWeightGradient(c, step.out[3], u);
  expectWeightGradient(c, step.out[4], d);
  if (step.in.size() == 7)
    checkSavedActivations(c, step.in[4], step.in[5], step.in[6], k, g.shape[1], h);
}

int64_t runExpertsGrad(cpu::StepContext &c) {
  const bool saved = c.step->in.size() == 7;
  cpu::expertsGrad(c.in(0), c.in(1), c.rows, c.inWidth(0), c.in(2), c.inInts(3), c.inWidth(2),
                   c.experts(0), c.experts(1), c.experts(2), c.step->activation, c.out(0),
                   c.out(1), c.out(2), c.out(3), c.out(4), saved ? c.in(4) : nullptr,
                   saved ? c.in(5) : nullptr, saved ? c.in(6) : nullptr,
                   c.step->dispatch.capacityFactor);
  return c.rows;
}

void parseCoefficients(const JsonFields &a, PlanStep &step) {
  step.loss.auxCoef = a.number("aux_coef");
  step.loss.zCoef = a.number("z_coef");
  if (!(step.loss.auxCoef >= 0) || !(step.loss.zCoef >= 0))
    a.fail("aux_coef", "expected coefficients >= 0");
  step.loss.sequences = a.has("sequences") ? a.integer("sequences", 1) : 0;
}

/// in: the layer's logits, then every layer's router statistics.
void checkRouterStatsGrad(const StepChecker &c, const PlanStep &step) {
  c.expect(step.in.size() >= 2 && step.weights.empty() && step.out.size() == 1,
           "expected the logits and the router statistics in, one output");
  const int64_t e = c.tokens(step.in[0]);
  for (size_t i = 1; i < step.in.size(); ++i)
    c.expect(c.rows(step.in[i]) == 3 + 2 * step.loss.sequences && c.width(step.in[i]) == e,
             fmt::format("input {}: expected router statistics of {} rows (3 + 2 per "
                         "sequence) of {}",
                         i, 3 + 2 * step.loss.sequences, e));
  c.expect(c.tokens(step.out[0]) == e, "dlogits is not as wide as the logits");
}

int64_t runRouterStatsGrad(cpu::StepContext &c) {
  const PlanStep &s = *c.step;
  std::vector<const float *> stats;
  for (size_t i = 1; i < s.in.size(); ++i)
    stats.push_back(c.in(i));
  cpu::routerStatsGrad(c.in(0), c.rows, c.inWidth(0), stats.data(),
                       static_cast<int64_t>(stats.size()), s.loss.auxCoef, s.loss.zCoef,
                       c.out(0), s.loss.sequences);
  return c.rows;
}

void checkBiasGrad(const StepChecker &c, const PlanStep &step) {
  c.arity(1, 0, 0, 1);
  c.expect(c.rows(step.out[0]) == 1 && c.width(step.out[0]) == c.tokens(step.in[0]),
           "expected an output of 1 row as wide as dy");
}

int64_t runBiasGrad(cpu::StepContext &c) {
  cpu::biasGrad(c.in(0), c.rows, c.inWidth(0), c.out(0));
  return c.rows;
}

/// in: dy, x, the gate [T, 1]; out: dx, dgate.
void checkSigmoidGateGrad(const StepChecker &c, const PlanStep &step) {
  c.arity(3, 0, 0, 2);
  const int64_t w = c.tokens(step.in[0]);
  c.expect(c.tokens(step.in[1]) == w && c.tokens(step.out[0]) == w &&
               c.tokens(step.in[2]) == 1 && c.tokens(step.out[1]) == 1,
           "expected dy, x and dx of one width and a [T, 1] gate and its gradient");
}

int64_t runSigmoidGateGrad(cpu::StepContext &c) {
  cpu::sigmoidGateGrad(c.in(0), c.in(1), c.in(2), c.rows, c.inWidth(0), c.out(0), c.out(1));
  return c.rows;
}

/// in: dO, query, kv, key_rope, positions; out: dquery, dkv, dkey_rope.
void checkMlaAttentionGrad(const StepChecker &c, const PlanStep &step) {
  c.arity(5, 0, 0, 3);
  const int64_t q = c.tokens(step.in[1]), kv = c.tokens(step.in[2]), r = c.tokens(step.in[3]);
  c.tokens(step.in[4], DType::I32);
  c.expect(step.heads > 0 && q % step.heads == 0 && kv % step.heads == 0,
           "widths are not whole heads");
  const int64_t nope = q / step.heads - r, vdim = kv / step.heads - nope;
  c.expect(r == step.rope.rotaryDim && nope > 0 && vdim > 0, "inconsistent MLA head dims");
  c.expect(c.tokens(step.in[0]) == step.heads * vdim && c.tokens(step.out[0]) == q &&
               c.tokens(step.out[1]) == kv && c.tokens(step.out[2]) == r,
           "dO or the gradients differ in width from the output and the operands");
}

int64_t runMlaAttentionGrad(cpu::StepContext &c) {
  const PlanStep &s = *c.step;
  const int64_t r = c.inWidth(3), nope = c.inWidth(1) / s.heads - r,
                vdim = c.inWidth(2) / s.heads - nope;
  cpu::mlaAttentionGrad(c.in(0), c.in(1), c.in(2), c.in(3), *c.layout, s.heads, nope, r, vdim,
                        s.scale, c.rope(s.rope), c.out(0), c.out(1), c.out(2));
  return c.rows;
}

} // namespace

const OpDef kMlaAttentionGrad = {"mla_attention_grad", Collective::None, 0, nullptr,
                                 checkMlaAttentionGrad, runMlaAttentionGrad};
const OpDef kBiasGrad = {"bias_grad", Collective::None, 0, nullptr, checkBiasGrad, runBiasGrad};
const OpDef kSigmoidGateGrad = {"sigmoid_gate_grad", Collective::None, 0, nullptr,
                                checkSigmoidGateGrad, runSigmoidGateGrad};
const OpDef kRouteGrad = {"route_grad", Collective::None, 0, nullptr, checkRouteGrad,
                          runRouteGrad};
const OpDef kExpertsGrad = {"experts_grad", Collective::None, OpDef::Backward,
                            parseExpertsCapacity, checkExpertsGrad, runExpertsGrad};
const OpDef kRouterStatsGrad = {"router_stats_grad", Collective::None, 0, parseCoefficients,
                                checkRouterStatsGrad, runRouterStatsGrad};
const OpDef kCrossEntropyGrad = {"cross_entropy_grad", Collective::None, OpDef::VocabShard,
                                 parseVocab,
                                 checkCrossEntropyGrad, runCrossEntropyGrad};
const OpDef kLinearGrad = {"linear_grad", Collective::None, OpDef::Backward, nullptr, checkLinearGrad,
                           runLinearGrad};
const OpDef kRmsNormGrad = {"rms_norm_grad", Collective::None, OpDef::Backward, parseRmsNormGrad,
                            checkRmsNormGrad,
                            runRmsNormGrad};
const OpDef kRmsNormGradStats = {"rms_norm_grad_stats", Collective::None, OpDef::Backward, nullptr,
                                 checkRmsNormGradStats, runRmsNormGradStats};
const OpDef kRopeGrad = {"rope_grad", Collective::None, 0, nullptr, checkRopeGrad, runRopeGrad};
const OpDef kAttentionGrad = {"attention_grad", Collective::None, 0, nullptr,
                              checkAttentionGrad, runAttentionGrad};
const OpDef kMlpGrad = {"mlp_grad", Collective::None, OpDef::Backward, nullptr, checkMlpGrad,
                        runMlpGrad};
const OpDef kEmbeddingGrad = {"embedding_grad", Collective::None, OpDef::VocabShard,
                              parsePaddingIdx,
                              checkEmbeddingGrad, runEmbeddingGrad};

} // namespace moert::ops
