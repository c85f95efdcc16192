//===- CudaBackend.cpp - the CUDA target -------------------------*- C++ -*-===//
//
// The pipeline hook lowers each exec program's launches to kernels in the IR
// (moe-cuda-kernels); the serializer writes them as each program's kernel
// table, source and, unless only the sources are asked for, the fatbin nvcc
// makes of them (docs/cuda.md).
//
//===----------------------------------------------------------------------===//
#include "moe/Target/Cuda.h"
#include "moe/Target/TargetBackend.h"
#include "moe/Transforms/Passes.h"

#include "llvm/Support/Path.h"

using namespace moe;

namespace {

class CudaBackend final : public TargetBackend {
public:
  llvm::StringRef name() const override { return "cuda"; }

  llvm::Error checkOptions(const TargetOptions &options) const override {
    return cuda::parseArchs(options.cudaArch).takeError();
  }

  void buildPipeline(mlir::OpPassManager &pm, const TargetOptions &) const override {
    // The kernels, generated from the exec programs, into the IR.
    pm.addPass(createMoECudaKernels());
  }

  llvm::Error serialize(mlir::ModuleOp module, llvm::json::Object &plan,
                        const TargetOptions &options) const override {
    std::vector<cuda::EmittedProgram> kernels;
    for (auto program : module.getOps<exec::ProgramOp>()) {
      llvm::Expected<cuda::EmittedProgram> k = cuda::programKernels(program);
      if (!k)
        return k.takeError();
      kernels.push_back(std::move(*k));
    }
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
    return cuda::emitPlanKernels(plan, std::move(kernels), dir, nvcc, *archs);
  }
};

} // namespace

const TargetBackend &moe::cudaTargetBackend() {
  static const CudaBackend backend;
  return backend;
}
