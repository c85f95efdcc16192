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

namespace {

/// Shape checks of one step of program `programIndex` against its buffers
/// and weights. Per-token operands (T <= max_batch_tokens rows) need at
/// least max_batch_tokens rows; dispatch buffers exactly E x C.
class StepChecker {
public:
  StepChecker(const Plan &plan, const PlanProgram &program, size_t programIndex,
              const PlanStep &step, size_t index)
      : plan(plan), program(program), programIndex(programIndex), step(step), index(index) {}

  [[noreturn]] void fail(const std::string &message) const {
    inputError("{}: programs[{}].steps[{}] ({}): {}", plan.path, programIndex, index,
               opName(step.op), message);
  }
  void arity(size_t in, size_t weightsMin, size_t weightsMax, size_t out) const {
    if (step.in.size() != in || step.out.size() != out || step.weights.size() < weightsMin ||
        step.weights.size() > weightsMax)
      fail(fmt::format("expected {} inputs, {}-{} weights and {} outputs but got {}, {} and {}",
                       in, weightsMin, weightsMax, out, step.in.size(), step.weights.size(),
                       step.out.size()));
  }
  /// The width of a buffer of `dtype`, whatever its rows.
  int64_t width(int64_t buffer, DType dtype = DType::F32) const {
    const PlanBuffer &b = program.buffers[buffer];
    if (b.dtype != dtype)
      fail(fmt::format("buffer {} holds {} but the op needs {}", buffer, dtypeName(b.dtype),
                       dtypeName(dtype)));
    return b.width;
  }
  /// The width of a per-token buffer: one row per token of the batch.
  int64_t tokens(int64_t buffer, DType dtype = DType::F32) const {
    int64_t w = width(buffer, dtype);
    if (program.buffers[buffer].rows < plan.maxBatchTokens)
      fail(fmt::format("buffer {} has {} rows, fewer than max_batch_tokens ({})", buffer,
                       program.buffers[buffer].rows, plan.maxBatchTokens));
    return w;
  }
  int64_t rows(int64_t buffer) const { return program.buffers[buffer].rows; }
  const PlanWeight &weight(size_t i, size_t rankWanted) const {
    const PlanWeight &w = program.weights[step.weights[i]];
    if (w.shape.size() != rankWanted)
      fail(fmt::format("weight '{}' has rank {} but the op needs rank {}", w.name,
                       w.shape.size(), rankWanted));
    return w;
  }
  void expect(bool ok, const std::string &message) const {
    if (!ok)
      fail(message);
  }
  const PlanCache &cache() const {
    if (step.kvCache < 0 || step.kvCache >= static_cast<int64_t>(program.caches.size()))
      fail(fmt::format("kv_cache {} out of range", step.kvCache));
    return program.caches[step.kvCache];
  }
  int64_t groupSize() const { return axisSize(plan.degrees, step.group.axis); }

  void check() const;

private:
  /// The [E*C, H] buffers of all_to_all / expert_ffn: E experts (a counts
  /// buffer of 1 row of E) with the same whole number of rows each.
  int64_t experts(int64_t buf, int64_t counts) const {
    int64_t E = width(counts, DType::I32);
    expect(rows(counts) >= 1, fmt::format("counts buffer {} has no row", counts));
    expect(rows(buf) % E == 0,
           fmt::format("buffer {} has {} rows, not a multiple of the {} experts of counts "
                       "buffer {}", buf, rows(buf), E, counts));
    return E;
  }

