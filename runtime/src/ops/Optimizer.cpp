// The optimizer: the train program's accumulate and the optimizer program's
// lr_schedule, grad_norm and adamw (moe-append-optimizer; the kernels'
// math: moert/cpu/Optimizer.h).
#include "Ops.h"

#include "moert/cpu/Optimizer.h"

#include <algorithm>
#include <cmath>

namespace moert::ops {
namespace {

/// A weight's elements as one f32 state buffer: [elements / width, width]
/// (or a ZeRO shard of it: logical_rows of them).
bool stateOfWeight(const StepChecker &c, int64_t buffer, const PlanWeight &w) {
  int64_t elements = 1;
  for (int64_t d : w.shape)
    elements *= d;
  const PlanBuffer &b = c.program.buffers[buffer];
  return b.dtype == DType::F32 && b.width == w.shape.back() &&
         (b.logicalRows > 0 ? b.logicalRows : b.rows) * b.width == elements;
}

/// in: a gradient and its sum, with or without the sum's error (state
/// buffers: a compensated sum); out: the sum (and the error).
void checkAccumulate(const StepChecker &c, const PlanStep &step) {
  const bool compensated = step.in.size() == 3;
  c.arity(compensated ? 3 : 2, 0, 0, compensated ? 2 : 1);
  const PlanBuffer &g = c.program.buffers[step.in[0]], &sum = c.program.buffers[step.in[1]];
  c.expect(step.in[1] == step.out[0] && !sum.state.empty() && g.dtype == DType::F32 &&
               g.rows * g.width == sum.rows * sum.width,
           "expected a gradient and its sum (a state buffer of as many values, in and out)");
  if (compensated) {
    const PlanBuffer &err = c.program.buffers[step.in[2]];
    c.expect(step.in[2] == step.out[1] && !err.state.empty() &&
                 err.rows * err.width == sum.rows * sum.width,
             "expected the sum's error after it (a state buffer of as many values, in and out)");
  }
}

int64_t runAccumulate(cpu::StepContext &c) {
  const int64_t n = c.bufferRows(c.step->in[1]) * c.width(c.step->in[1]);
  if (c.step->in.size() == 3)
    cpu::accumulate(c.in(0), c.out(0), c.out(1), n);
  else
    cpu::accumulate(c.in(0), c.out(0), nullptr, n);
  return c.rows;
}

/// in and out: a compensated gradient sum (sum, error: state buffers).
void checkGradTotal(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 0, 0, 2);
  const PlanBuffer &sum = c.program.buffers[step.in[0]], &err = c.program.buffers[step.in[1]];
  c.expect(step.in[0] == step.out[0] && step.in[1] == step.out[1] && !sum.state.empty() &&
               !err.state.empty() && err.rows * err.width == sum.rows * sum.width,
           "expected a gradient sum and its error (state buffers of as many values, in and out)");
}

int64_t runGradTotal(cpu::StepContext &c) {
  cpu::addCompensation(c.out(0), c.out(1), c.bufferRows(c.step->in[0]) * c.width(c.step->in[0]));
  return c.rows;
}

/// A table tied over the first and last pipeline stage: ins the first
/// stage's sum (and error), then the last's, one pair its own state, the
/// other what the other stage sent; outs its own.
void checkCombineStages(const StepChecker &c, const PlanStep &step) {
  const bool compensated = step.in.size() == 4;
  c.arity(compensated ? 4 : 2, 0, 0, compensated ? 2 : 1);
  const size_t half = step.in.size() / 2;
  const int64_t stage = c.program.stage, pp = c.plan.degrees.pp;
  c.expect(c.program.entry == "optimizer" && pp > 2 && (stage == 0 || stage == pp - 1),
           "combine_stages: an optimizer program of the first or last of more than two "
           "pipeline stages");
  const size_t own = stage == 0 ? 0 : half;
  const PlanBuffer &sum = c.program.buffers[step.in[own]];
  bool same = !sum.state.empty();
  for (size_t k = 0; k < step.in.size(); ++k) {
    const PlanBuffer &b = c.program.buffers[step.in[k]];
    same &= b.dtype == DType::F32 && b.rows * b.width == sum.rows * sum.width;
  }
  for (size_t k = 0; k < step.out.size(); ++k)
    same &= step.out[k] == step.in[own + k];
  c.expect(same, "combine_stages: expected the stage's own sum (and error, state buffers) among "
                 "the first's and the last's, in and out, all of as many f32 values");
}

int64_t runCombineStages(cpu::StepContext &c) {
  const bool compensated = c.step->in.size() == 4;
  const size_t half = c.step->in.size() / 2;
  const int64_t n = c.bufferRows(c.step->in[0]) * c.width(c.step->in[0]);
  cpu::combineStages(c.in(0), compensated ? c.in(1) : nullptr, c.in(half),
                     compensated ? c.in(half + 1) : nullptr, c.out(0),
                     compensated ? c.out(1) : nullptr, n);
  return c.rows;
}

void parseSchedule(const JsonFields &a, PlanStep &step) {
  OptimizerParams &o = step.optimizer;
  const std::string schedule = a.string("schedule");
  if (schedule != "constant" && schedule != "cosine")
    a.fail("schedule", fmt::format("'{}': expected constant or cosine", schedule));
  o.cosine = schedule == "cosine";
  o.lr = a.number("lr");
  o.minLr = a.number("min_lr");
  o.warmupSteps = a.integer("warmup_steps", 0);
  o.decaySteps = a.integer("decay_steps", 0);
  if (!(o.lr > 0) || !(o.minLr >= 0 && o.minLr <= o.lr))
    a.fail("lr", "expected lr > 0 and 0 <= min_lr <= lr");
  if (o.cosine && o.decaySteps <= o.warmupSteps)
    a.fail("decay_steps", "the cosine schedule needs decay_steps > warmup_steps");
}

/// The step number in, the stats out.
void checkStats(const StepChecker &c, int64_t buffer) {
  c.expect(buffer == c.program.statsBuffer, "expected the program's stats buffer");
}

void checkSchedule(const StepChecker &c, const PlanStep &step) {
  c.arity(1, 0, 0, 1);
  c.expect(step.in[0] == c.program.stepBuffer, "expected the program's step as input");
  checkStats(c, step.out[0]);
}

cpu::LrSchedule scheduleOf(const OptimizerParams &o) {
  return {o.cosine, o.lr, o.minLr, o.warmupSteps, o.decaySteps};
}

int64_t runSchedule(cpu::StepContext &c) {
  const int64_t step = c.inInts(0)[0];
  if (step < 1)
    runtimeError("optimizer step {}: expected a step from 1", step);
  float *stats = c.out(0);
  stats[0] = static_cast<float>(cpu::scheduledLr(scheduleOf(c.step->optimizer), step));
  stats[1] = 0;
  stats[2] = 1;
  stats[3] = 0;
  return c.rows;
}

void parseGradNorm(const JsonFields &a, PlanStep &step) {
  step.optimizer.fromSquares = a.has("from_squares") && a.boolean("from_squares");
  step.optimizer.maxNorm = a.number("max_norm");
  if (!(step.optimizer.maxNorm >= 0))
    a.fail("max_norm", "expected a value >= 0");
  step.optimizer.microBatches = a.bounded("micro_batches", 1, int64_t(1) << 30);
}

/// A buffer of one value (sum_squares' value and error).
bool single(const StepChecker &c, int64_t buffer) {
  const PlanBuffer &b = c.program.buffers[buffer];
  return b.dtype == DType::F32 && b.rows == 1 && b.width == 1 && b.state.empty();
}

/// in: the stats, then every gradient sum (with from_squares: sums of
/// their squares, each a value and its error); out: the stats.
void checkGradNorm(const StepChecker &c, const PlanStep &step) {
  c.expect(step.in.size() >= 2 && step.weights.empty() && step.out.size() == 1,
           "expected the stats and the gradient sums in, the stats out");
  checkStats(c, step.in[0]);
  checkStats(c, step.out[0]);
  if (step.optimizer.fromSquares) {
    // (Expert parallelism: one pair for the replicated weights, one for
    // the ep group's experts.)
    bool pairs = step.in.size() % 2 == 1;
    for (size_t i = 1; i < step.in.size(); ++i)
      pairs = pairs && single(c, step.in[i]);
    c.expect(pairs, "from_squares: expected the stats, then sums of squares each with its error "
                    "(buffers of one f32 value)");
    return;
  }
  for (size_t i = 1; i < step.in.size(); ++i)
    c.expect(!c.program.buffers[step.in[i]].state.empty(),
             fmt::format("input {}: expected a gradient sum (a state buffer)", i));
}

/// in: gradient sums (ZeRO-2: the rank's shards; ZeRO-1, `replicas`: the
/// rank's rows of the whole sums); out: the sum of their squares as a
/// value and its error (f32: their double sum, then the rest).
void checkSumSquares(const StepChecker &c, const PlanStep &step) {
  const int64_t members = step.optimizer.shardOverEdp ? c.plan.degrees.edp : c.plan.degrees.dp;
  c.expect(step.optimizer.replicas == 0 || step.optimizer.replicas == members,
           fmt::format("replicas {}: expected the plan's {} ({})", step.optimizer.replicas,
                       step.optimizer.shardOverEdp ? "edp" : "dp", members));
  c.expect(!step.in.empty() && step.weights.empty() && step.out.size() == 2 &&
               single(c, step.out[0]) && single(c, step.out[1]),
           "expected the gradient sums in, their sum of squares and its error out (buffers of "
           "one f32 value)");
  for (size_t i = 0; i < step.in.size(); ++i)
    c.expect(!c.program.buffers[step.in[i]].state.empty(),
             fmt::format("input {}: expected a gradient sum (a state buffer)", i));
}

void parseSumSquares(const JsonFields &a, PlanStep &step) {
  if (a.has("replicas"))
    step.optimizer.replicas = a.bounded("replicas", 1, int64_t(1) << 20);
  // (An expert stack's sums under EP or TP: the rank's edp member's rows.)
  if (a.has("shard_group")) {
    if (a.string("shard_group") != "edp" || !a.has("replicas"))
      a.fail("shard_group", "expected \"edp\", with replicas");
    step.optimizer.shardOverEdp = true;
  }
}

/// The squares of inputs `first`.. (with optimizer.replicas: of this
/// replica's rows [d k, (d + 1) k) of each, k = ceil(rows / replicas), d
/// its dp coordinate, or with shard_group its edp one).
double squaresOf(cpu::StepContext &c, size_t first) {
  const PlanStep &s = *c.step;
  double squares = 0;
  for (size_t i = first; i < s.in.size(); ++i) {
    int64_t rows = c.bufferRows(s.in[i]), from = 0;
    const int64_t width = c.width(s.in[i]);
    if (s.optimizer.replicas > 0) {
      const int64_t k = (rows + s.optimizer.replicas - 1) / s.optimizer.replicas;
      from = std::min(rows, (s.optimizer.shardOverEdp ? c.coords.edp : c.coords.dp) * k);
      rows = std::min(rows, from + k) - from;
    }
    squares += cpu::sumOfSquares(c.in(i) + from * width, rows * width);
  }
  return squares;
}

int64_t runSumSquares(cpu::StepContext &c) {
  const double squares = squaresOf(c, 0);
  const float value = static_cast<float>(squares);
  c.out(0)[0] = value;
  c.out(1)[0] = static_cast<float>(squares - static_cast<double>(value));
  return c.rows;
}

/// from_squares: the sums of squares (value, error) after the stats, added.
double squaresFromPairs(cpu::StepContext &c) {
  double squares = 0;
  for (size_t i = 1; i + 1 < c.step->in.size(); i += 2)
    squares += static_cast<double>(c.in(i)[0]) + static_cast<double>(c.in(i + 1)[0]);
  return squares;
}

int64_t runGradNorm(cpu::StepContext &c) {
  const PlanStep &s = *c.step;
  const double squares =
      s.optimizer.fromSquares ? squaresFromPairs(c) : squaresOf(c, 1);
  // The norm of the mean gradient (the sums over micro-batches / their count).
  const double norm = std::sqrt(squares) / static_cast<double>(s.optimizer.microBatches);
  float *stats = c.out(0);
  stats[1] = static_cast<float>(norm);
  stats[2] = static_cast<float>(cpu::clipCoefficient(norm, s.optimizer.maxNorm));
  // A gradient that is not finite moves no weight: the update is skipped.
  stats[3] = std::isfinite(norm) ? 0.0f : 1.0f;
  return c.rows;
}

void parseAdamW(const JsonFields &a, PlanStep &step) {
  OptimizerParams &o = step.optimizer;
  o.beta1 = a.number("beta1");
  o.beta2 = a.number("beta2");
  o.weightDecay = a.number("weight_decay");
  o.microBatches = a.bounded("micro_batches", 1, int64_t(1) << 30);
  if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1))
    a.fail("beta1", "expected betas in [0, 1)");
  if (!(o.weightDecay >= 0))
    a.fail("weight_decay", "expected a value >= 0");
  if (!a.has("eps"))
    a.fail("eps", "missing");
  o.keepSum = a.has("keep_sum") && a.boolean("keep_sum");
}

