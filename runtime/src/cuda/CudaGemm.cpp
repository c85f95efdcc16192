// Row-major GEMMs through cuBLAS (CudaGemm.h).
#include "CudaGemm.h"

namespace moert::cuda {

void gemm(const Api &api, cublasHandle_t blas, CUstream stream, const RowMajorGemm &g,
          const char *what) {
  if (g.m <= 0)
    return;
  if (g.k <= 0) {
    if (!g.accumulate)
      for (int r = 0; r < g.m; ++r)
        check(api.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(g.c) +
                                      static_cast<CUdeviceptr>(r) * g.ldc * 4,
                                  0, static_cast<size_t>(g.n) * 4, stream),
              what);
    return;
  }
  // A row-major [r, c] matrix is cuBLAS' column-major [c, r], its
  // transpose: C^T = op(B)^T op(A)^T takes B stored [n, k] as OP_T (its
  // column-major view is op(B)) and stored [k, n] as OP_N; A likewise.
  const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
  check(api.cublasGemmEx(blas, g.transposeB ? CUBLAS_OP_T : CUBLAS_OP_N,
                         g.transposeA ? CUBLAS_OP_T : CUBLAS_OP_N, g.n, g.m, g.k, &alpha, g.b,
                         g.bType, g.ldb, g.a, g.aType, g.lda, &beta, g.c, CUDA_R_32F, g.ldc,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        what);
}

} // namespace moert::cuda
