//===- TargetBackend.cpp - the registry of targets, and the CPU's -*- C++ -*-===//
#include "moe/Target/TargetBackend.h"

#include "llvm/ADT/STLExtras.h"

using namespace moe;

llvm::Error TargetBackend::checkOptions(const TargetOptions &) const {
  return llvm::Error::success();
}

void TargetBackend::buildPipeline(mlir::OpPassManager &, const TargetOptions &) const {}

namespace {

/// The CPU: the runtime's kernels are its registry's, found by the kernel
/// id of each step; the plan needs nothing more.
class CpuBackend final : public TargetBackend {
public:
  llvm::StringRef name() const override { return "cpu"; }
  llvm::Error checkOptions(const TargetOptions &options) const override {
    if (options.kernelsOnly)
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "kernels-only needs target=cuda");
    return llvm::Error::success();
  }
  llvm::Error serialize(mlir::ModuleOp, llvm::json::Object &,
                        const TargetOptions &) const override {
    return llvm::Error::success();
  }
};

const TargetBackend *const kTargets[] = {&cpuTargetBackend(), &cudaTargetBackend()};

} // namespace

const TargetBackend &moe::cpuTargetBackend() {
  static const CpuBackend backend;
  return backend;
}

const TargetBackend *moe::lookupTargetBackend(llvm::StringRef name) {
  for (const TargetBackend *t : kTargets)
    if (t->name() == name)
      return t;
  return nullptr;
}

std::string moe::targetBackendNames() {
  std::string names;
  for (auto [i, t] : llvm::enumerate(kTargets)) {
    if (i)
      names += i + 1 == std::size(kTargets) ? " or " : ", ";
    names += t->name().str();
  }
  return names;
}
