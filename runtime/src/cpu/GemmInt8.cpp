// int8 weights under `linear` (moec compile --weight-format int8: symmetric
// int8 with one f32 scale per row and block of 128 columns, quantised at
// load by RankWeights::bindInt8); the weight stays one byte per element.
//
// What is computed:
//  - Decode (up to kMaxTokens tokens, AVX2 and up): x is quantised per token
//    and per weight block to int16 (xs = max |x| / 32767 over the block,
//    round half to even: an error below 1/65534 of the block's largest
//    |x|, next to the weight's 1/254 of its own), each block's integer dot
//    product is exact in int32 (a lane sums at most block / 8 products of
//    127 x 32767: below 2^31 for the plan's blocks, at most 4096), and
//    converted once: y += float(sum q_w q_x) * (s_w * s_x). vpmovsxbw widens
//    32 weights a step and vpdpwssd (AVX512_VNNI: every AVX-512 CPU but
//    Skylake-SP, which takes the AVX2 kernel) multiplies them; at the AVX2
//    level 16 a step, by vpmaddwd + vpaddd. A token whose x is not finite
//    takes the exact path below instead.
//  - Otherwise (prefill, the generic level): rows dequantised to f32
//    (q x scale, exact products of those) a chunk at a time, as FP8 weights
//    are (GemmFp8.cpp, which calls dequantiseRowInt8).
#include "BlockScaled.h"
#include "Gemm.h"
#include "LoadAvx512.h"

#ifdef MOERT_X86
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace moert::cpu::gemm {
namespace {

constexpr int64_t kMaxTokens = kInt8GemvMaxTokens;

/// x quantised to int16 per token and per weight block (Blocks' runs, the
/// same for every row of a 1-row-block weight): values [tokens, ld] (zero
/// past K and up to 64 beyond, for full-width loads), scales [tokens,
/// blocks].
struct QuantisedTokens {
  std::vector<int16_t> values;
  std::vector<float> scales;
  int64_t ld = 0, blocks = 0;
};
thread_local QuantisedTokens quantised;

/// Fills `quantised` for x; false when some x is not finite.
bool quantiseTokens(const float *x, int64_t ldx, int64_t tokens, const Matrix &w) {
  QuantisedTokens &q = quantised;
  const int64_t K = w.cols;
  q.ld = (K + 31) / 32 * 32 + 64;
  q.blocks = (w.scales.colOrigin % w.scales.blockCols + K + w.scales.blockCols - 1) /
             w.scales.blockCols;
  q.values.assign(static_cast<size_t>(tokens * q.ld), 0);
  q.scales.resize(static_cast<size_t>(tokens * q.blocks));
  for (int64_t t = 0; t < tokens; ++t) {
    const float *xt = x + t * ldx;
    int64_t b = 0;
    for (Blocks run(w, 0); run.next(); ++b) {
      uint32_t bits = 0;
      for (int64_t c = run.c0; c < run.c1; ++c)
        bits = std::max(bits, magnitudeBits(xt[c]));
      if (bits >= 0x7f800000u) // an infinity or a NaN
        return false;
      float most;
      std::memcpy(&most, &bits, sizeof most);
      const float scale = most / 32767.0f;
      q.scales[t * q.blocks + b] = scale;
      if (scale == 0)
        continue;
      const float inverse = 1.0f / scale;
      int16_t *out = q.values.data() + t * q.ld;
      for (int64_t c = run.c0; c < run.c1; ++c)
        out[c] = static_cast<int16_t>(
            std::clamp(roundHalfEven(xt[c] * inverse), -32767.0f, 32767.0f));
    }
  }
  return true;
}

#ifdef MOERT_X86
/// One 32-column step of rowsAvx512 into the sums `sum` (mask: the
/// columns before the block's end).
template <int R, int TG>
MOERT_AVX512_VNNI inline __attribute__((always_inline)) void
stepAvx512(__m512i (&sum)[R][TG], const uint8_t *const (&rows)[R], const int16_t *xq, int64_t ldq,
           int64_t c, __mmask32 mask) {
  __m512i wv[R];
  for (int i = 0; i < R; ++i)
    wv[i] = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mask, rows[i] + c));
  for (int t = 0; t < TG; ++t) {
    const __m512i xv = _mm512_loadu_si512(xq + t * ldq + c);
    for (int i = 0; i < R; ++i)
      sum[i][t] = _mm512_dpwssd_epi32(sum[i][t], wv[i], xv);
  }
}

