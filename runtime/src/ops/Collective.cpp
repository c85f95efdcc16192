// The collectives between ranks: all_reduce, all_gather and all_to_all over
// a group (a mesh axis), and the pipeline's send / recv. What they move and
// how is written once for every device (runtime/src/Collectives.h); here
// are their names and checks.
#include "Ops.h"

namespace moert::ops {
namespace {

/// Over the step's rows, or in place over a whole compensated sum (two
/// state buffers: the replicas' gradient sums and their errors, of an
/// optimizer program) or state buffer (its expert loads).
void checkAllReduce(const StepChecker &c, const PlanStep &step) {
  if (step.in.size() == 2) {
    c.arity(2, 0, 0, 2);
    const PlanBuffer &sum = c.program.buffers[step.in[0]], &err = c.program.buffers[step.in[1]];
    c.expect(step.out[0] == step.in[0] && step.out[1] == step.in[1] && !sum.state.empty() &&
                 !err.state.empty() && sum.dtype == DType::F32 && err.dtype == DType::F32 &&
                 sum.rows * sum.width == err.rows * err.width,
             "an all_reduce of two buffers adds a compensated sum: two f32 state buffers of as "
             "many values, in place");
    return;
  }
  c.arity(1, 0, 0, 1);
  if (!c.program.buffers[step.in[0]].state.empty()) {
    c.width(step.in[0]);
    c.expect(step.out[0] == step.in[0], "an all_reduce of a state buffer is in place");
    return;
  }
  c.expect(c.tokens(step.out[0]) == c.tokens(step.in[0]), "output width differs from the input's");
}

void checkAllGather(const StepChecker &c, const PlanStep &step) {
  c.arity(1, 0, 0, 1);
  c.expect(c.tokens(step.out[0]) == c.groupSize() * c.tokens(step.in[0]),
           fmt::format("output width {} is not the group's {} x the input width {}",
                       c.width(step.out[0]), c.groupSize(), c.width(step.in[0])));
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

void checkSend(const StepChecker &c, const PlanStep &step) {
  c.arity(1, 0, 0, 0);
  c.tokens(step.in[0]);
  c.expect(c.program.stage + 1 < c.plan.degrees.pp,
           fmt::format("a send on stage {}, the last of {}", c.program.stage, c.plan.degrees.pp));
}

void checkRecv(const StepChecker &c, const PlanStep &step) {
  c.arity(0, 0, 0, 1);
  c.tokens(step.out[0]);
  c.expect(c.program.stage > 0, "a recv on the first stage");
}

constexpr unsigned kGroup = OpDef::InGroup | OpDef::RunsEmpty;

} // namespace

const OpDef kAllReduce = {"all_reduce", Collective::AllReduce, kGroup, nullptr, checkAllReduce,
                          nullptr};
const OpDef kAllGather = {"all_gather", Collective::AllGather, kGroup, nullptr, checkAllGather,
                          nullptr};
const OpDef kAllToAll = {"all_to_all", Collective::AllToAll, kGroup, nullptr, checkAllToAll,
                         nullptr};
const OpDef kSend = {"send", Collective::Send, OpDef::RunsEmpty, nullptr, checkSend, nullptr};
const OpDef kRecv = {"recv", Collective::Recv, OpDef::RunsEmpty, nullptr, checkRecv, nullptr};

} // namespace moert::ops
