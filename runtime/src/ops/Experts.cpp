// The feed-forward ops: mlp (dense), router (gate + routing), route (the
// routing of logits computed by a linear step before it), experts
// (routed experts on one rank), and the partitioned form of experts:
// dispatch (tokens into per-expert blocks of capacity C), expert_ffn (the
// local experts over the blocks) and combine (the weighted sum back), and
// their backward steps over the same blocks (combine_grad, expert_ffn_grad,
// dispatch_grad).
#include "Ops.h"
#include "moert/cpu/Gradients.h"

namespace moert::ops {

void parseExpertsCapacity(const JsonFields &a, PlanStep &step) {
  step.dispatch.capacityFactor = a.has("capacity_factor") ? a.number("capacity_factor") : 0.0;
  if (!(step.dispatch.capacityFactor >= 0))
    a.fail("capacity_factor", "expected a value >= 0 (0: dropless)");
}

void checkSavedActivations(const StepChecker &c, int64_t gate, int64_t up, int64_t output,
                           int64_t k, int64_t intermediate, int64_t hidden) {
  c.expect(c.tokens(gate) == k * intermediate && c.tokens(up) == k * intermediate &&
               c.tokens(output) == k * hidden,
           fmt::format("expected saved activations per token of {} (gate), {} (up) and {} "
                       "(output) floats: k = {} blocks of the intermediate {} and hidden {}",
                       k * intermediate, k * intermediate, k * hidden, k, intermediate, hidden));
}

namespace {

void checkMlp(const StepChecker &c, const PlanStep &step) {
  c.arity(1, 3, 3, 1);
  int64_t h = c.tokens(step.in[0]);
  const PlanWeight &g = c.weight(0, 2), &u = c.weight(1, 2), &d = c.weight(2, 2);
  c.expect(g.shape == u.shape && g.shape[1] == h && d.shape[0] == h && d.shape[1] == g.shape[0],
           "gate/up/down shapes do not form an MLP of the input width");
  c.expect(c.tokens(step.out[0]) == h, "output width differs from the input's");
}

int64_t runMlp(cpu::StepContext &c) {
  const int64_t T = c.rows;
  cpu::Matrix g = cpu::Matrix::of(c.weight(0)), u = cpu::Matrix::of(c.weight(1)),
              d = cpu::Matrix::of(c.weight(2));
  cpu::mlp(c.in(0), T, g, u, d, c.step->activation,
           c.scratch(cpu::StepContext::Scratch::Work, 2 * T * g.rows), c.out(0));
  return T;
}

/// The routing of `experts` logits into the step's two top_k-wide outputs,
/// with the correction bias weight `bias` if the step has it.
void checkRouting(const StepChecker &c, const PlanStep &step, int64_t experts, size_t bias) {
  const cpu::RoutingParams &r = step.routing;
  c.expect(r.topK <= experts, "top_k exceeds the number of experts");
  c.expect(c.tokens(step.out[0]) == r.topK && c.tokens(step.out[1], DType::I32) == r.topK,
           "outputs must be top_k wide");
  c.expect(experts % r.numGroups == 0, "num_groups does not divide the experts");
  c.expect(r.topkGroups * (experts / r.numGroups) >= r.topK,
           "kept groups hold fewer than top_k experts");
  if (step.weights.size() > bias)
    c.expect(c.weight(bias, 1).shape[0] == experts,
             "correction bias size differs from the experts");
}

void checkRouter(const StepChecker &c, const PlanStep &step) {
  c.arity(1, 1, 2, 2);
  const PlanWeight &g = c.weight(0, 2);
  c.expect(c.tokens(step.in[0]) == g.shape[1], "input width differs from the gate's columns");
  checkRouting(c, step, g.shape[0], 1);
}

int64_t runRouter(cpu::StepContext &c) {
  const int64_t T = c.rows;
  cpu::Matrix g = cpu::Matrix::of(c.weight(0));
  float *logits = c.scratch(cpu::StepContext::Scratch::Work, T * g.rows);
  cpu::linear(c.in(0), T, g, nullptr, logits);
  cpu::route(logits, T, g.rows, c.optionalWeight(1), c.step->routing, c.out(0), c.outInts(1));
  return T;
}

void checkRoute(const StepChecker &c, const PlanStep &step) {
  c.arity(1, 0, 1, 2);
  checkRouting(c, step, c.tokens(step.in[0]), 0);
}

int64_t runRoute(cpu::StepContext &c) {
  cpu::route(c.in(0), c.rows, c.inWidth(0), c.optionalWeight(0), c.step->routing, c.out(0),
             c.outInts(1));
  return c.rows;
}

/// Three expert stacks (gate, up, down) that form MLPs of width h.
void checkStacks(const StepChecker &c, int64_t h, const char *of) {
  const PlanWeight &g = c.weight(0, 3), &u = c.weight(1, 3), &d = c.weight(2, 3);
  c.expect(g.experts > 0 && u.experts == g.experts && d.experts == g.experts,
           "expected three expert stacks of the same size");
  c.expect(g.shape == u.shape && g.shape[2] == h && d.shape[1] == h && d.shape[2] == g.shape[1],
           fmt::format("expert stacks do not form MLPs of the {} width", of));
}

/// moe.experts' and moe.experts_saved's inputs, weights and output 0.
void checkExpertsShapes(const StepChecker &c, const PlanStep &step) {
  int64_t h = c.tokens(step.in[0]), k = c.tokens(step.in[1]);
  c.expect(c.tokens(step.in[2], DType::I32) == k, "weights and experts widths differ");
  checkStacks(c, h, "input");
  c.expect(k <= c.weight(0, 3).experts, "more selected experts than experts");
  c.expect(c.tokens(step.out[0]) == h, "output width differs from the input's");
}

void checkExperts(const StepChecker &c, const PlanStep &step) {
  c.arity(3, 3, 3, 1);
  checkExpertsShapes(c, step);
}

int64_t runExperts(cpu::StepContext &c) {
  // In a training plan (--recompute experts) the arithmetic of experts_saved,
  // so that recomputing gives the gradients of saving, bit for bit.
  static const cpu::ExpertsSaved kNothingKept;
  cpu::experts(c.in(0), c.rows, c.inWidth(0), c.in(1), c.inInts(2), c.inWidth(1), c.experts(0),
               c.experts(1), c.experts(2), c.step->activation, c.out(0),
               c.plan->training ? &kNothingKept : nullptr);
  return c.rows;
}

void checkExpertsSaved(const StepChecker &c, const PlanStep &step) {
  c.arity(3, 3, 3, 4);
  checkExpertsShapes(c, step);
  checkSavedActivations(c, step.out[1], step.out[2], step.out[3], c.tokens(step.in[1]),
                        c.weight(0, 3).shape[1], c.tokens(step.in[0]));
}

int64_t runExpertsSaved(cpu::StepContext &c) {
  const cpu::ExpertsSaved saved{c.out(1), c.out(2), c.out(3)};
  cpu::experts(c.in(0), c.rows, c.inWidth(0), c.in(1), c.inInts(2), c.inWidth(1), c.experts(0),
               c.experts(1), c.experts(2), c.step->activation, c.out(0), &saved,
               c.step->dispatch.capacityFactor);
  return c.rows;
}

void parseDispatch(const JsonFields &a, PlanStep &step) {
  cpu::DispatchParams &p = step.dispatch;
  p.numExperts = a.integer("num_experts", 1);
  p.capacity = a.integer("capacity", 1);
  p.capacityFactor = a.number("capacity_factor");
  if (!(p.capacityFactor >= 0))
    a.fail("capacity_factor", "expected a value >= 0 (0: dropless)");
  p.topK = a.integer("top_k", 1);
  p.rowParts = a.integer("row_parts", 1);
  p.rowPartStride = a.integer("row_part_stride", 1);
}

void checkDispatch(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 0, 0, 3);
  const cpu::DispatchParams &d = step.dispatch;
  int64_t H = c.tokens(step.in[0]), k = c.tokens(step.in[1], DType::I32);
  c.expect(d.topK == k, fmt::format("top_k {} differs from the experts' width {}", d.topK, k));
  c.expect(k <= d.numExperts, "top_k exceeds num_experts");
  int64_t cap = cpu::stepCapacity(d.capacityFactor, c.program.maxBatchTokens, k, d.numExperts,
                                  INT64_MAX);
  c.expect(d.capacity == cap,
           fmt::format("capacity {} is not c(max_batch_tokens) = {} (capacity_factor {})",
                       d.capacity, cap, d.capacityFactor));
  c.expect(c.width(step.out[0]) == H, "buffer width differs from the input's");
  c.expect(c.rows(step.out[0]) == d.numExperts * d.capacity,
           fmt::format("buffer {} has {} rows but num_experts x capacity is {}", step.out[0],
                       c.rows(step.out[0]), d.numExperts * d.capacity));
  c.expect(c.width(step.out[1], DType::I32) == d.numExperts && c.rows(step.out[1]) >= 1,
           "counts must be 1 row of num_experts");
  c.expect(c.tokens(step.out[2], DType::I32) == k, "slots must be top_k wide");
  c.expect((c.plan.degrees.tp - 1) / d.rowPartStride < d.rowParts,
           fmt::format("tp {} / row_part_stride {} exceeds the {} row parts",
                       c.plan.degrees.tp - 1, d.rowPartStride, d.rowParts));
}

int64_t runDispatch(cpu::StepContext &c) {
  const PlanStep &s = *c.step;
  cpu::dispatch(c.in(0), c.rows, c.inWidth(0), c.inInts(1), c.inWidth(1), s.dispatch,
                c.coords.tp / s.dispatch.rowPartStride, c.out(0), c.outInts(1), c.outInts(2));
  return c.rows;
}

void checkExpertFfn(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 3, 3, 1);
  int64_t H = c.width(step.in[0]), E = c.experts(step.in[0], step.in[1]);
  checkStacks(c, H, "buffer");
  const int64_t local = c.weight(0, 3).experts;
  c.expect(E % local == 0,
           fmt::format("{} local experts do not divide the {} experts of counts", local, E));
  c.expect(c.width(step.out[0]) == H && c.rows(step.out[0]) == c.rows(step.in[0]),
           "output buffer shape differs from the input's");
}

