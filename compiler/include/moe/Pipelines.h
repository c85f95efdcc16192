//===- Pipelines.h - the compilation phases, in one place --------*- C++ -*-===//
#ifndef MOE_PIPELINES_H
#define MOE_PIPELINES_H

#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/StringRef.h"

#include <optional>

namespace moe {

/// The phases `moec compile --compile-to=<phase>` can stop after.
enum class Phase { Import, Workload, Partition, Buffers, Plan };
std::optional<Phase> parsePhase(llvm::StringRef name);
/// "import, workload, partition, buffers, plan"
const char *phaseNames();

struct WorkloadOptions {
  int64_t maxBatchTokens = 512;
  int64_t maxSeqLen = 2048;
  int64_t maxSequences = 8;
  /// Partition into per-stage programs (moe-partition): set for multi-rank
  /// layouts and for capacity-limited dispatch.
  bool partition = false;
  double capacityFactor = 0; ///< 0: dropless
  /// Run the fusion passes (moe-fuse-router); `moec compile --no-fuse`
  /// turns them off.
  bool fuse = true;
};

/// Adds the passes that take an imported module to `last` (Import adds none).
void buildPipeline(mlir::OpPassManager &pm, const WorkloadOptions &workload,
                   Phase last);

/// Registers `moe-plan-pipeline` (all phases) for moe-opt.
void registerPipelines();

} // namespace moe

#endif // MOE_PIPELINES_H