/// y for R rows at once (their blocks share columns) and TG tokens: per 32
/// columns one widening of each row's bytes and R x TG dot steps, in C
/// chains (vpdpwssd's latency, for R x TG < 4); per block the int32 sums
/// converted and scaled into f32 accumulators. The rows two groups on are
/// prefetched into L2 (as gemvTile's; with one row, kRowPrefetchBytes
/// ahead). On Zen 4 (moe-gemm-bench --int8, one token, 2 threads) 4 rows
/// stream 28-31 GB/s where one row in 4 chains streams 20-24.
template <int R, int TG, int C>
MOERT_AVX512_VNNI void rowsAvx512(const Matrix &w, int64_t n, const float *bias, float *y,
                                  int64_t ldy) {
  const QuantisedTokens &q = quantised;
  const int16_t *xq = q.values.data();
  const float *xs = q.scales.data();
  const int64_t ldq = q.ld, blocks = q.blocks;
  const int64_t ahead = R == 1 ? kRowPrefetchBytes : 2 * R * w.rowStride;
  const uint8_t *rows[R];
  const float *rowScales[R];
  __m512 acc[R][TG];
  for (int i = 0; i < R; ++i) {
    rows[i] = rowBytes(w, n + i);
    rowScales[i] = Blocks(w, n + i).scales;
    for (int t = 0; t < TG; ++t)
      acc[i][t] = _mm512_setzero_ps();
  }
  int64_t b = 0;
  for (Blocks run(w, n); run.next(); ++b) {
    __m512i sum[C][R][TG];
    for (int j = 0; j < C; ++j)
      for (int i = 0; i < R; ++i)
        for (int t = 0; t < TG; ++t)
          sum[j][i][t] = _mm512_setzero_si512();
    int64_t c = run.c0;
    for (; c + 32 * C <= run.c1; c += 32 * C) {
      for (int i = 0; i < R; ++i)
        for (int64_t line = 0; line < 32 * C; line += 64)
          _mm_prefetch(reinterpret_cast<const char *>(rows[i] + c + ahead + line), _MM_HINT_T1);
      for (int j = 0; j < C; ++j)
        stepAvx512<R, TG>(sum[j], rows, xq, ldq, c + 32 * j, __mmask32(~0u));
    }
    for (; c < run.c1; c += 32) {
      const int64_t left = run.c1 - c;
      stepAvx512<R, TG>(sum[0], rows, xq, ldq, c,
                        left >= 32 ? __mmask32(~0u) : __mmask32((1u << left) - 1));
    }
    for (int j = 1; j < C; ++j)
      for (int i = 0; i < R; ++i)
        for (int t = 0; t < TG; ++t)
          sum[0][i][t] = _mm512_add_epi32(sum[0][i][t], sum[j][i][t]);
    for (int t = 0; t < TG; ++t)
      for (int i = 0; i < R; ++i)
        acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[0][i][t]),
                                    _mm512_set1_ps(rowScales[i][b] * xs[t * blocks + b]),
                                    acc[i][t]);
  }
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < TG; ++t)
      y[t * ldy + n + i] = _mm512_reduce_add_ps(acc[i][t]) + (bias ? bias[n + i] : 0.0f);
}