  const Plan &plan;
  const PlanProgram &program;
  size_t programIndex;
  const PlanStep &step;
  size_t index;
};

void StepChecker::check() const {
  switch (step.op) {
  case OpKind::Embedding: {
    arity(1, 1, 1, 1);
    expect(tokens(step.in[0], DType::I32) == 1, "the token ids buffer must be 1 wide");
    const PlanWeight &t = weight(0, 2);
    expect(tokens(step.out[0]) == t.shape[1], "output width differs from the table's");
    if (step.vocabShard)
      expect(t.shape[0] * plan.degrees.tp == plan.paddedVocab,
             fmt::format("a vocab_shard table of {} rows x tp {} is not the padded vocabulary "
                         "({})", t.shape[0], plan.degrees.tp, plan.paddedVocab));
    else
      expect(t.shape[0] == plan.vocabSize, "embedding rows differ from vocab_size");
    break;
  }
  case OpKind::RMSNorm:
  case OpKind::LayerNorm: {
    arity(1, 1, step.op == OpKind::LayerNorm ? 2 : 1, 1);
    int64_t w = tokens(step.in[0]);
    const PlanWeight &g = weight(0, 1);
    expect(g.shape[0] > 0 && w % g.shape[0] == 0, "weight size does not divide the width");
    expect(step.op == OpKind::RMSNorm || g.shape[0] == w, "layer_norm weight must span the row");
    if (step.weights.size() == 2)
      expect(weight(1, 1).shape == g.shape, "bias and weight shapes differ");
    expect(tokens(step.out[0]) == w, "output width differs from the input's");
    expect(step.eps > 0, "eps must be > 0");
    break;
  }
  case OpKind::Linear: {
    arity(1, 1, 2, 1);
    const PlanWeight &w = weight(0, 2);
    expect(tokens(step.in[0]) == w.shape[1], fmt::format("input width differs from '{}' columns", w.name));
    expect(tokens(step.out[0]) == w.shape[0], fmt::format("output width differs from '{}' rows", w.name));
    if (step.weights.size() == 2)
      expect(weight(1, 1).shape[0] == w.shape[0], "bias size differs from the output width");
    break;
  }
  case OpKind::Rope: {
    arity(2, 0, 0, 1);
    int64_t w = tokens(step.in[0]);
    tokens(step.in[1], DType::I32);
    expect(step.headDim > 0 && w % step.headDim == 0, "head_dim does not divide the width");
    expect(step.rope.rotaryDim <= step.headDim, "rotary_dim exceeds head_dim");
    expect(tokens(step.out[0]) == w, "output width differs from the input's");
    break;
  }
  case OpKind::Attention: {
    arity(3, 0, 0, 1);
    int64_t q = tokens(step.in[0]), k = tokens(step.in[1]), v = tokens(step.in[2]);
    expect(step.heads > 0 && step.kvHeads > 0 && step.heads % step.kvHeads == 0,
           "kv_heads must divide heads");
    expect(q % step.heads == 0 && k % step.kvHeads == 0 && v % step.kvHeads == 0,
           "widths are not whole heads");
    expect(q / step.heads == k / step.kvHeads, "query and key head dims differ");
    expect(tokens(step.out[0]) == step.heads * (v / step.kvHeads),
           "output width is not heads x value dim");
    const PlanCache &c = cache();
    expect(c.keyWidth == k && c.valueWidth == v, "kv cache widths differ from key/value widths");
    break;
  }
  case OpKind::MLAttention: {
    arity(4, 0, 0, 1);
    int64_t q = tokens(step.in[0]), kv = tokens(step.in[1]), r = tokens(step.in[2]);
    tokens(step.in[3], DType::I32);
    expect(step.heads > 0 && q % step.heads == 0 && kv % step.heads == 0, "widths are not whole heads");
    int64_t nope = q / step.heads - r, vdim = kv / step.heads - nope;
    expect(r == step.rope.rotaryDim && nope > 0 && vdim > 0, "inconsistent MLA head dims");
    expect(tokens(step.out[0]) == step.heads * vdim, "output width is not heads x value dim");
    const PlanCache &c = cache();
    expect(c.keyWidth == step.heads * (nope + r) && c.valueWidth == step.heads * vdim,
           "kv cache widths differ from the MLA head dims");
    break;
  }
  case OpKind::Split: {
    expect(step.in.size() == 1 && step.out.size() == step.widths.size() && !step.out.empty(),
           "expected one input and one output per width");
    int64_t sum = 0;
    for (size_t i = 0; i < step.out.size(); ++i) {
      expect(tokens(step.out[i]) >= step.widths[i] && step.widths[i] > 0, "output narrower than its part");
      sum += step.widths[i];
    }
    expect(sum == tokens(step.in[0]), "widths do not add up to the input width");
    break;
  }
  case OpKind::Add:
    arity(2, 0, 0, 1);
    expect(tokens(step.in[0]) == tokens(step.in[1]) && tokens(step.out[0]) == tokens(step.in[0]),
           "operand widths differ");
    break;
  case OpKind::SigmoidGate:
    arity(2, 0, 0, 1);
    expect(tokens(step.in[1]) == 1 && tokens(step.out[0]) == tokens(step.in[0]),
           "expected a [T, 1] gate");
    break;
  case OpKind::MLP: {
    arity(1, 3, 3, 1);
    int64_t h = tokens(step.in[0]);
    const PlanWeight &g = weight(0, 2), &u = weight(1, 2), &d = weight(2, 2);
    expect(g.shape == u.shape && g.shape[1] == h && d.shape[0] == h && d.shape[1] == g.shape[0],
           "gate/up/down shapes do not form an MLP of the input width");
    expect(tokens(step.out[0]) == h, "output width differs from the input's");
    break;
  }
  case OpKind::Router: {
    arity(1, 1, 2, 2);
    const PlanWeight &g = weight(0, 2);
    int64_t experts = g.shape[0];
    expect(tokens(step.in[0]) == g.shape[1], "input width differs from the gate's columns");
    expect(step.routing.topK <= experts, "top_k exceeds the number of experts");
    expect(tokens(step.out[0]) == step.routing.topK &&
               tokens(step.out[1], DType::I32) == step.routing.topK,
           "outputs must be top_k wide");
    expect(experts % step.routing.numGroups == 0, "num_groups does not divide the experts");
    expect(step.routing.topkGroups * (experts / step.routing.numGroups) >= step.routing.topK,
           "kept groups hold fewer than top_k experts");
    if (step.weights.size() == 2)
      expect(weight(1, 1).shape[0] == experts, "correction bias size differs from the experts");
    break;
  }
  case OpKind::Experts: {
    arity(3, 3, 3, 1);
    int64_t h = tokens(step.in[0]), k = tokens(step.in[1]);
    expect(tokens(step.in[2], DType::I32) == k, "weights and experts widths differ");
    const PlanWeight &g = weight(0, 3), &u = weight(1, 3), &d = weight(2, 3);
    expect(g.experts > 0 && u.experts == g.experts && d.experts == g.experts,
           "expected three expert stacks of the same size");
    expect(g.shape == u.shape && g.shape[2] == h && d.shape[1] == h && d.shape[2] == g.shape[1],
           "expert stacks do not form MLPs of the input width");
    expect(k <= g.experts, "more selected experts than experts");
    expect(tokens(step.out[0]) == h, "output width differs from the input's");
    break;
  }
  case OpKind::AllReduce:
    arity(1, 0, 0, 1);
    expect(tokens(step.out[0]) == tokens(step.in[0]), "output width differs from the input's");
    break;
  case OpKind::AllGather:
    arity(1, 0, 0, 1);
    expect(tokens(step.out[0]) == groupSize() * tokens(step.in[0]),
           fmt::format("output width {} is not the group's {} x the input width {}",
                       width(step.out[0]), groupSize(), width(step.in[0])));
    break;
  case OpKind::Send:
    arity(1, 0, 0, 0);
    tokens(step.in[0]);
    expect(program.stage + 1 < plan.degrees.pp,
           fmt::format("a send on stage {}, the last of {}", program.stage, plan.degrees.pp));
    break;
  case OpKind::Recv:
    arity(0, 0, 0, 1);
    tokens(step.out[0]);
    expect(program.stage > 0, "a recv on the first stage");
    break;
  case OpKind::Dispatch: {
    arity(2, 0, 0, 3);
    const cpu::DispatchParams &d = step.dispatch;
    int64_t H = tokens(step.in[0]), k = tokens(step.in[1], DType::I32);
    expect(d.topK == k, fmt::format("top_k {} differs from the experts' width {}", d.topK, k));
    expect(k <= d.numExperts, "top_k exceeds num_experts");
    int64_t c = cpu::stepCapacity(d.capacityFactor, plan.maxBatchTokens, k, d.numExperts,
                                  INT64_MAX);
    expect(d.capacity == c,
           fmt::format("capacity {} is not c(max_batch_tokens) = {} (capacity_factor {})",
                       d.capacity, c, d.capacityFactor));
    expect(width(step.out[0]) == H, "buffer width differs from the input's");
    expect(rows(step.out[0]) == d.numExperts * d.capacity,
           fmt::format("buffer {} has {} rows but num_experts x capacity is {}", step.out[0],
                       rows(step.out[0]), d.numExperts * d.capacity));
    expect(width(step.out[1], DType::I32) == d.numExperts && rows(step.out[1]) >= 1,
           "counts must be 1 row of num_experts");
    expect(tokens(step.out[2], DType::I32) == k, "slots must be top_k wide");
    expect((plan.degrees.tp - 1) / d.rowPartStride < d.rowParts,
           fmt::format("tp {} / row_part_stride {} exceeds the {} row parts", plan.degrees.tp - 1,
                       d.rowPartStride, d.rowParts));
    break;
  }
  case OpKind::AllToAll: {
    arity(2, 0, 0, 2);
    width(step.in[0]);
    int64_t E = experts(step.in[0], step.in[1]);
    expect(E % groupSize() == 0,
           fmt::format("{} experts do not split between the group's {} members", E, groupSize()));
    expect(width(step.out[0]) == width(step.in[0]) && rows(step.out[0]) == rows(step.in[0]),
           "output buffer shape differs from the input's");
    expect(experts(step.out[0], step.out[1]) == E, "output counts width differs from the input's");
    break;
  }
  case OpKind::ExpertFFN: {
    arity(2, 3, 3, 1);
    int64_t H = width(step.in[0]), E = experts(step.in[0], step.in[1]);
    const PlanWeight &g = weight(0, 3), &u = weight(1, 3), &d = weight(2, 3);
    expect(g.experts > 0 && u.experts == g.experts && d.experts == g.experts,
           "expected three expert stacks of the same size");
    expect(g.shape == u.shape && g.shape[2] == H && d.shape[1] == H && d.shape[2] == g.shape[1],
           "expert stacks do not form MLPs of the buffer width");
    expect(E % g.experts == 0,
           fmt::format("{} local experts do not divide the {} experts of counts", g.experts, E));
    expect(width(step.out[0]) == H && rows(step.out[0]) == rows(step.in[0]),
           "output buffer shape differs from the input's");
    break;
  }
  case OpKind::Combine: {
    arity(3, 0, 0, 1);
    int64_t H = width(step.in[0]), k = tokens(step.in[1], DType::I32);
    expect(tokens(step.in[2]) == k, "weights and slots widths differ");
    expect(tokens(step.out[0]) == H, "output width differs from the buffer's");
    break;
  }
  }
}

} // namespace

