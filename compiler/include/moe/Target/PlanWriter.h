//===- PlanWriter.h - serialize a compiled module as a plan ------*- C++ -*-===//
//
// The plan is the only contract between compiler and runtime; its format is
// documented in docs/plan-format.md and versioned by kPlanFormatVersion.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_TARGET_PLANWRITER_H
#define MOE_TARGET_PLANWRITER_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

namespace moe {

constexpr int kPlanFormatVersion = 1;

/// The plan of a module that went through the whole pipeline (workload and
/// buffers assigned). Fails when the module is not in that form.
llvm::Expected<llvm::json::Value> buildPlan(mlir::ModuleOp module);

/// Writes `plan` to `path` atomically: a temporary file beside it, fsync,
/// rename. A failure leaves no file at `path` changed.
llvm::Error writePlanFile(const llvm::json::Value &plan, llvm::StringRef path);

} // namespace moe

#endif // MOE_TARGET_PLANWRITER_H
