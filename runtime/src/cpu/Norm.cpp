// RMSNorm and LayerNorm, in f32 as transformers computes them, with a row
// kernel per instruction-set level (IsaTarget.h). Every level computes the
// same f32 operations in the same order per element; only the double sums
// are added in another order (exact to far below the f32 rounding of their
// result), so the levels agree bit for bit on practical inputs
// (NormTest.EveryIsaLevelGivesTheSameBits). This file is compiled with
// -ffp-contract=off: a product followed by a sum stays two roundings, as in
// torch.
#include "IsaTarget.h"
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Kernels.h"

#include <cmath>

namespace moert::cpu {
namespace {

/// A norm weight (or bias) widened to f32 once per call.
std::vector<float> widen(const TensorView &v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i)
    out[i] = v.at(i);
  return out;
}

/// The row operations of both norms at one level: the f32 squares of a row
/// summed in double, a row's sum and its squared deviations from `mean` in
/// double, and the f32 outputs.
struct ScalarRows {
  static double sumSquares(const float *row, int64_t n) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float sq = row[i] * row[i];
      sum += sq;
    }
    return sum;
  }
  static double sum(const float *row, int64_t n) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i)
      sum += row[i];
    return sum;
  }
  static double squaredDeviations(const float *row, int64_t n, double mean) {
    double squares = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = row[i] - mean;
      squares += d * d;
    }
    return squares;
  }
  /// dst = w * (row * rstd): two f32 roundings, in that order.
  static void scale(const float *row, float rstd, const float *w, int64_t n, float *dst) {
    for (int64_t i = 0; i < n; ++i)
      dst[i] = w[i] * (row[i] * rstd);
  }
  /// dst = (row - mean) * rstd * w + b, each an f32 rounding.
  static void normalize(const float *row, float mean, float rstd, const float *w,
                        const float *b, int64_t n, float *dst) {
    for (int64_t i = 0; i < n; ++i)
      dst[i] = (row[i] - mean) * rstd * w[i] + b[i];
  }
};

#ifdef MOERT_X86
struct Avx512Rows {
  MOERT_AVX512 static __mmask16 lanes(int64_t left) {
    return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
  }
  /// The two halves of 16 floats widened to double and added to a0, a1.
  MOERT_AVX512 static void addWidened(__m512 v, __m512d &a0, __m512d &a1) {
    a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
    a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_castpd_ps(
                               _mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
  }
  MOERT_AVX512 static double sumSquares(const float *row, int64_t n) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(lanes(n - i), row + i);
      addWidened(_mm512_mul_ps(v, v), a0, a1);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
  }
  MOERT_AVX512 static double sum(const float *row, int64_t n) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 16)
      addWidened(_mm512_maskz_loadu_ps(lanes(n - i), row + i), a0, a1);
    return _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
  }
  MOERT_AVX512 static double squaredDeviations(const float *row, int64_t n, double mean) {
    const __m512d m = _mm512_set1_pd(mean);
    __m512d acc = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 8) {
      const __mmask8 k = static_cast<__mmask8>(lanes(n - i));
      const __m512d d = _mm512_maskz_sub_pd(k, _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k, row + i)), m);
      acc = _mm512_add_pd(acc, _mm512_mul_pd(d, d));
    }
    return _mm512_reduce_add_pd(acc);
  }
  MOERT_AVX512 static void scale(const float *row, float rstd, const float *w, int64_t n,
                                 float *dst) {
    const __m512 r = _mm512_set1_ps(rstd);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 k = lanes(n - i);
      const __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + i),
                                     _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + i), r));
      _mm512_mask_storeu_ps(dst + i, k, y);
    }
  }
  MOERT_AVX512 static void normalize(const float *row, float mean, float rstd, const float *w,
                                     const float *b, int64_t n, float *dst) {
    const __m512 m = _mm512_set1_ps(mean), r = _mm512_set1_ps(rstd);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 k = lanes(n - i);
      __m512 y = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + i), m), r);
      y = _mm512_add_ps(_mm512_mul_ps(y, _mm512_maskz_loadu_ps(k, w + i)),
                        _mm512_maskz_loadu_ps(k, b + i));
      _mm512_mask_storeu_ps(dst + i, k, y);
    }
  }
};

