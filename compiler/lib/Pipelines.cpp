//===- Pipelines.cpp - the one place pass pipelines are assembled -*- C++ -*-===//
#include "moe/Pipelines.h"
#include "moe/Transforms/Passes.h"

#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/StringSwitch.h"

using namespace mlir;

std::optional<moe::Phase> moe::parsePhase(llvm::StringRef name) {
  return llvm::StringSwitch<std::optional<Phase>>(name)
      .Case("import", Phase::Import)
      .Case("workload", Phase::Workload)
      .Case("partition", Phase::Partition)
      .Case("buffers", Phase::Buffers)
      .Case("plan", Phase::Plan)
      .Default(std::nullopt);
}

const char *moe::phaseNames() { return "import, workload, partition, buffers, plan"; }

void moe::buildPipeline(OpPassManager &pm, const WorkloadOptions &workload,
                        Phase last) {
  if (last == Phase::Import)
    return;
  // The workload comes first: every size decided later (buffers, caches,
  // dispatch capacity) is a function of it.
  MoESpecializeWorkloadOptions options;
  options.maxBatchTokens = workload.maxBatchTokens;
  options.maxSeqLen = workload.maxSeqLen;
  options.maxSequences = workload.maxSequences;
  pm.addPass(createMoESpecializeWorkload(options));
  // Fusions of the whole model's ops, before partitioning sees them.
  if (workload.fuse)
    pm.addPass(createMoEFuseRouter());
  if (last == Phase::Workload)
    return;
  if (workload.partition) {
    // Per-stage programs with collectives (capacity needs the workload), then
    // the proof that they match: a plan that fails it is never written.
    MoEPartitionOptions partition;
    partition.capacityFactor = workload.capacityFactor;
    pm.addPass(createMoEPartition(partition));
    pm.addPass(createCSEPass());
    pm.addPass(createMoEVerifyCollectives());
  }
  if (last == Phase::Partition)
    return;
  // Dead weights and ops (e.g. a tied head imported twice) go before buffers
  // are assigned, so that no buffer is reserved for them.
  pm.addPass(createCSEPass());
  // Buffers last: they depend on the final op order and on which values are
  // still live, so nothing may reorder or add ops after this pass.
  pm.addPass(createMoEAssignBuffers());
}

void moe::registerPipelines() {
  PassPipelineRegistration<>(
      "moe-plan-pipeline",
      "every pass from an imported module to the plan's IR (default workload)",
      [](OpPassManager &pm) { buildPipeline(pm, WorkloadOptions(), Phase::Plan); });
}