int64_t runExpertFfn(cpu::StepContext &c) {
  const std::vector<cpu::Matrix> &g = c.experts(0);
  const int64_t E = c.inWidth(1), El = static_cast<int64_t>(g.size());
  cpu::expertFfn(c.in(0), c.inInts(1), E / El, El, c.bufferRows(c.step->in[0]) / E, c.inWidth(0),
                 g, c.experts(1), c.experts(2), c.step->activation, c.out(0),
                 c.plan->training);
  return c.rows;
}

/// Slots that index `rows` rows of a buffer (which may come from another
/// rank): checked.
void checkSlots(cpu::StepContext &c, const int32_t *slots, int64_t count, int64_t k,
                int64_t rows, int64_t buffer) {
  for (int64_t p = 0; p < count; ++p)
    if (slots[p] >= rows)
      runtimeError("rank {}: step {} ({}): slot {} of token {} outside the {} rows of buffer {}",
                   c.rank, c.index, c.step->op->name, slots[p], p / k, rows, buffer);
}

void checkCombine(const StepChecker &c, const PlanStep &step) {
  c.arity(3, 0, 0, 1);
  int64_t H = c.width(step.in[0]), k = c.tokens(step.in[1], DType::I32);
  c.expect(c.tokens(step.in[2]) == k, "weights and slots widths differ");
  c.expect(c.tokens(step.out[0]) == H, "output width differs from the buffer's");
}

