//===- Cuda.h - the CUDA target: kernel emitter and nvcc driver -*- C++ -*-===//
//
// From an exec.program (its buffers, weights, KV caches and launches by
// kernel id with their constants), emits one CUDA C++ source with an
// `extern "C" __global__` kernel per non-GEMM piece of each step, specialised
// to the program's constants, and a kernel table (the program's "cuda"
// object) that says, per step, which kernels to launch with which geometry
// and parameters, and which GEMMs the driver runs through cuBLAS.
// docs/cuda.md describes the table.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "moe/Dialect/Exec/IR/ExecOps.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <string>
#include <vector>

namespace moe::cuda {

/// What the kernel templates need to know about a GPU target: the seam
/// between the kernels (written against MOE_WARP_SIZE and MOE_SHFL_XOR) and
/// a vendor's spelling. Another GPU target is another GpuTargetInfo (with a
/// warp size of 32 or more: the kernels' per-warp shared arrays hold 32).
struct GpuTargetInfo {
  std::string name;             ///< the target ("cuda")
  int64_t warpSize = 32;        ///< lanes per warp (wavefront)
  std::string shuffleXor;       ///< MOE_SHFL_XOR(v, o)'s expansion
  std::string kernelQualifiers; ///< before `void` of a kernel
  std::string launchBounds;     ///< after `void`, @N@ the block size ("" if none)
};
/// NVIDIA's: warps of 32, __shfl_xor_sync, __launch_bounds__.
const GpuTargetInfo &cudaTargetInfo();

/// One program's emitted kernels.
struct EmittedProgram {
  std::string source;        ///< the .cu text
  llvm::json::Object table;  ///< the kernel table (without "source"/"fatbin")
  std::vector<std::string> kernels; ///< every __global__ kernel, in order
};

/// The workload the kernels are specialised to (the module's moe.workload).
struct Workload {
  int64_t maxBatchTokens = 0; ///< rows of the per-token buffers and scratch
  int64_t maxSeqLen = 0;      ///< positions of the KV caches and RoPE tables
};

/// Emits the kernels of `program` for `target`; an error names the step
/// (index and kernel id) that has no lowering, or whose operands or
/// constants are not what its lowering reads.
llvm::Expected<EmittedProgram> emitProgram(moe::exec::ProgramOp program,
                                           const Workload &workload,
                                           const GpuTargetInfo &target = cudaTargetInfo());

/// A program's kernels as moe-cuda-kernels put them into its IR (its
/// exec.kernels and the kernels regions of its launches): the source, the
/// kernel names and the table (without "source"/"fatbin"). An error names
/// the program when it was not lowered.
llvm::Expected<EmittedProgram> programKernels(moe::exec::ProgramOp program);

/// --target cuda: puts every program's kernels (`programs`, in the order of
/// the plan's) into `root` (a plan from buildPlan; each program's "cuda"
/// object, docs/cuda.md): the table, the CUDA C++ source ("code"), and
/// unless `nvcc` is empty the fatbin nvcc makes of it (base64) and ptxas'
/// report, so that the plan is one file (one `mv` moves all of it). With
/// `dir` (--compile-to=kernels -o DIR) each source is also written there as
/// stage<i>.cu; with neither dir nor nvcc the sources go to standard output.
llvm::Error emitPlanKernels(llvm::json::Object &root, std::vector<EmittedProgram> programs,
                            llvm::StringRef dir, llvm::StringRef nvcc,
                            const std::vector<std::string> &archs);

/// "sm_80,sm_90" as a list; an error naming --cuda-arch for anything but
/// sm_XY (70 or later).
llvm::Expected<std::vector<std::string>> parseArchs(llvm::StringRef list);

/// The nvcc to use: $MOE_NVCC, else the CMake-configured CUDA compiler, else
/// /usr/local/cuda/bin/nvcc, else `nvcc` on PATH; empty when none exists.
std::string findNvcc();

/// Compiles `source` (a file) into `fatbin` with SASS for each arch of
/// `archs` ("sm_80", "sm_90") plus PTX, with `-Xptxas -v`; fails naming the
/// kernel when any kernel spills or has a local-memory stack frame.
/// `ptxasLog` receives ptxas' output.
llvm::Error compileFatbin(llvm::StringRef nvcc, llvm::StringRef source, llvm::StringRef fatbin,
                          const std::vector<std::string> &archs, std::string &ptxasLog);

/// Checks ptxas -v output: an error naming the first kernel (and arch) with
/// spill stores/loads or a stack frame above 0 bytes.
llvm::Error checkPtxasLog(llvm::StringRef log);

} // namespace moe::cuda
