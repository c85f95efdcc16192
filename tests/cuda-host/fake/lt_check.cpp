// The fake cuBLASLt's FP8 block-scaled matmul against hand-computed results
// and its refusals (tests/cuda/fake-cublaslt.test): the scale layouts the
// device writes (VEC128_32F outer-dim-major, BLK128x128_32F with K's blocks
// padded to 4) must be the ones the fake reads, so that a layout error of
// the device cannot hide behind a compensating one here.
#include <cublasLt.h>
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <vector>

namespace {
cublasLtHandle_t lt;

// D (m x n, f32, column-major) = op(A) B, A stored k x m (TRANSA T), B
// stored k x n; scale modes and tensors as given. Returns the status.
int matmul(int transa, int m, int n, int k, const uint8_t *A, const uint8_t *B, int32_t aMode,
           const float *sa, int32_t bMode, const float *sb, float *D) {
  cublasLtMatmulDesc_t d;
  cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  int32_t tb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa));
  cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &aMode, sizeof(aMode));
  cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bMode, sizeof(bMode));
  cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
  cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, k, m, k);
  cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, k, n, k);
  cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, m, n, m);
  cublasLtMatmulPreference_t p;
  cublasLtMatmulPreferenceCreate(&p);
  cublasLtMatmulHeuristicResult_t h;
  int found = 0;
  int s = cublasLtMatmulAlgoGetHeuristic(lt, d, a, b, c, c, p, 1, &h, &found);
  if (s == 0 && found == 1) {
    float alpha = 1, beta = 0;
    s = cublasLtMatmul(lt, d, &alpha, A, a, B, b, &beta, D, c, D, c, &h.algo, nullptr, 0,
                       nullptr);
  }
  cublasLtMatmulPreferenceDestroy(p);
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(c);
  cublasLtMatmulDescDestroy(d);
  return s;
}
} // namespace

int main() {
  cuInit(0);
  cublasLtCreate(&lt);
  const int m = 2, n = 3, k = 256; // two 128-blocks of K
  // e4m3: 0x38 = 1.0, 0x30 = 0.5. op(A) row 0 is 1.0, row 1 is 0.5; B is 1.0.
  std::vector<uint8_t> A(k * m), B(k * n, 0x38);
  for (int l = 0; l < k; ++l) {
    A[l + 0 * k] = 0x38;
    A[l + 1 * k] = 0x30;
  }
  float D[m * n];
  // A: BLK128x128 (one row block, K blocks padded to 4: a0, a1, -, -);
  // B: VEC128, outer-dim-major (scale [kb * n + j]).
  const float sa[4] = {1, 2, -1, -1}, sb[6] = {1, 2, 3, 10, 20, 30};
  int s = matmul(CUBLAS_OP_T, m, n, k, A.data(), B.data(),
                 CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, sa,
                 CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, sb, D);
  // D(0, j) = 128 (1 sb[j] + 2 sb[3 + j]); D(1, j) half of it.
  std::printf("2D x 1D rc=%d D={%g,%g,%g,%g,%g,%g} want {2688,1344,5376,2688,8064,4032}\n", s,
              D[0], D[1], D[2], D[3], D[4], D[5]);
  // A: VEC128 (scale [kb * m + i]); B: BLK128x128 (n < 128: one block row).
  const float va[4] = {1, 3, 2, 4}, bb[4] = {1, 10, -1, -1};
  s = matmul(CUBLAS_OP_T, m, n, k, A.data(), B.data(), CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
             va, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, bb, D);
  // D(0, j) = 128 (1 + 2 10) = 2688; D(1, j) = 64 (3 + 4 10) = 2752.
  std::printf("1D x 2D rc=%d D={%g,%g} want {2688,2752}\n", s, D[0], D[1]);
  s = matmul(CUBLAS_OP_N, m, n, k, A.data(), B.data(),
             CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, sa,
             CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, sb, D);
  std::printf("not TN rc=%d (want 15)\n", s);
  s = matmul(CUBLAS_OP_T, m, n, k, A.data(), B.data(),
             CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, sa,
             CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, bb, D);
  std::printf("2D x 2D rc=%d (want 15)\n", s);
  s = matmul(CUBLAS_OP_T, m, n, 200, A.data(), B.data(),
             CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, sa,
             CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, sb, D);
  std::printf("k not a multiple of 16 rc=%d (want 15)\n", s);
  cublasLtDestroy(lt);
  return 0;
}
