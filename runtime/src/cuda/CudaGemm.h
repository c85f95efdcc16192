// cuBLAS with the kernel table's row-major operands (docs/cuda.md, "The
// kernel table": GEMM): the one place that turns a row-major C = op(A)
// op(B) into cuBLAS' column-major call, for the device's plain, grouped and
// per-block expert GEMMs.
#pragma once

#include "CudaApi.h"

#include <optional>

namespace moert::cuda {

/// C[m, n] (+)= op(A)[m, k] op(B)[k, n], every operand row-major: A stored
/// [m, k] (row stride lda) or, with transposeA, [k, m]; B stored [n, k]
/// with transposeB (a weight [out, in]) or [k, n]; C f32, f32 compute.
struct RowMajorGemm {
  int m = 0, n = 0, k = 0;
  const void *a = nullptr;
  cudaDataType aType = CUDA_R_32F;
  int lda = 0;
  bool transposeA = false;
  const void *b = nullptr;
  cudaDataType bType = CUDA_R_32F;
  int ldb = 0;
  bool transposeB = true;
  void *c = nullptr;
  int ldc = 0;
  bool accumulate = false; ///< C += (cuBLAS beta 1)
};

/// Runs `g` on `stream` (blas is bound to it): cublasGemmEx on C^T = op(B)^T
/// op(A)^T. An empty sum (k = 0) sets the m rows of C to 0 (leaves them,
/// accumulating); m = 0 does nothing. `what` names the call in errors.
void gemm(const Api &api, cublasHandle_t blas, CUstream stream, const RowMajorGemm &g,
          const char *what);

/// One FP8 block-scaled problem for cuBLASLt (sm_90): C[r, n] (+)= A W^T,
/// row-major, with W [n, k] e4m3 (scales per 128 x 128 block:
/// BLK128x128_32F, the column blocks' row stride rounded up to 4) and A
/// [r, k] e4m3 (scales per 1 x 128: VEC128_32F, [k / 128][r]), f32 C with
/// row stride ldc. As cuBLASLt sees it (column-major): D = op(W) A^T, W
/// transposed ("TN", the one FP8 form). Owns its descriptors.
struct LtFp8Problem {
  LtFp8Problem(const LtApi &lt, int r, int n, int k, int ldc, const void *weightScales,
               const void *rowScales);
  ~LtFp8Problem();
  LtFp8Problem(const LtFp8Problem &) = delete;
  LtFp8Problem &operator=(const LtFp8Problem &) = delete;

  /// cuBLASLt's best algorithm for the problem within `workspace` bytes,
  /// or none.
  std::optional<cublasLtMatmulAlgo_t> algorithm(cublasLtHandle_t handle, uint64_t workspace);

  /// Runs it on `stream` with `algo`.
  void run(cublasLtHandle_t handle, const void *weight, const void *rows, void *c,
           bool accumulate, const cublasLtMatmulAlgo_t &algo, CUdeviceptr workspace,
           uint64_t workspaceBytes, CUstream stream);

  const LtApi &lt;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t w = nullptr, a = nullptr, c = nullptr;
};

} // namespace moert::cuda
