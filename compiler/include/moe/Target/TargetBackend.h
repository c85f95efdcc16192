//===- TargetBackend.h - what a compilation target provides -----*- C++ -*-===//
//
// A target is what the exec programs are compiled for: a pipeline hook (the
// passes it runs on the exec IR, after moe-lower-to-exec) and a serializer
// (what it adds to each program of the plan: kernel tables, sources,
// binaries). moe-emit-plan and moec find targets by name here; adding one
// (another GPU vendor, a CPU code generator) is a new TargetBackend and one
// line in the registry, not a change to the driver or the plan writer.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_TARGET_TARGETBACKEND_H
#define MOE_TARGET_TARGETBACKEND_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <string>

namespace moe {

/// The options every target sees (moe-emit-plan's, moec compile's).
struct TargetOptions {
  std::string output;            ///< the plan file ("" with kernelsOnly: stdout)
  std::string cudaArch = "sm_80,sm_90";
  bool kernelsOnly = false;      ///< sources only, no device compiler
};

class TargetBackend {
public:
  virtual ~TargetBackend() = default;
  /// The name `--target` takes.
  virtual llvm::StringRef name() const = 0;
  /// Checks the options before anything runs: an error names the option.
  virtual llvm::Error checkOptions(const TargetOptions &options) const;
  /// The passes the target runs on the exec programs, before the plan is
  /// written (none for the targets of today).
  virtual void buildPipeline(mlir::OpPassManager &pm, const TargetOptions &options) const;
  /// Adds the target's part of each program to `plan` (buildPlan's, with
  /// one entry of "programs" per exec.program of `module`, in stage order).
  virtual llvm::Error serialize(mlir::ModuleOp module, llvm::json::Object &plan,
                                const TargetOptions &options) const = 0;
};

/// The target called `name`, or null.
const TargetBackend *lookupTargetBackend(llvm::StringRef name);
/// The names of every target, for messages: "cpu or cuda".
std::string targetBackendNames();

/// The built-in targets (registered by lookupTargetBackend).
const TargetBackend &cpuTargetBackend();
const TargetBackend &cudaTargetBackend();

} // namespace moe

#endif // MOE_TARGET_TARGETBACKEND_H
