// The collectives between ranks: all_reduce, all_gather and all_to_all over
// a group (a mesh axis), and the pipeline's send / recv. What they move and
// how is written once for every device (runtime/src/Collectives.h); here
// are their names and checks.
#include "Ops.h"

#include <algorithm>

namespace moert::ops {
namespace {

/// Over the step's rows, or in place over a whole compensated sum (two
/// buffers: the replicas' gradient sums and their errors, of an optimizer
/// program, or ZeRO-2's sums of squares) or state buffer (its expert
/// loads).
void checkAllReduce(const StepChecker &c, const PlanStep &step) {
  if (step.in.size() == 2) {
    c.arity(2, 0, 0, 2);
    const PlanBuffer &sum = c.program.buffers[step.in[0]], &err = c.program.buffers[step.in[1]];
    c.expect(step.out[0] == step.in[0] && step.out[1] == step.in[1] &&
                 sum.state.empty() == err.state.empty() && sum.dtype == DType::F32 &&
                 err.dtype == DType::F32 && sum.rows * sum.width == err.rows * err.width &&
                 (!sum.state.empty() || c.program.entry == "optimizer"),
             "an all_reduce of two buffers adds a compensated sum: two f32 buffers of as many "
             "values (state buffers, or an optimizer program's), in place");
    return;
  }
  c.arity(1, 0, 0, 1);
  if (!c.program.buffers[step.in[0]].state.empty() && !c.program.buffers[step.in[0]].kept()) {
    c.width(step.in[0]);
    c.expect(step.out[0] == step.in[0], "an all_reduce of a state buffer is in place");
    return;
  }
  if (step.elements > 0) { // a weight gradient the group computed in parts
    for (int64_t b : {step.in[0], step.out[0]})
      c.expect(c.rows(b) * c.width(b) == step.elements,
               fmt::format("buffer {} does not hold the {} elements", b, step.elements));
    return;
  }
  c.expect(c.tokens(step.out[0]) == c.tokens(step.in[0]), "output width differs from the input's");
}

/// elements: a static buffer's values (a training program's weight gradient
/// the ranks of a TP group computed in parts), not the step's rows.
void parseAllReduce(const JsonFields &a, PlanStep &step) {
  if (a.has("elements"))
    step.elements = a.bounded("elements", 1, int64_t(1) << 40);
}

/// shard_rows: of a weight's all_gather, each member's updated rows (ZeRO:
/// rows [d k, (d + 1) k) of its state view); of a reduce_scatter, each
/// member's shard.
void parseAllGather(const JsonFields &a, PlanStep &step) {
  if (a.has("shard_rows"))
    step.shardRows = a.bounded("shard_rows", 1, int64_t(1) << 40);
}

void parseReduceScatter(const JsonFields &a, PlanStep &step) {
  parseAllGather(a, step);
  step.gradientError = a.has("gradient_error") && a.boolean("gradient_error");
}

void checkAllGather(const StepChecker &c, const PlanStep &step) {
  if (!step.weights.empty()) {
    c.arity(0, 1, 1, 0);
    const PlanWeight &w = c.program.weights[step.weights[0]];
    int64_t elements = 1;
    for (int64_t d : w.shape)
      elements *= d;
    const int64_t rows = elements / w.shape.back(), n = c.groupSize();
    const bool overEdp = step.group.mesh == CollectiveGroup::Mesh::Experts &&
                         step.group.axis == CollectiveGroup::Axis::EDP && w.experts > 0;
    c.expect(c.program.entry == "optimizer" &&
                 (step.group.axis == CollectiveGroup::Axis::DP || overEdp),
             "an all_gather of a weight is an optimizer program's, over dp (an expert "
             "stack's: over edp)");
    c.expect(step.shardRows > 0 && step.shardRows * n >= rows && (step.shardRows - 1) * n < rows,
             fmt::format("shard_rows {}: expected ceil({} / {}), the rows of '{}' each member "
                         "updated",
                         step.shardRows, rows, n, w.name));
    c.expect(w.dtype == DType::F32 || w.dtype == DType::BF16,
             fmt::format("'{}' is {}: the optimizer updates f32 and bf16 weights", w.name,
                         dtypeName(w.dtype)));
    return;
  }
  c.expect(step.shardRows == 0, "shard_rows: only an all_gather of a weight has it");
  c.arity(1, 0, 0, 1);
  c.expect(c.tokens(step.out[0]) == c.groupSize() * c.tokens(step.in[0]),
           fmt::format("output width {} is not the group's {} x the input width {}",
                       c.width(step.out[0]), c.groupSize(), c.width(step.in[0])));
}

/// in: a gradient, its sum's shard (and the shard's error); out: the shard
/// (and its error), in place: rows [d k, (d + 1) k) of every member's
/// gradient added into member d's shard (ZeRO-2, over dp). With
/// `gradient_error`, the gradient's error (a compensated sum of its own:
/// expert_ffn_grad's) follows it in.
///
/// Or (ZeRO-1, an optimizer program) in place over a whole sum (and its
/// error): member d's rows [d k, (d + 1) k) become the members' total, its
/// other rows keep its own values.
void checkReduceScatter(const StepChecker &c, const PlanStep &step) {
  if (step.in.size() == step.out.size()) {
    c.arity(step.in.size(), 0, 0, step.in.size());
    const PlanBuffer &sum = c.program.buffers[step.in[0]];
    const int64_t n = c.groupSize();
    c.expect(c.program.entry == "optimizer" &&
                 (step.group.axis == CollectiveGroup::Axis::DP ||
                  step.group.axis == CollectiveGroup::Axis::EDP) &&
                 (step.in.size() == 1 || step.in.size() == 2) && step.out == step.in,
             "an in-place reduce_scatter is an optimizer program's, over dp or edp, of a sum "
             "(and its error)");
    for (int64_t id : step.in) {
      const PlanBuffer &b = c.program.buffers[id];
      c.expect(!b.state.empty() && b.logicalRows == 0 && b.dtype == DType::F32 &&
                   b.rows == sum.rows && b.width == sum.width,
               "expected whole f32 state buffers of one shape (a sum and its error)");
    }
    c.expect(step.shardRows > 0 && step.shardRows * n >= sum.rows &&
                 (step.shardRows - 1) * n < sum.rows,
             fmt::format("shard_rows {}: expected ceil({} / {})", step.shardRows, sum.rows, n));
    return;
  }
  c.expect(!step.gradientError || step.in.size() == step.out.size() + 2,
           "gradient_error: expected the gradient, its error, then the shard (and its error)");
  const bool withError = step.gradientError; // the gradient's error after it
  const size_t at = withError ? 2 : 1;         // the shard's input
  const bool compensated = step.in.size() == at + 2;
  c.arity(at + (compensated ? 2 : 1), 0, 0, compensated ? 2 : 1);
  const PlanBuffer &g = c.program.buffers[step.in[0]], &sum = c.program.buffers[step.in[at]];
  if (withError) {
    const PlanBuffer &e = c.program.buffers[step.in[1]];
    c.expect(e.dtype == DType::F32 && e.rows == g.rows && e.width == g.width && e.state.empty(),
             "expected the gradient's error after it (a buffer of its shape)");
  }
  c.expect(step.group.axis == (sum.shardOverEdp ? CollectiveGroup::Axis::EDP
                                                  : CollectiveGroup::Axis::DP),
           fmt::format("a reduce_scatter into a shard is over its group ({})",
                       sum.shardOverEdp ? "edp" : "dp"));
  c.expect(step.in[at] == step.out[0] && !sum.state.empty() && sum.logicalRows > 0 &&
               g.dtype == DType::F32 && g.rows * g.width == sum.logicalRows * sum.width &&
               step.shardRows == sum.rows,
           "expected a gradient and its sum's shard (a state of logical_rows x width of the "
           "gradient's values, shard_rows rows), in and out");
  if (compensated) {
    const PlanBuffer &err = c.program.buffers[step.in[at + 1]];
    c.expect(step.in[at + 1] == step.out[1] && !err.state.empty() && err.rows == sum.rows &&
                 err.width == sum.width && err.logicalRows == sum.logicalRows,
             "expected the shard's error after it (a state shard of its shape, in and out)");
  }
}

void checkAllToAll(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 0, 0, 2);
  c.width(step.in[0]);
  int64_t E = c.experts(step.in[0], step.in[1]);
  c.expect(E % c.groupSize() == 0, fmt::format("{} experts do not split between the group's {} "
                                               "members", E, c.groupSize()));
  c.expect(c.width(step.out[0]) == c.width(step.in[0]) &&
               c.rows(step.out[0]) == c.rows(step.in[0]),
           "output buffer shape differs from the input's");
  c.expect(c.experts(step.out[0], step.out[1]) == E,
           "output counts width differs from the input's");
}

/// stage: the other stage of a send or recv (a pipelined training
/// program's backward sends to the stage before and receives from the one
/// after); absent, the next stage of a send, the one before of a recv.
void parseSend(const JsonFields &a, PlanStep &step) {
  step.peerStage = a.has("stage") ? a.integer("stage", 0) : -1;
}

/// A value crossing a stage cut: the batch's rows of an activation, or
/// all rows of a fixed-size value (a layer's router statistics, which the
/// load-balancing loss of the last stage reads).
void checkPeer(const StepChecker &c, const PlanStep &step, bool sending) {
  const int64_t own = c.program.stage, pp = c.plan.degrees.pp;
  const int64_t peer = peerStage(step, own);
  // (An optimizer program's exchange of a table tied over the first and
  // the last stage.)
  const bool ends = c.program.entry == "optimizer" && std::min(own, peer) == 0 &&
                    std::max(own, peer) == pp - 1;
  c.expect(peer >= 0 && peer < pp && (peer == own + 1 || peer == own - 1 || ends),
           fmt::format("a {} on stage {} of {} with stage {}: expected a neighbouring stage",
                       sending ? "send" : "recv", own, pp, peer));
}

void checkSend(const StepChecker &c, const PlanStep &step) {
  c.arity(1, 0, 0, 0);
  checkPeer(c, step, true);
}

void checkRecv(const StepChecker &c, const PlanStep &step) {
  c.arity(0, 0, 0, 1);
  checkPeer(c, step, false);
}

constexpr unsigned kGroup = OpDef::InGroup | OpDef::RunsEmpty;

} // namespace

const OpDef kAllReduce = {"all_reduce", Collective::AllReduce, kGroup, parseAllReduce,
                          checkAllReduce, nullptr};
const OpDef kAllGather = {"all_gather", Collective::AllGather, kGroup, parseAllGather,
                          checkAllGather, nullptr};
const OpDef kAllToAll = {"all_to_all", Collective::AllToAll, kGroup, nullptr, checkAllToAll,
                         nullptr};
const OpDef kReduceScatter = {"reduce_scatter", Collective::ReduceScatter, kGroup, parseReduceScatter,
                              checkReduceScatter, nullptr};
const OpDef kSend = {"send", Collective::Send, OpDef::RunsEmpty, parseSend, checkSend, nullptr};
const OpDef kRecv = {"recv", Collective::Recv, OpDef::RunsEmpty, parseSend, checkRecv, nullptr};

} // namespace moert::ops
