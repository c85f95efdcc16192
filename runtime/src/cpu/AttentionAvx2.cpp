// The AVX2 + FMA attention tile (AttentionTile.h): the AVX-512 tile of
// Attention.cpp with 8 query rows per vector, for CPUs without AVX-512.
#include "AttentionTile.h"

#include <algorithm>
#include <cmath>

#include "IsaTarget.h"

#ifdef MOERT_X86

namespace moert::cpu {
namespace {

/// 2^k for integer lanes k in [-126, 127].
MOERT_AVX2 inline __m256 pow2(__m256i k) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
}

/// e^x for 8 lanes: x = n ln2 + r, |r| <= ln2/2, the degree-7 polynomial of
/// the AVX-512 exp16 for e^r, and 2^n applied in two halves (n reaches -150,
/// below the normal range of one factor). Lanes far below the f32 range
/// give 0, -inf gives 0.
MOERT_AVX2 inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-104.0f));
  x = _mm256_min_ps(x, _mm256_set1_ps(88.7f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  return _mm256_mul_ps(_mm256_mul_ps(p, pow2(half)), pow2(_mm256_sub_epi32(ni, half)));
}

/// Lanes [0, count) set (a maskload/maskstore mask).
MOERT_AVX2 inline __m256i firstLanes(int64_t count) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::clamp<int64_t>(count, 0, 8))),
                            index);
}

/// Rows r0.. r0+NR-1 of the value sum over columns [c, c + 8 NV) (the last
/// vector masked by `tail`): out_r = (sum_j e[j][r] v_j) / sums[r].
template <int NR, int NV>
MOERT_AVX2 void valueSum(const float *S, int64_t ld, int64_t r0, const float *values, int64_t vw,
                         int64_t c, int64_t nk, __m256i tail, const float *sums,
                         float *const *orow) {
  __m256 acc[NR][NV];
#pragma GCC unroll 4
  for (int a = 0; a < NR; ++a)
#pragma GCC unroll 3
    for (int b = 0; b < NV; ++b)
      acc[a][b] = _mm256_setzero_ps();
  const float *vp = values + c, *sp = S + r0;
  for (int64_t j = 0; j < nk; ++j, vp += vw, sp += ld) {
    __m256 v[NV];
#pragma GCC unroll 3
    for (int b = 0; b < NV; ++b)
      v[b] = b == NV - 1 ? _mm256_maskload_ps(vp + 8 * b, tail) : _mm256_loadu_ps(vp + 8 * b);
#pragma GCC unroll 4
    for (int a = 0; a < NR; ++a) {
      const __m256 p = _mm256_broadcast_ss(sp + a);
#pragma GCC unroll 3
      for (int b = 0; b < NV; ++b)
        acc[a][b] = _mm256_fmadd_ps(p, v[b], acc[a][b]);
    }
  }
#pragma GCC unroll 4
  for (int a = 0; a < NR; ++a) {
    const __m256 total = _mm256_set1_ps(sums[r0 + a]);
    float *o = orow[r0 + a] + c;
#pragma GCC unroll 3
    for (int b = 0; b < NV; ++b) {
      const __m256 x = _mm256_div_ps(acc[a][b], total);
      if (b == NV - 1)
        _mm256_maskstore_ps(o + 8 * b, tail, x);
      else
        _mm256_storeu_ps(o + 8 * b, x);
    }
  }
}

using ValueSum = void (*)(const float *, int64_t, int64_t, const float *, int64_t, int64_t,
                          int64_t, __m256i, const float *, float *const *);

template <int NR>
ValueSum valueSumFor(int nv) {
  return nv == 1 ? valueSum<NR, 1> : nv == 2 ? valueSum<NR, 2> : valueSum<NR, 3>;
}

} // namespace