/// in: step, stats, the gradient sum, m, v (and a bf16 weight's f32
/// master); weights: the parameter (f32 or bf16); out: m, v, the gradient
/// sum (reset, unless keep_sum) (and the master).
void checkAdamW(const StepChecker &c, const PlanStep &step) {
  c.expect(step.weights.size() == 1, "expected one weight");
  const PlanWeight &w = c.program.weights[step.weights[0]];
  const bool bf16 = w.dtype == DType::BF16;
  c.arity(bf16 ? 6 : 5, 1, 1, bf16 ? 4 : 3);
  c.expect(step.in[0] == c.program.stepBuffer, "expected the program's step as input 0");
  checkStats(c, step.in[1]);
  c.expect(w.dtype == DType::F32 || bf16,
           fmt::format("'{}' is {}: the optimizer updates f32 and bf16 weights", w.name,
                       dtypeName(w.dtype)));
  for (size_t i = 2; i < step.in.size(); ++i)
    c.expect(!c.program.buffers[step.in[i]].state.empty() && stateOfWeight(c, step.in[i], w),
             fmt::format("input {}: expected a state buffer of the shape of '{}'", i, w.name));
  // ZeRO: the moments (and the master) are shards, all of them or none;
  // the gradient sum whole (ZeRO-1) or a shard (ZeRO-2).
  const bool sharded = c.program.buffers[step.in[3]].logicalRows > 0;
  for (size_t i = 3; i < step.in.size(); ++i)
    c.expect((c.program.buffers[step.in[i]].logicalRows > 0) == sharded,
             fmt::format("input {}: expected the moments and master all ZeRO shards, or none",
                         i));
  c.expect(sharded || c.program.buffers[step.in[2]].logicalRows == 0,
           "input 2: a gradient sum that is a ZeRO shard needs sharded moments");
  // (One shard of one group: the moments', the master's and a sharded
  // sum's rows alike; an edp shard only of an expert stack.)
  const PlanBuffer &moments = c.program.buffers[step.in[3]];
  for (size_t i = 2; i < step.in.size() && sharded; ++i) {
    const PlanBuffer &b = c.program.buffers[step.in[i]];
    c.expect(b.logicalRows == 0 || (b.rows == moments.rows && b.shardOverEdp == moments.shardOverEdp),
             fmt::format("input {}: expected a shard of the moments' rows and group", i));
  }
  c.expect(!moments.shardOverEdp || w.experts > 0,
           fmt::format("'{}': only an expert stack's states are shards over edp", w.name));
  c.expect(step.out[0] == step.in[3] && step.out[1] == step.in[4] && step.out[2] == step.in[2] &&
               (!bf16 || step.out[3] == step.in[5]),
           "expected outputs m, v, the gradient sum (and the master): inputs 3, 4, 2 (and 5)");
}

