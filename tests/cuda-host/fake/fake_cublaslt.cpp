// A fake cuBLASLt on the host (test infrastructure only; README.md, "The
// fake cuBLASLt"): the entry points moert's CUDA device loads for its FP8
// block-scaled GEMMs on sm_90 (runtime/src/cuda/CudaApi.cpp), in the same
// library as the fake driver (fake_cuda.cpp), whose streams and graphs it
// shares through moe_fake_cuda_capturing / moe_fake_cuda_record.
//
// What it implements is cublasLtMatmul for FP8 (CUDA_R_8F_E4M3) A and B as
// cuBLAS documents it for Hopper: "TN" only (A transposed, B not: both
// stored with K innermost), leading dimensions and K multiples of 16, f32
// compute and scale type, C and D of one type (f32 or bf16), and per-operand
// scale modes SCALAR_32F (or none: 1), VEC128_32F (one f32 per 128 elements
// of K for each row of the operand: scale [kb * outer + o], outer-dim-major)
// and BLK128x128_32F (one per 128 x 128 block: scale [kb + (o / 128) * L4],
// L4 = ceil(K / 128) rounded up to 4), in the combinations cuBLAS lists for
// sm_90: 1D x 1D, 1D x 2D, 2D x 1D (2D x 2D is refused). Anything else gets
// no algorithm from the heuristic and CUBLAS_STATUS_NOT_SUPPORTED, as the
// library answers; so do block modes when the fake device is not sm_90
// (MOE_FAKE_CUDA_SM, fake_cuda.cpp).
#include <cublasLt.h>
#include <cuda.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

extern "C" int moe_fake_cuda_capturing(CUstream hs);
extern "C" CUresult moe_fake_cuda_record(CUstream hs, void (*run)(void *), void *arg,
                                         void (*release)(void *));
extern "C" int moe_fake_cuda_sm();

namespace {

struct Desc {
  cublasComputeType_t compute;
  cudaDataType_t scaleType;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  const void *aScale = nullptr, *bScale = nullptr;
  int32_t aMode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
          bMode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
};
struct Layout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};
struct Preference {
  uint64_t workspace = 0;
};

long handles = 0, matmuls = 0, refused = 0;
struct Stats {
  ~Stats() {
    if (std::getenv("MOE_FAKE_CUDA_STATS") && handles)
      std::fprintf(stderr, "fake-cublaslt: %ld FP8 block-scaled matmul(s), %ld refused\n",
                   matmuls, refused);
  }
} stats;

