//===- CudaBackend.cpp - the CUDA target -------------------------*- C++ -*-===//
//
// Each program's kernels (Emitter, Cuda.h) as its kernel table, source and,
// unless only the sources are asked for, the fatbin nvcc makes of them
// (docs/cuda.md).
//
//===----------------------------------------------------------------------===//
#include "moe/Target/Cuda.h"
#include "moe/Target/TargetBackend.h"

#include "llvm/Support/Path.h"

using namespace moe;

namespace {

class CudaBackend final : public TargetBackend {
public:
  llvm::StringRef name() const override { return "cuda"; }

  llvm::Error checkOptions(const TargetOptions &options) const override {
    return cuda::parseArchs(options.cudaArch).takeError();
  }

  bool writesPlan(const TargetOptions &options) const override {
    // --compile-to=kernels without -o: the sources went to standard output.
    return !options.output.empty();
  }

  llvm::Error serialize(mlir::ModuleOp, llvm::json::Object &plan,
                        const TargetOptions &options) const override {
    llvm::Expected<std::vector<std::string>> archs = cuda::parseArchs(options.cudaArch);
    if (!archs)
      return archs.takeError();
    std::string nvcc, dir;
    if (options.kernelsOnly) {
      dir = llvm::sys::path::parent_path(options.output).str();
      if (dir.empty() && !options.output.empty())
        dir = ".";
    } else {
      nvcc = cuda::findNvcc();
      if (nvcc.empty())
        return llvm::createStringError(
            llvm::inconvertibleErrorCode(),
            "--target cuda: nvcc not found (set MOE_NVCC, or install the CUDA toolkit at "
            "/usr/local/cuda; --compile-to=kernels writes the sources without nvcc)");
    }
    return cuda::emitPlanKernels(plan, dir, nvcc, *archs);
  }
};

} // namespace

const TargetBackend &moe::cudaTargetBackend() {
  static const CudaBackend backend;
  return backend;
}
