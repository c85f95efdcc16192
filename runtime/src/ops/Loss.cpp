// The training loss: cross_entropy, router_stats and lm_loss (moec compile
// --train; MoETrainingOps.td has their math).
#include "Ops.h"

#include <algorithm>

namespace moert::ops {
namespace {

void parseCrossEntropy(const JsonFields &a, PlanStep &step) {
  step.loss.vocab = a.integer("vocab", 1);
}

void checkCrossEntropy(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 0, 0, 1);
  c.expect(step.loss.vocab <= c.tokens(step.in[0]) && step.loss.vocab <= c.plan.vocabSize,
           fmt::format("vocab {} is wider than the logits ({}) or the model's vocabulary ({})",
                       step.loss.vocab, c.tokens(step.in[0]), c.plan.vocabSize));
  c.expect(c.tokens(step.in[1], DType::I32) == 1, "expected one label per row");
  c.expect(c.rows(step.out[0]) == 1 && c.width(step.out[0]) == 2,
           "expected an output of 1 row of 2 (sum, rows)");
}

int64_t runCrossEntropy(cpu::StepContext &c) {
  cpu::crossEntropy(c.in(0), c.rows, c.inWidth(0), c.step->loss.vocab, c.inInts(1), c.out(0));
  return c.rows;
}

/// The rank's part of the padded vocabulary: its first column and how many
/// of its `width` columns are below vocab.
std::pair<int64_t, int64_t> vocabPart(const cpu::StepContext &c, int64_t width) {
  const int64_t first = c.coords.tp * width;
  return {first, std::clamp<int64_t>(c.step->loss.vocab - first, 0, width)};
}

/// in: the rank's logits part, labels; out: its statistics [T, 4].
void checkVocabStats(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 0, 0, 1);
  c.expect(step.vocabShard, "expected vocab_shard (the rank's part of the logits)");
  c.expect(c.tokens(step.in[0]) * c.plan.degrees.tp == c.plan.paddedVocab,
           fmt::format("a part {} wide x tp {} is not the padded vocabulary ({})",
                       c.tokens(step.in[0]), c.plan.degrees.tp, c.plan.paddedVocab));
  c.expect(step.loss.vocab == c.plan.vocabSize, "vocab differs from the model's vocabulary");
  c.expect(c.tokens(step.in[1], DType::I32) == 1, "expected one label per row");
  c.expect(c.tokens(step.out[0]) == 4, "expected 4 statistics per row");
}

int64_t runVocabStats(cpu::StepContext &c) {
  const auto [first, real] = vocabPart(c, c.inWidth(0));
  cpu::vocabStats(c.in(0), c.rows, c.inWidth(0), real, first, c.inInts(1), c.out(0));
  return c.rows;
}

/// in: the parts' statistics [T, 4 tp], labels; out: [sum, rows].
void checkCrossEntropyOfStats(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 0, 0, 1);
  c.expect(c.tokens(step.in[0]) == 4 * c.plan.degrees.tp,
           fmt::format("expected the statistics of the {} parts (4 each)", c.plan.degrees.tp));
  c.expect(step.loss.vocab == c.plan.vocabSize, "vocab differs from the model's vocabulary");
  c.expect(c.tokens(step.in[1], DType::I32) == 1, "expected one label per row");
  c.expect(c.rows(step.out[0]) == 1 && c.width(step.out[0]) == 2,
           "expected an output of 1 row of 2 (sum, rows)");
}

int64_t runCrossEntropyOfStats(cpu::StepContext &c) {
  cpu::crossEntropyOfStats(c.in(0), c.rows, c.inWidth(0) / 4, c.step->loss.vocab, c.inInts(1),
                           c.out(0));
  return c.rows;
}

void parseRouterStats(const JsonFields &a, PlanStep &step) {
  step.loss.topK = a.integer("top_k", 1);
  step.loss.sequences = a.has("sequences") ? a.integer("sequences", 1) : 0;
}