/// AVX2: whole vectors, then the scalar kernel for the last n % 8 values.
struct Avx2Rows {
  MOERT_AVX2 static __m256d widenLow(__m256 v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
  MOERT_AVX2 static __m256d widenHigh(__m256 v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
  MOERT_AVX2 static double reduce(__m256d a) {
    const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
  }
  MOERT_AVX2 static double sumSquares(const float *row, int64_t n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    const int64_t full = n / 8 * 8;
    for (int64_t i = 0; i < full; i += 8) {
      const __m256 v = _mm256_loadu_ps(row + i);
      const __m256 sq = _mm256_mul_ps(v, v);
      a0 = _mm256_add_pd(a0, widenLow(sq));
      a1 = _mm256_add_pd(a1, widenHigh(sq));
    }
    return reduce(_mm256_add_pd(a0, a1)) + ScalarRows::sumSquares(row + full, n - full);
  }
  MOERT_AVX2 static double sum(const float *row, int64_t n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    const int64_t full = n / 8 * 8;
    for (int64_t i = 0; i < full; i += 8) {
      const __m256 v = _mm256_loadu_ps(row + i);
      a0 = _mm256_add_pd(a0, widenLow(v));
      a1 = _mm256_add_pd(a1, widenHigh(v));
    }
    return reduce(_mm256_add_pd(a0, a1)) + ScalarRows::sum(row + full, n - full);
  }
  MOERT_AVX2 static double squaredDeviations(const float *row, int64_t n, double mean) {
    const __m256d m = _mm256_set1_pd(mean);
    __m256d acc = _mm256_setzero_pd();
    const int64_t full = n / 4 * 4;
    for (int64_t i = 0; i < full; i += 4) {
      const __m256d d = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(row + i)), m);
      acc = _mm256_add_pd(acc, _mm256_mul_pd(d, d));
    }
    return reduce(acc) + ScalarRows::squaredDeviations(row + full, n - full, mean);
  }
  MOERT_AVX2 static void scale(const float *row, float rstd, const float *w, int64_t n,
                               float *dst) {
    const __m256 r = _mm256_set1_ps(rstd);
    const int64_t full = n / 8 * 8;
    for (int64_t i = 0; i < full; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_loadu_ps(w + i),
                                              _mm256_mul_ps(_mm256_loadu_ps(row + i), r)));
    ScalarRows::scale(row + full, rstd, w + full, n - full, dst + full);
  }
  MOERT_AVX2 static void normalize(const float *row, float mean, float rstd, const float *w,
                                   const float *b, int64_t n, float *dst) {
    const __m256 m = _mm256_set1_ps(mean), r = _mm256_set1_ps(rstd);
    const int64_t full = n / 8 * 8;
    for (int64_t i = 0; i < full; i += 8) {
      __m256 y = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(row + i), m), r);
      y = _mm256_add_ps(_mm256_mul_ps(y, _mm256_loadu_ps(w + i)), _mm256_loadu_ps(b + i));
      _mm256_storeu_ps(dst + i, y);
    }
    ScalarRows::normalize(row + full, mean, rstd, w + full, b + full, n - full, dst + full);
  }
};
#endif

template <class Rows>
void rmsNormRows(const float *x, int64_t begin, int64_t end, int64_t width, int64_t group,
                 const float *w, float eps, float *out) {
  for (int64_t t = begin; t < end; ++t) {
    for (int64_t g0 = 0; g0 < width; g0 += group) {
      const float *row = x + t * width + g0;
      // transformers: x.pow(2).mean(-1) in f32 (each square rounded to f32;
      // the sum accumulated in double here, torch's f32 cascade sum is as
      // close to exact), then `/ N`, `+ eps`, rsqrt as 1 / sqrt, each f32.
      const float mean = static_cast<float>(Rows::sumSquares(row, group)) / static_cast<float>(group);
      const float rstd = 1.0f / std::sqrt(mean + eps);
      Rows::scale(row, rstd, w, group, out + t * width + g0);
    }
  }
}

