// cuBLAS with the kernel table's row-major operands (docs/cuda.md, "The
// kernel table": GEMM): the one place that turns a row-major C = op(A)
// op(B) into cuBLAS' column-major call, for the device's plain, grouped and
// per-block expert GEMMs.
#pragma once

#include "CudaApi.h"

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

} // namespace moert::cuda