/// The same at the AVX2 level: 16 columns a step, R x TG <= 4 (16 registers).
template <int R, int TG>
MOERT_AVX2 void rowsAvx2(const Matrix &w, int64_t n, const float *bias, float *y, int64_t ldy) {
  const QuantisedTokens &q = quantised;
  const int16_t *xq = q.values.data();
  const float *xs = q.scales.data();
  const int64_t ldq = q.ld, blocks = q.blocks, ahead = R == 1 ? kRowPrefetchBytes : 2 * R * w.rowStride;
  const uint8_t *rows[R];
  const float *rowScales[R];
  __m256 acc[R][TG];
  for (int i = 0; i < R; ++i) {
    rows[i] = rowBytes(w, n + i);
    rowScales[i] = Blocks(w, n + i).scales;
    for (int t = 0; t < TG; ++t)
      acc[i][t] = _mm256_setzero_ps();
  }
  int64_t b = 0;
  alignas(16) uint8_t tail[R][16];
  for (Blocks run(w, n); run.next(); ++b) {
    __m256i sum[R][TG];
    for (int i = 0; i < R; ++i)
      for (int t = 0; t < TG; ++t)
        sum[i][t] = _mm256_setzero_si256();
    for (int64_t c = run.c0; c < run.c1; c += 16) {
      const int64_t left = run.c1 - c;
      __m256i wv[R];
      for (int i = 0; i < R; ++i) {
        const uint8_t *from = rows[i] + c;
        if (left < 16) { // the block's last bytes, zero after them
          std::fill(tail[i], tail[i] + 16, 0);
          std::copy(from, from + left, tail[i]);
          from = tail[i];
        } else if ((c & 63) == 0) { // (the next group's rows, as above)
          _mm_prefetch(reinterpret_cast<const char *>(from + ahead), _MM_HINT_T1);
        }
        wv[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(from)));
      }
      for (int t = 0; t < TG; ++t) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(xq + t * ldq + c));
        for (int i = 0; i < R; ++i)
          sum[i][t] = _mm256_add_epi32(sum[i][t], _mm256_madd_epi16(wv[i], xv));
      }
    }
    for (int t = 0; t < TG; ++t)
      for (int i = 0; i < R; ++i)
        acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[i][t]),
                                    _mm256_set1_ps(rowScales[i][b] * xs[t * blocks + b]),
                                    acc[i][t]);
  }
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < TG; ++t)
      y[t * ldy + n + i] = horizontalSum(acc[i][t]) + (bias ? bias[n + i] : 0.0f);
}

using Rows = void (*)(const Matrix &, int64_t, const float *, float *, int64_t);

/// A kernel for `rows` rows at once, and one for a single row (the last
/// rows of a range).
struct Kernels {
  Rows group;
  int64_t rows;
  Rows one;
};

/// The kernels for `tokens`: R rows at once where R x TG accumulators fit
/// the registers.
template <template <int, int> class K>
Kernels pick(int64_t tokens) {
  switch (tokens) {
  case 1: return {K<4, 1>::f, K<4, 1>::rows, K<1, 1>::f};
  case 2: return {K<4, 2>::f, K<4, 2>::rows, K<1, 2>::f};
  case 3: return {K<2, 3>::f, K<2, 3>::rows, K<1, 3>::f};
  default: return {K<2, 4>::f, K<2, 4>::rows, K<1, 4>::f};
  }
}
template <int R, int TG> struct Avx512 {
  static constexpr Rows f = rowsAvx512<R, TG, R * TG < 4 ? 4 / (R * TG) : 1>;
  static constexpr int64_t rows = R;
};
template <int R, int TG> struct Avx2 { // (16 registers: R x TG <= 4)
  static constexpr int64_t rows = R * TG > 4 ? 4 / TG : R;
  static constexpr Rows f = rowsAvx2<rows, TG>;
};

bool haveVnni() {
  static const bool has = __builtin_cpu_supports("avx512vnni");
  return has;
}
#endif // MOERT_X86

} // namespace

bool gemvInt8(const float *x, int64_t ldx, int64_t tokens, const Matrix &w, const float *bias,
              int64_t n0, int64_t n1, float *y, int64_t ldy) {
#ifdef MOERT_X86
  if (tokens > kMaxTokens || !haveAvx2() || w.scales.blockRows != 1 ||
      !quantiseTokens(x, ldx, tokens, w))
    return false;
  const Kernels kernels = haveAvx512() && haveVnni() ? pick<Avx512>(tokens) : pick<Avx2>(tokens);
  int64_t n = n0;
  for (; n + kernels.rows <= n1; n += kernels.rows)
    kernels.group(w, n, bias, y, ldy);
  for (; n < n1; ++n)
    kernels.one(w, n, bias, y, ldy);
  return true;
#else
  (void)x, (void)ldx, (void)tokens, (void)w, (void)bias, (void)n0, (void)n1, (void)y, (void)ldy;
  return false;
#endif
}

void dequantiseRowInt8(const Matrix &w, int64_t r, float *out) {
  const auto *q = reinterpret_cast<const int8_t *>(rowBytes(w, r));
  for (Blocks b(w, r); b.next();)
    for (int64_t c = b.c0; c < b.c1; ++c)
      out[c] = static_cast<float>(q[c]) * b.scale;
}

} // namespace moert::cpu::gemm