int64_t runAdamW(cpu::StepContext &c) {
  const PlanStep &s = *c.step;
  const float *stats = c.in(1);
  cpu::AdamWStep step;
  step.step = c.inInts(0)[0];
  step.lr = stats[0];
  step.beta1 = s.optimizer.beta1;
  step.beta2 = s.optimizer.beta2;
  step.eps = s.eps;
  step.weightDecay = s.optimizer.weightDecay;
  step.gradScale = static_cast<double>(stats[2]) / static_cast<double>(s.optimizer.microBatches);
  step.keepSum = s.optimizer.keepSum;
  float *sum = c.in(2), *m = c.in(3), *v = c.in(4);
  if (stats[3] != 0) { // grad_norm found it not finite: skipped, the sum cleared
    if (!step.keepSum)
      std::fill(sum, sum + c.bufferRows(s.in[2]) * c.width(s.in[2]), 0.0f);
    return c.rows;
  }
  float *master = s.in.size() > 5 ? c.in(5) : nullptr; // a bf16 weight's
  // The elements this rank updates: all, or its ZeRO shard's rows [d k,
  // (d + 1) k) of the state view, whose moments (and master) hold only them.
  // The sum is whole (ZeRO-1) or the same shard (ZeRO-2: indexed from
  // `first` too).
  const PlanBuffer &moments = c.program->buffers[s.in[3]], &sums = c.program->buffers[s.in[2]];
  const int64_t sumElements = sums.rows * sums.width;
  int64_t first = 0, end = sumElements;
  if (moments.logicalRows > 0) {
    end = moments.logicalRows * moments.width;
    const int64_t member = moments.shardOverEdp ? c.coords.edp : c.coords.dp;
    first = std::min(end, member * moments.rows * moments.width);
    end = std::min(end, first + moments.rows * moments.width);
  }
  const int64_t sumFrom = sums.logicalRows > 0 ? first : 0;
  // The device owns a plan's weights when it has an optimizer: written in
  // place. `data` holds elements [offset, offset + n) of the weight.
  auto update = [&](const void *data, int64_t n, int64_t offset) {
    const int64_t from = std::max(offset, first), to = std::min(offset + n, end);
    if (from >= to)
      return;
    const int64_t local = from - first, count = to - from;
    char *w = static_cast<char *>(const_cast<void *>(data));
    if (master)
      cpu::adamwBf16(reinterpret_cast<uint16_t *>(w) + (from - offset), master + local,
                     m + local, v + local, sum + (from - sumFrom), count, step);
    else
      cpu::adamw(reinterpret_cast<float *>(w) + (from - offset), m + local, v + local,
                 sum + (from - sumFrom), count, step);
  };
  if (c.program->weights[s.weights[0]].experts > 0) {
    int64_t offset = 0;
    for (const cpu::Matrix &e : c.experts(0)) {
      update(e.data, e.rows * e.cols, offset);
      offset += e.rows * e.cols;
    }
  } else {
    const TensorView &w = c.weight(0);
    update(w.data, w.numel(), 0);
  }
  // (adamw resets the sum it reads; a ZeRO-1 update reads its rows only.)
  if (sums.logicalRows == 0 && !step.keepSum) {
    std::fill(sum, sum + first, 0.0f);
    std::fill(sum + end, sum + sumElements, 0.0f);
  }
  return c.rows;
}

