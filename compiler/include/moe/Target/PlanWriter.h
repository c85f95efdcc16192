//===- PlanWriter.h - serialize a compiled module as a plan ------*- C++ -*-===//
//
// The plan is the only contract between compiler and runtime; its format is
// documented in docs/plan-format.md and versioned by kPlanFormatVersion.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_TARGET_PLANWRITER_H
#define MOE_TARGET_PLANWRITER_H

#include "moe/Dialect/Exec/IR/ExecOps.h"
#include "moe/PlanSchema.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <string>
#include <utility>
#include <vector>

namespace moe {

constexpr int kPlanFormatVersion = plan::kFormatVersion;

/// The plan of a module that went through the whole pipeline (its
/// moe.workload and exec.program ops, one per stage): each program's
/// declarations and steps as the exec ops have them. Fails when the module
/// is not in that form.
llvm::Expected<llvm::json::Value> buildPlan(mlir::ModuleOp module);

/// One exec.program as the plan's program object (its declarations and
/// steps), as buildPlan writes it; the KV caches sized for the workload.
llvm::Expected<llvm::json::Object> programPlan(exec::ProgramOp program, int64_t maxSeqLen,
                                               int64_t maxSequences);

/// What one rank holds for a single-stage module's exec programs: its
/// weights and KV caches once, every program's buffers, each state buffer
/// once by name, summed by kind (the name before ':': grad_sum, exp_avg,
/// ...). total() is what moert's --report-memory compares with, less the
/// device's scratch: the training memory model of moec compile --recompute
/// auto and --explain.
struct RankProgramMemory {
  int64_t weights = 0, kvCache = 0, buffers = 0;
  /// A pipeline stage's values kept from forward to backward, every slot.
  int64_t kept = 0;
  std::vector<std::pair<std::string, int64_t>> state; ///< by kind, in first-seen order
  int64_t total() const {
    int64_t t = weights + kvCache + buffers + kept;
    for (const auto &kind : state)
      t += kind.second;
    return t;
  }
};
/// (A pipelined training module: the programs of pipeline stage `stage`.)
llvm::Expected<RankProgramMemory> rankProgramMemory(mlir::ModuleOp module, int64_t stage = 0);
/// The slots of a pipeline stage's kept values: the most micro-batches its
/// moe.pipeline_schedule holds between their forward and backward (1
/// without a schedule).
int64_t stashSlots(mlir::ModuleOp module, int64_t stage);

/// A plain attribute (exec::isPlainConstant) as JSON: integers, floats,
/// strings, booleans (unit: true), arrays and dictionaries.
llvm::json::Value attributeJson(mlir::Attribute a);

/// The model's logical weights (whole shapes), as the plan's top-level
/// `weights`: the `moe.logical_weights` that moe-partition or
/// moe-lower-to-exec kept when they replaced @forward.
llvm::json::Array logicalWeights(mlir::ModuleOp module);

/// Puts a distribution (Distribution.h) into a plan: world_size, degrees,
/// vocab and stages at the top; with one rank, its coords/memory/weights join
/// the runnable program of ranks[0]; with more, `ranks` is the distribution's
/// (their partitioned programs come with partitioned execution).
void mergeDistribution(llvm::json::Object &plan, llvm::json::Object distribution);

/// Writes `plan` to `path` atomically: a temporary file beside it, fsync,
/// rename. A failure leaves no file at `path` changed.
llvm::Error writePlanFile(const llvm::json::Value &plan, llvm::StringRef path);
/// Writes `text` to `path` atomically: a temporary file beside it, fsync,
/// rename; on failure nothing is left behind ("PATH: cannot write WHAT: ...").
llvm::Error writeFileAtomically(llvm::StringRef path, llvm::StringRef text, llvm::StringRef what);

/// The same for a plan whose last attributes are streamed by `more` (inside
/// the top-level object): used for many-rank distributions. Written compact.
llvm::Error writePlanFile(const llvm::json::Object &plan, llvm::StringRef path,
                          llvm::function_ref<void(llvm::json::OStream &)> more);

} // namespace moe

#endif // MOE_TARGET_PLANWRITER_H
