// Reusable buffers and transposes of the backward kernels (GradientUtil.h).
#include "GradientUtil.h"
#include "Gemm.h"
#include "LoadAvx512.h"
#include "moert/Parallel.h"

#include <algorithm>
#include <array>

namespace moert::cpu::grad {
namespace {
constexpr int64_t kBlock = 32; // a 32 x 32 f32 block: 4 KiB read, 4 KiB written
} // namespace

float *workspace(Slot slot, size_t count) {
  thread_local std::array<std::vector<float>, kSlotCount> buffers;
  std::vector<float> &buffer = buffers[slot];
  if (buffer.size() < count)
    buffer.resize(count);
  return buffer.data();
}

namespace {
void transposeScalar(const float *in, int64_t rows, int64_t cols, int64_t ldIn, float *out,
                     int64_t ldOut) {
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock)
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t r1 = std::min(rows, r0 + kBlock), c1 = std::min(cols, c0 + kBlock);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r)
          out[c * ldOut + r] = in[r * ldIn + c];
    }
}

#ifdef MOERT_X86
/// 16 x 16 tiles through registers (masked at the edges): the backward's
/// transposes (matmulTN's left operand, the LM head's [T, vocab] logit
/// gradient among them; the attention gradient's blocks) took 4% of a
/// bench-moe training update as scalar loops.
MOERT_AVX512 void transposeAvx512(const float *in, int64_t rows, int64_t cols, int64_t ldIn,
                                  float *out, int64_t ldOut) {
  using gemm::firstLanes;
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int64_t validRows = std::min<int64_t>(16, rows - r0);
    const __mmask16 rowMask = firstLanes(validRows);
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      const int64_t validCols = std::min<int64_t>(16, cols - c0);
      const __mmask16 colMask = firstLanes(validCols);
      __m512 t[16];
      for (int i = 0; i < 16; ++i)
        t[i] = i < validRows ? _mm512_maskz_loadu_ps(colMask, in + (r0 + i) * ldIn + c0)
                             : _mm512_setzero_ps();
      gemm::transpose16(t);
      for (int j = 0; j < validCols; ++j)
        _mm512_mask_storeu_ps(out + (c0 + j) * ldOut + r0, rowMask, t[j]);
    }
  }
}

/// floatToBf16 of each of n floats (to nearest even, NaN quieted; no
/// flush of denormals, unlike vcvtneps2bf16), 16 at a time where AVX-512 runs:
/// the same integer steps, the same bits.
MOERT_AVX512 void roundRowAvx512(const float *in, int64_t n, uint16_t *out) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000), mantissa = _mm512_set1_epi32(0x007fffff);
  const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = gemm::firstLanes(n - i);
    const __m512i u = _mm512_maskz_loadu_epi32(lanes, in + i), top = _mm512_srli_epi32(u, 16);
    const __m512i even = _mm512_add_epi32(half, _mm512_and_si512(top, one));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, even), 16);
    const __mmask16 nan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, exponent), exponent) &
                          _mm512_test_epi32_mask(u, mantissa);
    const __m512i bits = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(top, quiet));
    _mm256_mask_storeu_epi16(out + i, lanes, _mm512_cvtepi32_epi16(bits));
  }
}
#endif
} // namespace

void transposeSerial(const float *in, int64_t rows, int64_t cols, int64_t ldIn, float *out,
                     int64_t ldOut) {
#ifdef MOERT_X86
  if (gemm::haveAvx512())
    return transposeAvx512(in, rows, cols, ldIn, out, ldOut);
#endif
  transposeScalar(in, rows, cols, ldIn, out, ldOut);
}

void transpose(const float *in, int64_t rows, int64_t cols, int64_t ldIn, float *out,
               int64_t ldOut) {
  parallelFor((rows + kBlock - 1) / kBlock, [&](int64_t begin, int64_t end) {
    const int64_t r0 = begin * kBlock, r1 = std::min(rows, end * kBlock);
    transposeSerial(in + r0 * ldIn, r1 - r0, cols, ldIn, out + r0, ldOut);
  });
}

void roundRowToBf16(const float *in, int64_t n, uint16_t *out) {
#ifdef MOERT_X86
  if (gemm::haveAvx512())
    return roundRowAvx512(in, n, out);
#endif
  for (int64_t i = 0; i < n; ++i)
    out[i] = floatToBf16(in[i]);
}

Matrix f32Matrix(const float *data, int64_t rows, int64_t cols, int64_t ld) {
  Matrix m;
  m.dtype = DType::F32;
  m.data = data;
  m.rows = rows;
  m.cols = cols;
  m.rowStride = ld ? ld : cols;
  return m;
}

bool bf16Products(const Matrix &w) { return gemm::roundsToBf16(w.dtype); }

void matmulTN(const float *a, int64_t lda, const float *b, int64_t ldb, int64_t t, int64_t m,
              int64_t n, float *c, int64_t ldc, bool bf16) {
  // b [t, n] is the storage of b^T [n, t]: the GEMM packs it as it is.
  if (!bf16) {
    float *aT = workspace(kLeftT, static_cast<size_t>(m * t));
    transpose(a, t, m, lda, aT, t);
    linear(aT, m, f32Matrix(b, t, n, ldb).transpose(), nullptr, c, 0, ldc);
    return;
  }
  // The same with b rounded to bf16 (the GEMM rounds a^T as it packs it).
  auto *rounded = reinterpret_cast<uint16_t *>(workspace(kRightBf16, static_cast<size_t>(t * n + 1) / 2));
  parallelFor(t, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      roundRowToBf16(b + r * ldb, n, rounded + r * n);
  }, 8);
  Matrix bf16Rows = f32Matrix(nullptr, t, n);
  bf16Rows.dtype = DType::BF16;
  bf16Rows.data = rounded;
  const Matrix right = bf16Rows.transpose();
  // a^T packed from a's rows where the GEMM can (no transposed copy).
  if (linearLeftTransposed(a, lda, m, right, c, ldc ? ldc : right.rows))
    return;
  float *aT = workspace(kLeftT, static_cast<size_t>(m * t));
  transpose(a, t, m, lda, aT, t);
  linear(aT, m, right, nullptr, c, 0, ldc);
}

} // namespace moert::cpu::grad
