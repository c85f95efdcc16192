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

LtFp8Problem::LtFp8Problem(const LtApi &lt, int r, int n, int k, int ldc,
                           const void *weightScales, const void *rowScales)
    : lt(lt) {
  check(lt.cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
        "cublasLtMatmulDescCreate");
  const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N,
                ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void *value, size_t size) {
    check(lt.cublasLtMatmulDescSetAttribute(desc, attr, value, size),
          "cublasLtMatmulDescSetAttribute");
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  set(CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof(ma));
  set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof(mb));
  set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &weightScales, sizeof(weightScales));
  set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &rowScales, sizeof(rowScales));
  check(lt.cublasLtMatrixLayoutCreate(&w, CUDA_R_8F_E4M3, k, n, k), "cublasLtMatrixLayoutCreate");
  check(lt.cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, k, r, k), "cublasLtMatrixLayoutCreate");
  check(lt.cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, n, r, ldc), "cublasLtMatrixLayoutCreate");
}

LtFp8Problem::~LtFp8Problem() {
  for (cublasLtMatrixLayout_t l : {c, a, w})
    if (l)
      lt.cublasLtMatrixLayoutDestroy(l);
  if (desc)
    lt.cublasLtMatmulDescDestroy(desc);
}

std::optional<cublasLtMatmulAlgo_t> LtFp8Problem::algorithm(cublasLtHandle_t handle,
                                                            uint64_t workspace) {
  cublasLtMatmulPreference_t pref = nullptr;
  check(lt.cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  check(lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &workspace, sizeof(workspace)),
        "cublasLtMatmulPreferenceSetAttribute");
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  // No algorithm is an answer (NOT_SUPPORTED), not an error.
  const cublasStatus_t s =
      lt.cublasLtMatmulAlgoGetHeuristic(handle, desc, w, a, c, c, pref, 1, &result, &returned);
  lt.cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || returned < 1)
    return std::nullopt;
  return result.algo;
}

void LtFp8Problem::run(cublasLtHandle_t handle, const void *weight, const void *rows, void *out,
                       bool accumulate, const cublasLtMatmulAlgo_t &algo, CUdeviceptr workspace,
                       uint64_t workspaceBytes, CUstream stream) {
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check(lt.cublasLtMatmul(handle, desc, &alpha, weight, w, rows, a, &beta, out, c, out, c, &algo,
                          reinterpret_cast<void *>(workspace), workspaceBytes,
                          reinterpret_cast<cudaStream_t>(stream)),
        "cublasLtMatmul (FP8 block-scaled)");
}

} // namespace moert::cuda
