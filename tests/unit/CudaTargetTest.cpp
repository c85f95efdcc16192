// The CUDA target's seam to the GPU vendor (GpuTargetInfo): the kernels are
// written against MOE_WARP_SIZE and MOE_SHFL_XOR, so a target with another
// warp size, shuffle and launch-bounds spelling changes only the target
// info, never a kernel template.
#include "TinyModel.h"
#include "moe/Pipelines.h"
#include "moe/Target/Cuda.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "gtest/gtest.h"

namespace {


/// Every program of a small Mixtral-like model at the exec level, emitted
/// for `target`.
std::vector<moe::cuda::EmittedProgram> emitAll(const moe::cuda::GpuTargetInfo &target) {
  std::unique_ptr<mlir::MLIRContext> owned = moe::test::makeContext();
  mlir::MLIRContext &context = *owned;
  mlir::OwningOpRef<mlir::ModuleOp> module = moe::test::importTinyMixtral(context);
  moe::CompileOptions options;
  options.maxSeqLen = 128;
  mlir::PassManager pm(&context);
  moe::buildPipeline(pm, options, moe::Phase::Exec);
  EXPECT_TRUE(mlir::succeeded(pm.run(*module)));
  std::vector<moe::cuda::EmittedProgram> out;
  for (auto program : (*module).getOps<moe::exec::ProgramOp>()) {
    auto emitted = moe::cuda::emitProgram(program, {options.maxBatchTokens, options.maxSeqLen},
                                          target);
    EXPECT_TRUE(static_cast<bool>(emitted)) << llvm::toString(emitted.takeError());
    out.push_back(std::move(*emitted));
  }
  return out;
}

/// Every launch's block size in a program's table.
std::vector<int64_t> blocks(const moe::cuda::EmittedProgram &p) {
  std::vector<int64_t> out;
  for (const llvm::json::Value &step : *p.table.getArray("steps"))
    for (const llvm::json::Value &launch : *step.getAsObject()->getArray("launches"))
      if (auto block = launch.getAsObject()->getInteger("block"))
        out.push_back(*block);
  return out;
}

TEST(CudaTarget, TheVendorSpellingComesFromTheTargetInfo) {
  std::vector<moe::cuda::EmittedProgram> cuda = emitAll(moe::cuda::cudaTargetInfo());
  ASSERT_EQ(cuda.size(), 1u);
  const std::string &source = cuda[0].source;
  EXPECT_NE(source.find("#define MOE_WARP_SIZE 32\n"), std::string::npos);
  EXPECT_NE(source.find("#define MOE_SHFL_XOR(v, o) __shfl_xor_sync(0xffffffffu, v, o)\n"),
            std::string::npos);
  EXPECT_NE(source.find("extern \"C\" __global__ void __launch_bounds__(256) moe_pack_bf16("),
            std::string::npos);
  EXPECT_NE(source.find("extern \"C\" __global__ void __launch_bounds__(256) moe_dequant_fp8("),
            std::string::npos);
  EXPECT_NE(source.find("extern \"C\" __global__ void __launch_bounds__(256) moe_gemv_fp8("),
            std::string::npos);
  // One warp per 128-element group.
  EXPECT_NE(source.find("extern \"C\" __global__ void __launch_bounds__(32) moe_quant_fp8("),
            std::string::npos);

  // A made-up vendor: 64-lane wavefronts, its own shuffle, no launch bounds.
  moe::cuda::GpuTargetInfo wide{"wide", 64, "__wide_shfl_xor(v, o, 64)",
                                "extern \"C\" __kernel__", ""};
  std::vector<moe::cuda::EmittedProgram> other = emitAll(wide);
  ASSERT_EQ(other.size(), 1u);
  const std::string &text = other[0].source;
  EXPECT_NE(text.find("--target wide"), std::string::npos);
  EXPECT_NE(text.find("#define MOE_WARP_SIZE 64\n"), std::string::npos);
  EXPECT_NE(text.find("#define MOE_SHFL_XOR(v, o) __wide_shfl_xor(v, o, 64)\n"),
            std::string::npos);
  // No CUDA spelling and no 32-lane assumption is left in any kernel.
  for (const char *cudaOnly : {"__shfl", "__launch_bounds__", "__global__", "& 31", ">> 5"})
    EXPECT_EQ(text.find(cudaOnly), std::string::npos) << cudaOnly;
  EXPECT_NE(text.find("extern \"C\" __kernel__ void moe_s0_embedding("), std::string::npos);
  // The same kernels, in the same order; every block a whole number of
  // wavefronts.
  EXPECT_EQ(other[0].kernels, cuda[0].kernels);
  for (int64_t block : blocks(other[0]))
    EXPECT_EQ(block % 64, 0) << block;
  EXPECT_FALSE(blocks(other[0]).empty());
}

} // namespace
