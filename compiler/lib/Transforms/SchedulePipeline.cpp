//===- SchedulePipeline.cpp - a pipelined update's 1F1B schedule --*- C++ -*-===//
//
// The order in which each stage of a pipelined training plan runs its
// forward and backward programs over the micro-batches of an update
// (docs/training.md, "Pipeline parallelism"): one forward, one backward
// (PipeDream-Flush / Megatron's 1F1B), so that stage s keeps at most
// pp - s micro-batches' activations; and which steps exchange with their
// neighbour at once instead of sending before receiving.
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/Exec/IR/ExecOps.h"
#include "moe/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace moe {
#define GEN_PASS_DEF_MOESCHEDULEPIPELINE
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;
namespace exec = moe::exec;

namespace {

/// The stage a program's leading receives come from (first = true) or its
/// trailing sends go to, or -1 when it has none there.
int64_t peerAtEnd(exec::ProgramOp program, bool first) {
  SmallVector<Operation *> ops;
  for (Operation &op : program.getBody().front())
    if (isa<exec::LaunchOp, exec::CollectiveOp>(op))
      ops.push_back(&op);
  if (ops.empty())
    return -1;
  auto c = dyn_cast<exec::CollectiveOp>(first ? ops.front() : ops.back());
  if (!c || c.getKind() != (first ? "recv" : "send"))
    return -1;
  auto stage = c.getConstants().getAs<IntegerAttr>("stage");
  return stage ? stage.getInt() : -1;
}

struct SchedulePipeline : moe::impl::MoESchedulePipelineBase<SchedulePipeline> {
  using MoESchedulePipelineBase::MoESchedulePipelineBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<exec::ProgramOp> backward, forward, optimizer, others;
    for (auto p : module.getOps<exec::ProgramOp>()) {
      StringRef entry = p.getEntry();
      (entry == "train"           ? backward
       : entry == "train_forward" ? forward
       : entry == "optimizer"     ? optimizer
                                  : others)
          .push_back(p);
    }
    if (forward.empty())
      return;
    const int64_t pp = int64_t(forward.size());
    if (int64_t(backward.size()) != pp || int64_t(optimizer.size()) != pp || !others.empty()) {
      module.emitError("moe-schedule-pipeline: expected a train, train_forward and optimizer "
                       "program per stage, and no other");
      return signalPassFailure();
    }
    auto byStage = [](exec::ProgramOp a, exec::ProgramOp b) {
      return a.getStage() < b.getStage();
    };
    for (auto *list : {&backward, &optimizer, &forward}) {
      llvm::stable_sort(*list, byStage);
      for (auto [s, p] : llvm::enumerate(*list))
        if (p.getStage() != int64_t(s)) {
          p.emitError("moe-schedule-pipeline: expected one program of each stage");
          return signalPassFailure();
        }
    }
    // The plan's order: each entry's programs together, by stage.
    for (auto *list : {&backward, &optimizer, &forward})
      for (exec::ProgramOp p : *list)
        p->moveBefore(module.getBody(), module.getBody()->end());

    auto sharding = module->getAttrOfType<DictionaryAttr>("moe.sharding");
    auto dpAttr = sharding ? sharding.getAs<IntegerAttr>("dp") : IntegerAttr();
    const int64_t dp = dpAttr ? dpAttr.getInt() : 1;
    auto micro = optimizer.front()->getAttrOfType<IntegerAttr>("micro_batches");
    const int64_t m = (micro ? micro.getInt() : 1) / dp;
    if (m < 1) {
      module.emitError("moe-schedule-pipeline: no micro-batch per replica");
      return signalPassFailure();
    }
    Builder b(module.getContext());
    // Each stage's (phase, micro-batch) steps: warm-up forwards, then a
    // forward and a backward at a time, then the remaining backwards.
    using Step = std::pair<bool, int64_t>;
    std::vector<SmallVector<Step>> order(pp);
    for (int64_t s = 0; s < pp; ++s) {
      SmallVector<Step> &steps = order[s];
      const int64_t warmup = std::min(pp - 1 - s, m);
      for (int64_t j = 0; j < warmup; ++j)
        steps.push_back({false, j});
      for (int64_t i = 0; i + warmup < m; ++i) {
        steps.push_back({false, warmup + i});
        steps.push_back({true, i});
      }
      for (int64_t j = m - warmup; j < m; ++j)
        steps.push_back({true, j});
    }
    // Whether stage s runs `first` right before `second`.
    auto adjacent = [&](int64_t s, Step first, Step second) {
      const SmallVector<Step> &steps = order[s];
      for (size_t i = 0; i + 1 < steps.size(); ++i)
        if (steps[i] == first && steps[i + 1] == second)
          return true;
      return false;
    };
    SmallVector<Attribute> stages;
    for (int64_t s = 0; s < pp; ++s) {
      const SmallVector<Step> &steps = order[s];
      SmallVector<Attribute> names;
      for (auto [i, step] : llvm::enumerate(steps)) {
        // Fused where the step before sends to the stage this one receives
        // from, and that stage runs the mirrored pair of steps (the
        // gradients of this step's micro-batch, then the next forward's
        // activations), so that the two exchanges meet.
        bool fused = false;
        if (i > 0 && !unfused) {
          const Step before = steps[i - 1];
          exec::ProgramOp sender = before.first ? backward[s] : forward[s];
          exec::ProgramOp receiver = step.first ? backward[s] : forward[s];
          const int64_t to = peerAtEnd(sender, false), from = peerAtEnd(receiver, true);
          fused = to >= 0 && to == from && before.first != step.first &&
                  adjacent(to, {!before.first, step.second}, {!step.first, before.second});
        }
        names.push_back(b.getStringAttr((fused ? "+" : "") + Twine(step.first ? "B" : "F") +
                                        Twine(step.second)));
      }
      stages.push_back(b.getArrayAttr(names));
    }
    module->setAttr("moe.pipeline_schedule", b.getArrayAttr(stages));
  }
};

} // namespace