int64_t runCombine(cpu::StepContext &c) {
  const PlanStep &s = *c.step;
  const int64_t T = c.rows;
  // Slots index y's rows: checked, as y may come from another rank.
  const int64_t k = c.inWidth(1);
  checkSlots(c, c.inInts(1), T * k, k, c.bufferRows(s.in[0]), s.in[0]);
  // (A training plan adds them as moe.experts_saved does: in expert order.)
  cpu::combine(c.in(0), c.inWidth(0), c.inInts(1), c.in(2), T, k, c.out(0), c.plan->training);
  return T;
}

/// in: dy, the expert outputs' blocks, slots, routing weights; out: the
/// blocks' gradient, the routing weights'.
void checkCombineGrad(const StepChecker &c, const PlanStep &step) {
  c.arity(4, 0, 0, 2);
  const int64_t H = c.width(step.in[1]), k = c.tokens(step.in[2], DType::I32);
  c.expect(c.tokens(step.in[0]) == H, "dy's width differs from the blocks'");
  c.expect(c.tokens(step.in[3]) == k && c.tokens(step.out[1]) == k,
           "weights, their gradient and slots widths differ");
  c.expect(c.rows(step.out[0]) == c.rows(step.in[1]) && c.width(step.out[0]) == H,
           "the blocks' gradient differs in shape from the blocks");
}

int64_t runCombineGrad(cpu::StepContext &c) {
  const PlanStep &s = *c.step;
  const int64_t T = c.rows, k = c.inWidth(2);
  checkSlots(c, c.inInts(2), T * k, k, c.bufferRows(s.in[1]), s.in[1]);
  cpu::combineGrad(c.in(0), c.inWidth(0), c.in(1), c.inInts(2), c.in(3), T, k, c.out(0),
                   c.out(1));
  return T;
}

void parseExpertFfnGrad(const JsonFields &a, PlanStep &step) {
  step.addIntoSums = a.has("add") && a.boolean("add");
}