template <typename T> cublasStatus_t setValue(T &slot, const void *buf, size_t size) {
  if (!buf || size != sizeof(T))
    return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&slot, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

float e4m3(uint8_t b) {
  const unsigned e = (b >> 3) & 15u, m = b & 7u;
  float v = e == 15u && m == 7u ? NAN
            : e == 0u           ? std::ldexp(static_cast<float>(m), -9)
                                : std::ldexp(1.0f + static_cast<float>(m) / 8.0f,
                                             static_cast<int>(e) - 7);
  return (b & 128u) ? -v : v;
}

bool blockMode(int32_t m) {
  return m == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ||
         m == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

/// cuBLAS' answer for this problem: success, or why no algorithm runs it.
cublasStatus_t supported(const Desc &d, const Layout &a, const Layout &b, const Layout &c,
                         const Layout &dl) {
  if (d.compute != CUBLAS_COMPUTE_32F || d.scaleType != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (a.type != CUDA_R_8F_E4M3 || b.type != CUDA_R_8F_E4M3)
    return CUBLAS_STATUS_NOT_SUPPORTED; // the fake implements FP8 only
  if (d.transa != CUBLAS_OP_T || d.transb != CUBLAS_OP_N)
    return CUBLAS_STATUS_NOT_SUPPORTED; // FP8: TN only
  const uint64_t k = a.rows, m = a.cols, n = b.cols;
  if (b.rows != k || c.rows != m || c.cols != n || dl.rows != m || dl.cols != n)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (a.ld < static_cast<int64_t>(k) || b.ld < static_cast<int64_t>(k) ||
      dl.ld < static_cast<int64_t>(m) || c.ld < static_cast<int64_t>(m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (k % 16 || a.ld % 16 || b.ld % 16)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!(dl.type == CUDA_R_32F || dl.type == CUDA_R_16BF) || c.type != dl.type)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool blocks = blockMode(d.aMode) || blockMode(d.bMode);
  auto known = [](int32_t m) { return m == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F || blockMode(m); };
  if (!known(d.aMode) || !known(d.bMode))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (blocks) {
    // 1D x 1D, 1D x 2D, 2D x 1D, on sm_90 only.
    if (!blockMode(d.aMode) || !blockMode(d.bMode) ||
        (d.aMode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F &&
         d.bMode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F))
      return CUBLAS_STATUS_NOT_SUPPORTED;
    if (moe_fake_cuda_sm() / 10 != 9)
      return CUBLAS_STATUS_NOT_SUPPORTED;
  } else if (moe_fake_cuda_sm() < 89) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

/// The scale of element (outer o, inner l) of an operand with K = k inner
/// elements and `outer` outer ones.
float scaleOf(const float *s, int32_t mode, uint64_t o, uint64_t l, uint64_t k, uint64_t outer) {
  if (!s)
    return 1.0f;
  const uint64_t kb = l / 128;
  if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F)
    return s[kb * outer + o];
  if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F) {
    const uint64_t l4 = ((k + 127) / 128 + 3) / 4 * 4;
    return s[kb + (o / 128) * l4];
  }
  return s[0];
}

struct Call {
  Desc d;
  Layout a, b, c, dl;
  float alpha, beta;
  const uint8_t *A, *B;
  const void *C;
  void *D;
};

void run(const Call &x) {
  ++matmuls;
  const uint64_t k = x.a.rows, m = x.a.cols, n = x.b.cols;
  const auto *sa = static_cast<const float *>(x.d.aScale);
  const auto *sb = static_cast<const float *>(x.d.bScale);
  for (uint64_t j = 0; j < n; ++j)
    for (uint64_t i = 0; i < m; ++i) {
      // Each 128-block of K is summed, then scaled (the block-scaled
      // product; the scales are constant within a block).
      float sum = 0;
      for (uint64_t l0 = 0; l0 < k; l0 += 128) {
        float block = 0;
        for (uint64_t l = l0; l < k && l < l0 + 128; ++l)
          block += e4m3(x.A[l + i * x.a.ld]) * e4m3(x.B[l + j * x.b.ld]);
        sum += block * scaleOf(sa, x.d.aMode, i, l0, k, m) * scaleOf(sb, x.d.bMode, j, l0, k, n);
      }
      const uint64_t at = i + j * static_cast<uint64_t>(x.dl.ld),
                     ct = i + j * static_cast<uint64_t>(x.c.ld);
      if (x.dl.type == CUDA_R_32F) {
        float v = x.alpha * sum;
        if (x.beta != 0.0f) // beta 0: C is not read
          v += x.beta * static_cast<const float *>(x.C)[ct];
        static_cast<float *>(x.D)[at] = v;
      } else {
        auto bf16 = [](const void *p, uint64_t i) {
          uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t *>(p)[i]) << 16;
          float f;
          std::memcpy(&f, &bits, 4);
          return f;
        };
        float v = x.alpha * sum + (x.beta != 0.0f ? x.beta * bf16(x.C, ct) : 0.0f);
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        bits += 0x7fffu + ((bits >> 16) & 1u); // round to nearest even
        static_cast<uint16_t *>(x.D)[at] = static_cast<uint16_t>(bits >> 16);
      }
    }
}

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
  static int dummy;
  ++handles;
  *handle = reinterpret_cast<cublasLtHandle_t>(&dummy);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scaleType) {
  Desc *d = new Desc;
  d->compute = compute;
  d->scaleType = scaleType;
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete reinterpret_cast<Desc *>(desc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
  Desc &d = *reinterpret_cast<Desc *>(desc);
  switch (attr) {
  case CUBLASLT_MATMUL_DESC_TRANSA: return setValue(d.transa, buf, size);
  case CUBLASLT_MATMUL_DESC_TRANSB: return setValue(d.transb, buf, size);
  case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return setValue(d.aScale, buf, size);
  case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return setValue(d.bScale, buf, size);
  case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: return setValue(d.aMode, buf, size);
  case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: return setValue(d.bMode, buf, size);
  default: return CUBLAS_STATUS_NOT_SUPPORTED; // not implemented by the fake
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete reinterpret_cast<Layout *>(layout);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new Preference);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete reinterpret_cast<Preference *>(pref);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size) {
  if (attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return setValue(reinterpret_cast<Preference *>(pref)->workspace, buf, size);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int *returned) {
  if (!handle)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  if (requested < 1 || !returned)
    return CUBLAS_STATUS_INVALID_VALUE;
  *returned = 0;
  cublasStatus_t s = supported(*reinterpret_cast<Desc *>(desc), *reinterpret_cast<Layout *>(a),
                               *reinterpret_cast<Layout *>(b), *reinterpret_cast<Layout *>(c),
                               *reinterpret_cast<Layout *>(d));
  if (s != CUBLAS_STATUS_SUCCESS) {
    ++refused;
    return s;
  }
  std::memset(&results[0], 0, sizeof(results[0]));
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t a,
                              const void *B, cublasLtMatrixLayout_t b, const void *beta,
                              const void *C, cublasLtMatrixLayout_t c, void *D,
                              cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t *, void *,
                              size_t, cudaStream_t stream) {
  if (!handle)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  Call x{*reinterpret_cast<Desc *>(desc),
         *reinterpret_cast<Layout *>(a),
         *reinterpret_cast<Layout *>(b),
         *reinterpret_cast<Layout *>(c),
         *reinterpret_cast<Layout *>(d),
         *static_cast<const float *>(alpha), // host pointer mode (the default)
         *static_cast<const float *>(beta),
         static_cast<const uint8_t *>(A),
         static_cast<const uint8_t *>(B),
         C,
         D};
  if (cublasStatus_t s = supported(x.d, x.a, x.b, x.c, x.dl))
    return s;
  if ((blockMode(x.d.aMode) && !x.d.aScale) || (blockMode(x.d.bMode) && !x.d.bScale))
    return CUBLAS_STATUS_INVALID_VALUE; // block scales are tensors: no default
  auto *s = reinterpret_cast<CUstream>(stream);
  if (!moe_fake_cuda_capturing(s)) {
    run(x);
    return CUBLAS_STATUS_SUCCESS;
  }
  // Recorded with its argument values, replayed by each graph launch.
  Call *copy = new Call(x);
  moe_fake_cuda_record(
      s, [](void *p) { run(*static_cast<Call *>(p)); }, copy,
      [](void *p) { delete static_cast<Call *>(p); });
  return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