MOERT_AVX2 void attendTileAvx2(const float *const *qrow, float *const *orow,
                               const int32_t *firstRow, const int32_t *lastRow, int64_t rows,
                               const float *keys, int64_t kw, const float *values, int64_t vw,
                               int64_t j0, int64_t nk, int64_t dq, int64_t dv, float scale,
                               TileScratch &ts) {
  const int64_t blocks = (rows + 7) / 8, ld = blocks * 8;
  ts.prepare(qrow, firstRow, lastRow, rows, ld, j0, nk, dq);
  float *S = ts.s.data();
  const __m256 vscale = _mm256_set1_ps(scale);
  // Scores: lane r of a vector is query row r; 8 keys at a time.
  for (int64_t b = 0; b < blocks; ++b) {
    const float *qt = ts.qt.data() + b * 8;
    float *sb = S + b * 8;
    int64_t j = 0;
    for (; j + 8 <= nk; j += 8) {
      const float *k0 = keys + j * kw;
      if (j + 16 <= nk)
        for (int u = 0; u < 8; ++u)
          for (int64_t i = 0; i < dq; i += 16)
            _mm_prefetch(reinterpret_cast<const char *>(keys + (j + 8 + u) * kw + i),
                         _MM_HINT_T0);
      __m256 a[8];
#pragma GCC unroll 8
      for (int u = 0; u < 8; ++u)
        a[u] = _mm256_setzero_ps();
      for (int64_t d = 0; d < dq; ++d) {
        const __m256 qv = _mm256_loadu_ps(qt + d * ld);
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u)
          a[u] = _mm256_fmadd_ps(qv, _mm256_broadcast_ss(k0 + u * kw + d), a[u]);
      }
#pragma GCC unroll 8
      for (int u = 0; u < 8; ++u)
        _mm256_storeu_ps(sb + (j + u) * ld, _mm256_mul_ps(a[u], vscale));
    }
    for (; j < nk; ++j) {
      const float *k0 = keys + j * kw;
      __m256 a0 = _mm256_setzero_ps();
      for (int64_t d = 0; d < dq; ++d)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qt + d * ld), _mm256_broadcast_ss(k0 + d), a0);
      _mm256_storeu_ps(sb + j * ld, _mm256_mul_ps(a0, vscale));
    }
  }
  // Softmax numerators in place (0 outside each row's range), and the sums.
  std::vector<float> &sums = ts.qt; // reuse: ld values
  sums.assign(static_cast<size_t>(ld), 0.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    float *sb = S + b * 8;
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(ts.first.data() + b * 8));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(ts.last.data() + b * 8));
    auto inRange = [&](int64_t j) MOERT_AVX2 {
      const __m256i jv = _mm256_set1_epi32(static_cast<int32_t>(j));
      // lo <= j <= hi: neither lo > j nor j > hi.
      const __m256i out = _mm256_or_si256(_mm256_cmpgt_epi32(lo, jv), _mm256_cmpgt_epi32(jv, hi));
      return _mm256_castsi256_ps(_mm256_xor_si256(out, _mm256_set1_epi32(-1)));
    };
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < nk; ++j)
      mx = _mm256_blendv_ps(mx, _mm256_max_ps(mx, _mm256_loadu_ps(sb + j * ld)), inRange(j));
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < nk; ++j) {
      const __m256 e = _mm256_and_ps(inRange(j), exp8(_mm256_sub_ps(_mm256_loadu_ps(sb + j * ld), mx)));
      sum = _mm256_add_ps(sum, e);
      _mm256_storeu_ps(sb + j * ld, e);
    }
    _mm256_storeu_ps(sums.data() + b * 8, sum);
  }
  // The value sums, four rows and up to 24 columns at a time.
  for (int64_t c = 0; c < dv; c += 24) {
    const int64_t width = std::min<int64_t>(24, dv - c);
    const int nv = static_cast<int>((width + 7) / 8);
    const __m256i tail = firstLanes(width - (nv - 1) * 8);
    const ValueSum four = valueSumFor<4>(nv), three = valueSumFor<3>(nv),
                   two = valueSumFor<2>(nv), one = valueSumFor<1>(nv);
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
      const int64_t nr = std::min<int64_t>(4, rows - r0);
      (nr == 4 ? four : nr == 3 ? three : nr == 2 ? two : one)(S, ld, r0, values, vw, c, nk, tail,
                                                              sums.data(), orow);
    }
  }
}

} // namespace moert::cpu

#else
namespace moert::cpu {
void attendTileAvx2(const float *const *, float *const *, const int32_t *, const int32_t *,
                    int64_t, const float *, int64_t, const float *, int64_t, int64_t, int64_t,
                    int64_t, int64_t, float, TileScratch &) {}
} // namespace moert::cpu
#endif