template <class Rows>
void layerNormRows(const float *x, int64_t begin, int64_t end, int64_t width, const float *w,
                   const float *b, double eps, float *out) {
  for (int64_t t = begin; t < end; ++t) {
    const float *row = x + t * width;
    // Mean and biased variance in double (two passes), then the f32
    // normalisation torch's layer_norm applies.
    const double mean = Rows::sum(row, width) / static_cast<double>(width);
    const double var = Rows::squaredDeviations(row, width, mean) / static_cast<double>(width);
    const float rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
    Rows::normalize(row, static_cast<float>(mean), rstd, w, b, width, out + t * width);
  }
}

} // namespace

void rmsNorm(const float *x, int64_t tokens, int64_t width, const TensorView &weight,
             double eps, float *out) {
  const int64_t group = weight.numel();
  if (group <= 0 || width % group != 0)
    inputError("rms_norm: weight of {} values does not divide the row width {}", group, width);
  const std::vector<float> w = widen(weight);
  const float epsF = static_cast<float>(eps);
  parallelFor(tokens, [&](int64_t begin, int64_t end) {
#ifdef MOERT_X86
    if (activeIsa() >= Isa::Avx512)
      return rmsNormRows<Avx512Rows>(x, begin, end, width, group, w.data(), epsF, out);
    if (activeIsa() >= Isa::Avx2)
      return rmsNormRows<Avx2Rows>(x, begin, end, width, group, w.data(), epsF, out);
#endif
    rmsNormRows<ScalarRows>(x, begin, end, width, group, w.data(), epsF, out);
  }, 16);
}

namespace {

/// body(Rows{}) with the row kernels of the active ISA level.
template <class Body>
void withRows(Body &&body) {
#ifdef MOERT_X86
  if (activeIsa() >= Isa::Avx512)
    return body(Avx512Rows{});
  if (activeIsa() >= Isa::Avx2)
    return body(Avx2Rows{});
#endif
  body(ScalarRows{});
}

} // namespace

void rmsNormOfSquares(const float *x, int64_t tokens, int64_t width, const TensorView &weight,
                      const float *squares, int64_t rowWidth, double eps, float *out) {
  if (weight.numel() != width || rowWidth < width)
    inputError("rms_norm: a part of {} values of rows of {} needs its weight of {}, not {}",
               width, rowWidth, width, weight.numel());
  const std::vector<float> w = widen(weight);
  const float epsF = static_cast<float>(eps);
  parallelFor(tokens, [&](int64_t begin, int64_t end) {
    withRows([&](auto rows) {
      // (As rmsNormRows: the mean, `+ eps`, 1 / sqrt in f32.)
      for (int64_t t = begin; t < end; ++t) {
        const float mean = squares[t] / static_cast<float>(rowWidth);
        decltype(rows)::scale(x + t * width, 1.0f / std::sqrt(mean + epsF), w.data(), width,
                              out + t * width);
      }
    });
  }, 16);
}

void rowSumSquares(const float *x, int64_t tokens, int64_t width, float *out) {
  parallelFor(tokens, [&](int64_t begin, int64_t end) {
    withRows([&](auto rows) {
      for (int64_t t = begin; t < end; ++t)
        out[t] = static_cast<float>(decltype(rows)::sumSquares(x + t * width, width));
    });
  }, 16);
}

void layerNorm(const float *x, int64_t tokens, int64_t width, const TensorView &weight,
               const TensorView *bias, double eps, float *out) {
  if (weight.numel() != width)
    inputError("layer_norm: weight has {} values, rows have {}", weight.numel(), width);
  if (bias && bias->numel() != width)
    inputError("layer_norm: bias has {} values, rows have {}", bias->numel(), width);
  if (width <= 0)
    return;
  const std::vector<float> w = widen(weight);
  const std::vector<float> b = bias ? widen(*bias) : std::vector<float>(width, 0.0f);
  parallelFor(tokens, [&](int64_t begin, int64_t end) {
#ifdef MOERT_X86
    if (activeIsa() >= Isa::Avx512)
      return layerNormRows<Avx512Rows>(x, begin, end, width, w.data(), b.data(), eps, out);
    if (activeIsa() >= Isa::Avx2)
      return layerNormRows<Avx2Rows>(x, begin, end, width, w.data(), b.data(), eps, out);
#endif
    layerNormRows<ScalarRows>(x, begin, end, width, w.data(), b.data(), eps, out);
  }, 16);
}

} // namespace moert::cpu
