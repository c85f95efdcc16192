// The structural checks of a plan's programs (PlanChecks.h).
#include "PlanChecks.h"

#include "moert/Error.h"

#include <fmt/format.h>

#include <string>
#include <vector>

namespace moert {

int64_t axisSize(const Degrees &d, CollectiveGroup::Axis axis) {
  switch (axis) {
  case CollectiveGroup::Axis::PP: return d.pp;
  case CollectiveGroup::Axis::DP: return d.dp;
  case CollectiveGroup::Axis::TP: return d.tp;
  case CollectiveGroup::Axis::EDP: return d.edp;
  case CollectiveGroup::Axis::EP: return d.ep;
  case CollectiveGroup::Axis::ETP: return d.etp;
  }
  return 1;
}

int64_t &axisCoord(RankCoords &c, CollectiveGroup::Axis axis) {
  switch (axis) {
  case CollectiveGroup::Axis::PP: return c.pp;
  case CollectiveGroup::Axis::DP: return c.dp;
  case CollectiveGroup::Axis::TP: return c.tp;
  case CollectiveGroup::Axis::EDP: return c.edp;
  case CollectiveGroup::Axis::EP: return c.ep;
  case CollectiveGroup::Axis::ETP: return c.etp;
  }
  return c.tp;
}

int64_t attentionRank(const Degrees &d, const RankCoords &c) {
  return (c.pp * d.dp + c.dp) * d.tp + c.tp;
}
int64_t expertRank(const Degrees &d, const RankCoords &c) {
  return ((c.pp * d.edp + c.edp) * d.ep + c.ep) * d.etp + c.etp;
}

void StepChecker::fail(const std::string &message) const {
  inputError("{}: programs[{}].steps[{}] ({}): {}", plan.path, programIndex, index,
             step.op->name, message);
}

void StepChecker::arity(size_t in, size_t weightsMin, size_t weightsMax, size_t out) const {
  if (step.in.size() != in || step.out.size() != out || step.weights.size() < weightsMin ||
      step.weights.size() > weightsMax)
    fail(fmt::format("expected {} inputs, {}-{} weights and {} outputs but got {}, {} and {}", in,
                     weightsMin, weightsMax, out, step.in.size(), step.weights.size(),
                     step.out.size()));
}

int64_t StepChecker::width(int64_t buffer, DType dtype) const {
  const PlanBuffer &b = program.buffers[buffer];
  if (b.dtype != dtype)
    fail(fmt::format("buffer {} holds {} but the op needs {}", buffer, dtypeName(b.dtype),
                     dtypeName(dtype)));
  return b.width;
}

int64_t StepChecker::tokens(int64_t buffer, DType dtype) const {
  int64_t w = width(buffer, dtype);
  if (program.buffers[buffer].rows < program.maxBatchTokens)
    fail(fmt::format("buffer {} has {} rows, fewer than max_batch_tokens ({})", buffer,
                     program.buffers[buffer].rows, program.maxBatchTokens));
  return w;
}

const PlanWeight &StepChecker::weight(size_t i, size_t rankWanted) const {
  const PlanWeight &w = program.weights[step.weights[i]];
  if (w.shape.size() != rankWanted)
    fail(fmt::format("weight '{}' has rank {} but the op needs rank {}", w.name, w.shape.size(),
                     rankWanted));
  return w;
}

const PlanCache &StepChecker::cache() const {
  if (step.kvCache < 0 || step.kvCache >= static_cast<int64_t>(program.caches.size()))
    fail(fmt::format("kv_cache {} out of range", step.kvCache));
  return program.caches[step.kvCache];
}

int64_t StepChecker::experts(int64_t buf, int64_t counts) const {
  int64_t E = width(counts, DType::I32);
  expect(rows(counts) >= 1, fmt::format("counts buffer {} has no row", counts));
  expect(rows(buf) % E == 0, fmt::format("buffer {} has {} rows, not a multiple of the {} "
                                         "experts of counts buffer {}",
                                         buf, rows(buf), E, counts));
  return E;
}

void checkStep(const Plan &plan, const PlanProgram &program, size_t programIndex,
               size_t stepIndex) {
  const PlanStep &step = program.steps[stepIndex];
  step.op->check(StepChecker(plan, program, programIndex, step, stepIndex), step);
}

void checkDataFlow(const PlanProgram &program, const JsonFields &pr, bool pipelined) {
  // A step dropped, duplicated or reordered, or two layers on one cache,
  // would otherwise compute another model from stale values: every input
  // must come from the step the compiler says computed it.
  constexpr int64_t kNever = -2, kInput = -1;
  std::vector<int64_t> lastWriter(program.buffers.size(), kNever);
  for (int64_t input : {program.tokensBuffer, program.positionsBuffer, program.labelsBuffer,
                        program.stepBuffer})
    if (input >= 0)
      lastWriter[input] = kInput;
  // A state buffer holds what the last run (of any of the rank's programs)
  // left in it: an input of every run.
  for (size_t id = 0; id < program.buffers.size(); ++id)
    if (!program.buffers[id].state.empty())
      lastWriter[id] = kInput;
  auto writer = [](int64_t step) {
    return step == kInput ? std::string("the program's input") : fmt::format("step {}", step);
  };
  std::vector<int64_t> cacheStep(program.caches.size(), -1);
  for (size_t i = 0; i < program.steps.size(); ++i) {
    const PlanStep &step = program.steps[i];
    JsonFields s = pr.element("steps", i);
    for (size_t k = 0; k < step.in.size(); ++k) {
      int64_t id = step.in[k];
      if (lastWriter[id] == kNever)
        s.fail("in", fmt::format("buffer {} is read before any step writes it", id));
      if (lastWriter[id] != step.inFrom[k])
        s.fail("in_from", fmt::format("input {} (buffer {}) was last written by {}, but the plan "
                                      "says by {}: a step dropped, duplicated or moved",
                                      k, id, writer(lastWriter[id]), writer(step.inFrom[k])));
    }
    for (int64_t id : step.out)
      lastWriter[id] = static_cast<int64_t>(i);
    if (step.kvCache >= 0) {
      // One attention step per cache, but for a recomputed attention, which
      // writes its forward step's cache again.
      const int64_t first = cacheStep[step.kvCache];
      if (first >= 0 && !(step.recompute && program.steps[first].op == step.op))
        s.fail("attrs.kv_cache", fmt::format("KV cache {} is also step {}'s", step.kvCache, first));
      // (A pipeline stage's backward program recomputes the attentions of
      // its forward program, "train_forward", whose caches it declares.)
      if (first < 0 && step.recompute && !pipelined)
        s.fail("attrs.kv_cache", fmt::format("KV cache {}: a recomputed step's cache is an "
                                             "earlier step's", step.kvCache));
      if (first < 0)
        cacheStep[step.kvCache] = static_cast<int64_t>(i);
    }
    if (step.recompute && program.entry != "train")
      s.fail("attrs.recompute", "only a train program recomputes steps");
  }
}

void checkWeightBinding(const PlanProgram &program, const JsonFields &pr, bool pipelined) {
  // A weight id swapped for another of the same shape passes every shape
  // check; in a plan numbered in binding order it is out of order, bound
  // twice or never bound.
  std::vector<int64_t> firstStep(program.weights.size(), -1);
  if (program.entry == "optimizer") {
    // The optimizer's updates write each weight they bind, once; weights
    // that are not parameters (no gradient) are bound by none. Over ZeRO
    // shards each update is followed by the weight's all_gather, once.
    std::vector<bool> gathered(program.weights.size(), false);
    for (size_t i = 0; i < program.steps.size(); ++i)
      for (int64_t id : program.steps[i].weights) {
        if (program.steps[i].op->collective == Collective::AllGather) {
          if (firstStep[id] < 0 || gathered[id])
            pr.element("steps", i).fail(
                "weights", fmt::format("weight {} ('{}'): an all_gather of a weight follows its "
                                       "update, once",
                                       id, program.weights[id].name));
          gathered[id] = true;
          continue;
        }
        if (!program.steps[i].op->has(OpDef::UpdatesWeights) || firstStep[id] >= 0)
          pr.element("steps", i).fail(
              "weights", fmt::format("weight {} ('{}'): an optimizer program's weights are "
                                     "bound by one update each",
                                     id, program.weights[id].name));
        firstStep[id] = static_cast<int64_t>(i);
      }
    return;
  }
  size_t next = 0;
  for (size_t i = 0; i < program.steps.size(); ++i) {
    const PlanStep &step = program.steps[i];
    if (step.op->has(OpDef::UpdatesWeights))
      pr.element("steps", i).fail("op", "only an optimizer program updates weights");
    for (int64_t id : step.weights) {
      const PlanWeight &w = program.weights[id];
      if (step.op->has(OpDef::Backward) || (step.recompute && pipelined)) {
        // (A pipeline stage's backward program, its recomputed forward
        // steps too, reads the weights its forward program binds.)
        if (firstStep[id] < 0 && !(pipelined && program.entry == "train"))
          pr.element("steps", i).fail(
              "weights", fmt::format("weight {} ('{}') is read by a backward step before any "
                                     "forward step binds it",
                                     id, w.name));
        continue;
      }
      if (firstStep[id] < 0) {
        if (static_cast<size_t>(id) != next)
          pr.element("steps", i).fail(
              "weights", fmt::format("weight {} ('{}') is bound before weight {} ('{}'); steps "
                                     "bind a program's weights in order (a swapped weight id?)",
                                     id, w.name, next, program.weights[next].name));
        firstStep[id] = static_cast<int64_t>(i);
        ++next;
        continue;
      }
      // Bound again: by the LM head of a tied table, or by a recomputed
      // forward step (a norm of a fused add_norm's sum recomputes as a norm).
      const PlanStep &first = program.steps[firstStep[id]];
      if (!(first.op->has(OpDef::TiedTable) && step.head) && !step.recompute)
        pr.element("steps", i).fail(
            "weights", fmt::format("weight {} ('{}') is already bound by step {}; only a tied "
                                   "embedding table is shared (with the LM head), or a "
                                   "recomputed step's",
                                   id, w.name, firstStep[id]));
    }
  }
  if (next != program.weights.size() && !(pipelined && program.entry == "train"))
    pr.fail("weights", fmt::format("weight {} ('{}') is bound by no step", next,
                                   program.weights[next].name));
}

void refuseCpuOnlyWeights(const Plan &plan, int64_t rank, const char *device) {
  for (const PlanWeight &w : plan.programOf(rank).weights)
    if (w.int8Block)
      inputError("{}: weight '{}' is int8: not supported yet on {}", plan.path, w.name, device);
}

} // namespace moert