/// in: the routing's expert ids [T, k] and the load (a state buffer of 1
/// row of E); out: the load.
void checkCountExperts(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 0, 0, 1);
  c.tokens(step.in[0], DType::I32);
  const PlanBuffer &load = c.program.buffers[step.in[1]];
  c.expect(step.in[1] == step.out[0] && !load.state.empty() && load.rows == 1,
           "expected the expert ids and the load (a state buffer of 1 row, in and out)");
}

int64_t runCountExperts(cpu::StepContext &c) {
  const int64_t k = c.inWidth(0), experts = c.width(c.step->in[1]);
  if (!cpu::countExperts(c.inInts(0), c.rows * k, c.out(0), experts))
    runtimeError("count_experts (step {}): an expert id outside [0, {})", c.index, experts);
  return c.rows;
}

void parseBiasUpdate(const JsonFields &a, PlanStep &step) {
  step.optimizer.lr = a.number("rate");
  if (!(step.optimizer.lr > 0))
    a.fail("rate", "expected a rate > 0");
}

/// in: the load; weights: the correction bias [E] (f32); out: the load.
void checkBiasUpdate(const StepChecker &c, const PlanStep &step) {
  c.arity(1, 1, 1, 1);
  const PlanWeight &bias = c.weight(0, 1);
  const PlanBuffer &load = c.program.buffers[step.in[0]];
  c.expect(bias.dtype == DType::F32 && step.out[0] == step.in[0] && !load.state.empty() &&
               load.rows == 1 && load.width == bias.shape[0],
           fmt::format("expected the load of the experts of '{}' (a state buffer of 1 row of {}, "
                       "in and out) and the f32 bias",
                       bias.name, bias.shape[0]));
}