void checkStep(const Plan &plan, const PlanProgram &program, size_t programIndex,
               size_t stepIndex) {
  StepChecker(plan, program, programIndex, program.steps[stepIndex], stepIndex).check();
}

void checkDataFlow(const PlanProgram &program, const JsonFields &pr) {
  // A step dropped, duplicated or reordered, or two layers on one cache,
  // would otherwise compute another model from stale values: every input
  // must come from the step the compiler says computed it.
  constexpr int64_t kNever = -2, kInput = -1;
  std::vector<int64_t> lastWriter(program.buffers.size(), kNever);
  for (int64_t input : {program.tokensBuffer, program.positionsBuffer})
    if (input >= 0)
      lastWriter[input] = kInput;
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
      if (cacheStep[step.kvCache] >= 0)
        s.fail("attrs.kv_cache", fmt::format("KV cache {} is also step {}'s", step.kvCache,
                                             cacheStep[step.kvCache]));
      cacheStep[step.kvCache] = static_cast<int64_t>(i);
    }
  }
}

void checkWeightBinding(const PlanProgram &program, const JsonFields &pr) {
  // A weight id swapped for another of the same shape passes every shape
  // check; in a plan numbered in binding order it is out of order, bound
  // twice or never bound.
  std::vector<int64_t> firstStep(program.weights.size(), -1);
  size_t next = 0;
  for (size_t i = 0; i < program.steps.size(); ++i) {
    const PlanStep &step = program.steps[i];
    for (int64_t id : step.weights) {
      const PlanWeight &w = program.weights[id];
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
      const PlanStep &first = program.steps[firstStep[id]];
      if (!(first.op == OpKind::Embedding && step.op == OpKind::Linear && step.head))
        pr.element("steps", i).fail(
            "weights", fmt::format("weight {} ('{}') is already bound by step {}; only a tied "
                                   "embedding table is shared (with the LM head)",
                                   id, w.name, firstStep[id]));
    }
  }
  if (next != program.weights.size())
    pr.fail("weights", fmt::format("weight {} ('{}') is bound by no step", next,
                                   program.weights[next].name));
}

} // namespace moert