/// in: the outputs' gradient blocks, the blocks, counts; weights: the local
/// stacks; out: the blocks' gradient and the stacks'. Or, as compensated
/// sums: out also the three errors after the stacks' gradients, written (a
/// micro-batch's, for ZeRO-2's reduce_scatter) or, with `add`, added into
/// (the train program's gradient sums and their errors, in too after
/// counts, in place).
void checkExpertFfnGrad(const StepChecker &c, const PlanStep &step) {
  if (step.out.size() == 7) {
    c.arity(step.addIntoSums ? 9 : 3, 3, 3, 7);
    for (size_t i = 0; i < 6 && step.addIntoSums; ++i)
      c.expect(step.out[1 + i] == step.in[3 + i],
               "add: expected the gradient sums and their errors in place (outputs 1-6: inputs "
               "3-8)");
    for (size_t i = 0; i < 3; ++i)
      expectWeightGradient(c, step.out[4 + i], c.weight(i, 3));
  } else {
    c.expect(!step.addIntoSums, "add: expected the sums' errors as outputs 4-6");
    c.arity(3, 3, 3, 4);
  }
  const int64_t H = c.width(step.in[1]), E = c.experts(step.in[1], step.in[2]);
  checkStacks(c, H, "buffer");
  const int64_t local = c.weight(0, 3).experts;
  c.expect(E % local == 0,
           fmt::format("{} local experts do not divide the {} experts of counts", local, E));
  for (int64_t b : {step.in[0], step.out[0]})
    c.expect(c.width(b) == H && c.rows(b) == c.rows(step.in[1]),
             "the gradient blocks differ in shape from the blocks");
  for (size_t i = 0; i < 3; ++i)
    expectWeightGradient(c, step.out[i + 1], c.weight(i, 3));
}

int64_t runExpertFfnGrad(cpu::StepContext &c) {
  const std::vector<cpu::Matrix> &g = c.experts(0);
  const int64_t E = c.inWidth(2), El = static_cast<int64_t>(g.size());
  const bool sums = c.step->out.size() == 7;
  cpu::expertFfnGrad(c.in(0), c.in(1), c.inInts(2), E / El, El, c.bufferRows(c.step->in[1]) / E,
                     c.inWidth(1), g, c.experts(1), c.experts(2), c.step->activation, c.out(0),
                     c.out(1), c.out(2), c.out(3), sums ? c.out(4) : nullptr,
                     sums ? c.out(5) : nullptr, sums ? c.out(6) : nullptr,
                     c.step->addIntoSums);
  return c.rows;
}

/// in: the blocks' gradient, slots; out: dx.
void checkDispatchGrad(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 0, 0, 1);
  c.tokens(step.in[1], DType::I32);
  c.expect(c.tokens(step.out[0]) == c.width(step.in[0]), "dx's width differs from the blocks'");
}

int64_t runDispatchGrad(cpu::StepContext &c) {
  const PlanStep &s = *c.step;
  const int64_t T = c.rows, k = c.inWidth(1);
  checkSlots(c, c.inInts(1), T * k, k, c.bufferRows(s.in[0]), s.in[0]);
  cpu::dispatchGrad(c.in(0), c.inWidth(0), c.inInts(1), T, k, c.out(0));
  return T;
}

} // namespace

const OpDef kMlp = {"mlp", Collective::None, 0, nullptr, checkMlp, runMlp};
const OpDef kRouter = {"router", Collective::None, 0, nullptr, checkRouter, runRouter};
const OpDef kRoute = {"route", Collective::None, 0, nullptr, checkRoute, runRoute};
const OpDef kExperts = {"experts", Collective::None, OpDef::GroupedExpertGemm, nullptr,
                        checkExperts, runExperts};
const OpDef kExpertsSaved = {"experts_saved", Collective::None, 0, parseExpertsCapacity,
                             checkExpertsSaved, runExpertsSaved};
const OpDef kDispatch = {"dispatch", Collective::None,
                         OpDef::RunsEmpty | OpDef::FillsExpertBlocks, parseDispatch,
                         checkDispatch, runDispatch};
const OpDef kExpertFfn = {"expert_ffn", Collective::None,
                          OpDef::RunsEmpty | OpDef::ExpertBlockGemm, nullptr, checkExpertFfn,
                          runExpertFfn};
const OpDef kCombine = {"combine", Collective::None, 0, nullptr, checkCombine, runCombine};
const OpDef kCombineGrad = {"combine_grad", Collective::None, 0, nullptr, checkCombineGrad,
                            runCombineGrad};
const OpDef kExpertFfnGrad = {"expert_ffn_grad", Collective::None,
                              OpDef::RunsEmpty | OpDef::Backward, parseExpertFfnGrad,
                              checkExpertFfnGrad,
                              runExpertFfnGrad};
const OpDef kDispatchGrad = {"dispatch_grad", Collective::None, 0, nullptr, checkDispatchGrad,
                             runDispatchGrad};

} // namespace moert::ops