int64_t runBiasUpdate(cpu::StepContext &c) {
  const TensorView &bias = c.weight(0);
  cpu::expertBiasUpdate(static_cast<float *>(const_cast<void *>(bias.data)), c.out(0),
                        bias.numel(), c.step->optimizer.lr);
  return c.rows;
}

} // namespace

// (An optimizer program runs with no rows: its steps run empty.)
const OpDef kAccumulate = {"accumulate", Collective::None, OpDef::RunsEmpty, nullptr, checkAccumulate,
                           runAccumulate};
const OpDef kGradTotal = {"grad_total", Collective::None, OpDef::RunsEmpty, nullptr, checkGradTotal,
                          runGradTotal};
const OpDef kCombineStages = {"combine_stages", Collective::None, OpDef::RunsEmpty, nullptr,
                              checkCombineStages, runCombineStages};
const OpDef kLrSchedule = {"lr_schedule", Collective::None, OpDef::RunsEmpty, parseSchedule, checkSchedule,
                           runSchedule};
const OpDef kSumSquares = {"sum_squares", Collective::None, OpDef::RunsEmpty, parseSumSquares,
                           checkSumSquares, runSumSquares};
const OpDef kGradNorm = {"grad_norm", Collective::None, OpDef::RunsEmpty, parseGradNorm, checkGradNorm,
                         runGradNorm};
const OpDef kCountExperts = {"count_experts", Collective::None, 0, nullptr, checkCountExperts,
                             runCountExperts};
const OpDef kExpertBiasUpdate = {"expert_bias_update", Collective::None,
                                 OpDef::UpdatesWeights | OpDef::RunsEmpty, parseBiasUpdate,
                                 checkBiasUpdate, runBiasUpdate};
const OpDef kAdamW = {"adamw", Collective::None, OpDef::UpdatesWeights | OpDef::RunsEmpty,
                      parseAdamW, checkAdamW,
                      runAdamW};

} // namespace moert::ops
