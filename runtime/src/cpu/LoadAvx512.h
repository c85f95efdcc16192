// Internal to the CPU kernels: AVX-512 loads of 16 elements of any float
// dtype, widened to f32 (the GEMM of Gemm.cpp and the GEMV of
// GemvAvx512.cpp).
#pragma once

#include "IsaTarget.h"
#include "moert/cpu/Kernels.h"

#ifdef MOERT_X86
#include <immintrin.h>

#include <cstdint>

namespace moert::cpu::gemm {

/// 16 consecutive elements at p (masked: the others read as zero).
template <DType D>
MOERT_AVX512 inline __m512 load16(const void *p, __mmask16 mask) {
  if constexpr (D == DType::F32) {
    return _mm512_maskz_loadu_ps(mask, p);
  } else {
    __m256i h = _mm256_maskz_loadu_epi16(mask, p);
    if constexpr (D == DType::BF16)
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    else
      return _mm512_cvtph_ps(h);
  }
}

template <DType D>
MOERT_AVX512 inline __m512 load16(const void *p) {
  if constexpr (D == DType::F32) {
    return _mm512_loadu_ps(p);
  } else {
    __m256i h = _mm256_loadu_si256(static_cast<const __m256i *>(p));
    if constexpr (D == DType::BF16)
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    else
      return _mm512_cvtph_ps(h);
  }
}

/// 32 consecutive elements of a block-scaled row (FP8 e4m3 or int8 bytes at
/// p; masked: the others read as zero), times `scale` in f32 and rounded to
/// bf16 (to nearest even), in order: the bf16 values a BF16 model's
/// block-scaled weight multiplies with (GemmFp8.cpp). e4m3 widens through
/// f16 as the value / 2^8 (exact, subnormals included), so the scale
/// carries 2^8.
template <DType D>
MOERT_AVX512_BF16 inline __m512i scaledBf16x32(const void *p, __mmask32 mask, float scale) {
  static_assert(D == DType::F8E4M3 || D == DType::I8, "a block-scaled dtype");
  const __m256i bytes = _mm256_maskz_loadu_epi8(mask, p);
  __m512 lo, hi;
  if constexpr (D == DType::F8E4M3) {
    const __m512i half = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(bytes), 7),
                                          _mm512_set1_epi16(-16385));
    const __m512 s = _mm512_set1_ps(scale * 256.0f);
    lo = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(half)), s);
    hi = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(half, 1)), s);
  } else {
    const __m512 s = _mm512_set1_ps(scale);
    lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(bytes))), s);
    hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(bytes, 1))),
                       s);
  }
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

inline __mmask16 firstLanes(int64_t count) {
  return count >= 16 ? __mmask16(0xffff) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}

/// In-register transpose of a 16x16 f32 block: r[i] lane j <-> r[j] lane i.
MOERT_AVX512 inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // Now r[4i + j], 128-bit lane L, holds column 4L + j of rows 4i..4i+3.
  for (int i = 0; i < 4; ++i) {
    __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // Gather the four lanes L of r[j], r[4+j], r[8+j], r[12+j] into column 4L+j.
  for (int j = 0; j < 4; ++j) {
    __m512 u0 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);      // L0 L2 | L0 L2
    __m512 u1 = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);      // L1 L3 | L1 L3
    __m512 v0 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    __m512 v1 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
    t[j] = _mm512_shuffle_f32x4(u0, v0, 0x88);
    t[4 + j] = _mm512_shuffle_f32x4(u1, v1, 0x88);
    t[8 + j] = _mm512_shuffle_f32x4(u0, v0, 0xdd);
    t[12 + j] = _mm512_shuffle_f32x4(u1, v1, 0xdd);
  }
  for (int i = 0; i < 16; ++i)
    r[i] = t[i];
}

} // namespace moert::cpu::gemm
#endif // MOERT_X86
