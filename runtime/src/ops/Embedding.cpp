// embedding (a vocab-sharded table under tensor parallelism) and linear
// (a projection, or the LM head that computes only the logit rows).
#include "Ops.h"

#include <algorithm>

namespace moert::ops {
namespace {

void checkEmbedding(const StepChecker &c, const PlanStep &step) {
  c.arity(1, 1, 1, 1);
  c.expect(c.tokens(step.in[0], DType::I32) == 1, "the token ids buffer must be 1 wide");
  const PlanWeight &t = c.weight(0, 2);
  c.expect(c.tokens(step.out[0]) == t.shape[1], "output width differs from the table's");
  if (step.vocabShard)
    c.expect(t.shape[0] * c.plan.degrees.tp == c.plan.paddedVocab,
             fmt::format("a vocab_shard table of {} rows x tp {} is not the padded vocabulary "
                         "({})", t.shape[0], c.plan.degrees.tp, c.plan.paddedVocab));
  else
    c.expect(t.shape[0] == c.plan.vocabSize, "embedding rows differ from vocab_size");
}

int64_t runEmbedding(cpu::StepContext &c) {
  const int64_t T = c.rows;
  cpu::Matrix m = cpu::Matrix::of(c.weight(0));
  if (!c.step->vocabShard) {
    cpu::embedding(m, c.inInts(0), T, c.out(0));
    return T;
  }
  // This rank's rows [tp * R, (tp + 1) * R) of the padded vocabulary; other
  // ids give zero rows (the all_reduce over tp that follows adds the one
  // rank's row that holds them).
  const int64_t first = c.coords.tp * m.rows;
  const int32_t *ids = c.inInts(0);
  int32_t *localIds = c.intScratch(T);
  for (int64_t t = 0; t < T; ++t) {
    int64_t id = ids[t] - first;
    localIds[t] = id >= 0 && id < m.rows ? static_cast<int32_t>(id) : 0;
  }
  float *out = c.out(0);
  cpu::embedding(m, localIds, T, out);
  for (int64_t t = 0; t < T; ++t)
    if (ids[t] < first || ids[t] >= first + m.rows)
      std::fill_n(out + t * m.cols, m.cols, 0.0f);
  return T;
}

void checkLinear(const StepChecker &c, const PlanStep &step) {
  c.arity(1, 1, 2, 1);
  const PlanWeight &w = c.weight(0, 2);
  c.expect(c.tokens(step.in[0]) == w.shape[1],
           fmt::format("input width differs from '{}' columns", w.name));
  c.expect(c.tokens(step.out[0]) == w.shape[0],
           fmt::format("output width differs from '{}' rows", w.name));
  if (step.weights.size() == 2)
    c.expect(c.weight(1, 1).shape[0] == w.shape[0], "bias size differs from the output width");
}

/// The LM head: only the rows the caller wants (the last prompt token of
/// each sequence when no full logits are asked for), packed as rows 0..R-1
/// of the output; the steps after it run on R rows.
int64_t runHead(cpu::StepContext &c) {
  const int64_t T = c.rows;
  cpu::Matrix m = cpu::Matrix::of(c.weight(0));
  const std::vector<int64_t> &wanted = c.batch->logitRows;
  const int64_t R = static_cast<int64_t>(wanted.size());
  if (R > c.program->maxBatchTokens)
    runtimeError("{} logit rows exceed max_batch_tokens ({})", R, c.program->maxBatchTokens);
  float *rows = c.scratch(cpu::StepContext::Scratch::Rows, R * m.cols);
  const float *x = c.in(0);
  for (int64_t r = 0; r < R; ++r) {
    int64_t t = wanted[r];
    if (t < 0 || t >= T)
      runtimeError("logit row {} outside the batch of {} tokens", t, T);
    std::copy_n(x + t * m.cols, m.cols, rows + r * m.cols);
  }
  cpu::linear(rows, R, m, c.optionalWeight(1), c.out(0));
  return R;
}

int64_t runLinear(cpu::StepContext &c) {
  if (c.step->head)
    return runHead(c);
  cpu::linear(c.in(0), c.rows, cpu::Matrix::of(c.weight(0)), c.optionalWeight(1), c.out(0));
  return c.rows;
}

} // namespace

const OpDef kEmbedding = {"embedding", Collective::None,
                          OpDef::VocabShard | OpDef::TiedTable, nullptr, checkEmbedding,
                          runEmbedding};
const OpDef kLinear = {"linear", Collective::None, OpDef::Head, nullptr, checkLinear,
                       runLinear};

} // namespace moert::ops