void checkRouterStats(const StepChecker &c, const PlanStep &step) {
  c.arity(1, 0, 0, 1);
  const int64_t experts = c.tokens(step.in[0]);
  c.expect(experts >= 2 && step.loss.topK <= experts,
           fmt::format("expected 2 or more experts and top_k <= {} but got top_k {}", experts,
                       step.loss.topK));
  const int64_t rows = 3 + 2 * step.loss.sequences;
  c.expect(c.rows(step.out[0]) == rows && c.width(step.out[0]) == experts &&
               (step.loss.sequences == 0 || experts >= 3),
           fmt::format("expected an output of {} rows of {} (the experts)", rows, experts));
}

int64_t runRouterStats(cpu::StepContext &c) {
  cpu::routerStats(c.in(0), c.rows, c.inWidth(0), c.step->loss.topK, c.out(0),
                   c.step->loss.sequences);
  return c.rows;
}

void parseLmLoss(const JsonFields &a, PlanStep &step) {
  for (auto [field, value] : {std::pair<const char *, double *>{"aux_coef", &step.loss.auxCoef},
                              {"z_coef", &step.loss.zCoef}}) {
    *value = a.number(field);
    if (!(*value >= 0))
      a.fail(field, fmt::format("expected a coefficient >= 0 but got {}", *value));
  }
  step.loss.sequences = a.has("sequences") ? a.integer("sequences", 1) : 0;
}

/// in: the cross-entropy, then one router statistics buffer per MoE layer.
void checkLmLoss(const StepChecker &c, const PlanStep &step) {
  c.expect(!step.in.empty() && step.weights.empty() && step.out.size() == 1,
           "expected the cross-entropy and router statistics in, one output");
  c.expect(c.rows(step.in[0]) == 1 && c.width(step.in[0]) == 2,
           "expected the cross-entropy (1 row of 2) as input 0");
  for (size_t i = 1; i < step.in.size(); ++i)
    c.expect(c.rows(step.in[i]) == 3 + 2 * step.loss.sequences &&
                 c.width(step.in[i]) == c.width(step.in[1]),
             fmt::format("input {}: expected router statistics of {} rows (3 + 2 per "
                         "sequence), as wide as input 1",
                         i, 3 + 2 * step.loss.sequences));
  c.expect(c.rows(step.out[0]) == 1 && c.width(step.out[0]) == 4,
           "expected an output of 1 row of 4 (loss, ce, aux, z)");
}

int64_t runLmLoss(cpu::StepContext &c) {
  const PlanStep &s = *c.step;
  std::vector<const float *> stats;
  for (size_t i = 1; i < s.in.size(); ++i)
    stats.push_back(c.in(i));
  const int64_t experts = stats.empty() ? 0 : c.inWidth(1);
  cpu::lmLoss(c.in(0), stats.data(), static_cast<int64_t>(stats.size()), experts,
              s.loss.auxCoef, s.loss.zCoef, c.out(0), s.loss.sequences);
  return c.rows;
}

} // namespace

const OpDef kCrossEntropy = {"cross_entropy", Collective::None, 0, parseCrossEntropy,
                             checkCrossEntropy, runCrossEntropy};
const OpDef kVocabStats = {"vocab_stats", Collective::None, OpDef::VocabShard,
                           parseCrossEntropy, checkVocabStats, runVocabStats};
const OpDef kCrossEntropyOfStats = {"cross_entropy_of_stats", Collective::None, 0,
                                    parseCrossEntropy, checkCrossEntropyOfStats,
                                    runCrossEntropyOfStats};
const OpDef kRouterStats = {"router_stats", Collective::None, 0, parseRouterStats,
                            checkRouterStats, runRouterStats};
const OpDef kLmLoss = {"lm_loss", Collective::None, 0, parseLmLoss, checkLmLoss, runLmLoss};

} // namespace moert::ops
