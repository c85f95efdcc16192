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

inline __mmask16 firstLanes(int64_t count) {
  return count >= 16 ? __mmask16(0xffff) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}

} // namespace moert::cpu::gemm
#endif // MOERT_X86
