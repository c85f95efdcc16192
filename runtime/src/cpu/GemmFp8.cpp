// FP8 block-scaled weights under `linear` (float8_e4m3fn with one f32 scale
// per block, as DeepSeek-V3 and the FP8 Qwen3 releases publish them); the
// weight stays one byte per element in memory.
//
// What is computed: a BF16 model's FP8 weights take bf16 products exactly
// where its BF16 weights would (roundsToBf16, the avx512bf16 level): each
// dequantised value rounded to bf16, as DeepSeek's reference weight_dequant
// writes it, times x rounded to bf16. Everywhere else (F32 models, the lower
// levels, --matmul-precision f32) the products are exact f32 ones of the
// dequantised weight.
//
// Few tokens (decode, short prompts, experts' small blocks): GEMVs that
// read each row once and widen its bytes on the fly, 4 rows at a time (more
// lines in flight than one row's stream), each tile's rows reused from L1 by
// every group of up to 4 tokens.
//  - bf16 products, where the CPU has AVX512_VBMI (Zen 4, Sapphire Rapids),
//    up to kTableMaxTokens tokens: the bf16 values come from byte tables,
//    per block bf16(e4m3(m) * scale) for the 128 magnitudes, looked up 64
//    bytes at a time by vpermt2b (rebuilt every 128 rows: cheap next to the
//    128 x 128 weights they serve), then vdpbf16ps.
//  - exact products (F32 models, the avx512 and avx2 levels), up to
//    kFusedMaxTokens tokens: e4m3 -> f16 by shifts (the sign into bit 15,
//    exponent and mantissa below it: the f16 of the value / 2^8, subnormals
//    included) -> f32 by vcvtph2ps, products summed per block and scaled
//    once.
// Otherwise: a BF16 model's weights above the GEMV's tokens are
// dequantised and rounded to bf16 as the packed GEMM packs them
// (gemmScaledBf16); the rest are dequantised a chunk of rows at a time into
// f32 (or bf16) scratch, which the GEMM or GEMV of that dtype multiplies.
#include "BlockScaled.h"
#include "Gemm.h"
#include "LoadAvx512.h"

#include "moert/Error.h"

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

constexpr int64_t kFusedMaxTokens = 4;
/// Up to here the table GEMV (tableGemv) beats dequantising the rows.
constexpr int64_t kTableMaxTokens = 32;
thread_local Scratch dequantised, roundedTokens, quantisedTokens;

/// e4m3 -> float for every byte (exact).
struct E4m3Table {
  float value[256];
  E4m3Table() {
    for (int i = 0; i < 256; ++i)
      value[i] = e4m3ToFloat(static_cast<uint8_t>(i));
  }
};

void dequantiseRowScalar(const Matrix &w, int64_t r, float *out) {
  static const E4m3Table table;
  const uint8_t *q = rowBytes(w, r);
  for (Blocks b(w, r); b.next();)
    for (int64_t c = b.c0; c < b.c1; ++c)
      out[c] = table.value[q[c]] * b.scale;
}

#ifdef MOERT_X86
/// 16 e4m3 bytes as the f32 of their value / 2^8 (exact).
MOERT_AVX512 inline __m512 e4m3x16(__m128i bytes) {
  const __m256i words = _mm256_cvtepi8_epi16(bytes); // sign-extended
  const __m256i half = _mm256_and_si256(_mm256_slli_epi16(words, 7), _mm256_set1_epi16(-16385));
  return _mm512_cvtph_ps(half);
}
/// 32 e4m3 bytes as the f16 bits of their value / 2^8 (for two vcvtph2ps).
MOERT_AVX512 inline __m512i e4m3Halves(__m256i bytes) {
  const __m512i words = _mm512_cvtepi8_epi16(bytes);
  return _mm512_and_si512(_mm512_slli_epi16(words, 7), _mm512_set1_epi16(-16385));
}
/// 8 e4m3 bytes (the low 8 of `bytes`), the same on 8 lanes.
MOERT_AVX2 inline __m256 e4m3x8(__m128i bytes) {
  const __m128i words = _mm_cvtepi8_epi16(bytes);
  const __m128i half = _mm_and_si128(_mm_slli_epi16(words, 7), _mm_set1_epi16(-16385));
  return _mm256_cvtph_ps(half);
}

MOERT_AVX512 void dequantiseRowAvx512(const Matrix &w, int64_t r, float *out) {
  const uint8_t *q = rowBytes(w, r);
  for (Blocks b(w, r); b.next();) {
    const __m512 scale = _mm512_set1_ps(b.scale * 256.0f);
    for (int64_t c = b.c0; c < b.c1; c += 16) {
      const __mmask16 mask = firstLanes(b.c1 - c);
      _mm512_mask_storeu_ps(out + c, mask,
                            _mm512_mul_ps(e4m3x16(_mm_maskz_loadu_epi8(mask, q + c)), scale));
    }
  }
}

MOERT_AVX2 void dequantiseRowAvx2(const Matrix &w, int64_t r, float *out) {
  const uint8_t *q = rowBytes(w, r);
  for (Blocks b(w, r); b.next();) {
    const __m256 scale = _mm256_set1_ps(b.scale * 256.0f);
    int64_t c = b.c0;
    for (; c + 8 <= b.c1; c += 8)
      _mm256_storeu_ps(out + c,
                       _mm256_mul_ps(e4m3x8(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(q + c))),
                                     scale));
    for (; c < b.c1; ++c)
      out[c] = e4m3ToFloat(q[c]) * b.scale;
  }
}

/// The scales of rows r0 .. r0 + R - 1 of w, each at its row's first block
/// (then one per column block, as Blocks walks them).
template <int R>
inline void rowScales(const Matrix &w, int64_t r0, const float *(&out)[R]) {
  const BlockScales &s = w.scales;
  for (int i = 0; i < R; ++i)
    out[i] = s.data + (s.rowOrigin + r0 + i) / s.blockRows * s.stride + s.colOrigin / s.blockCols;
}

/// The exact-product GEMV (F32 models, the avx512 level, --matmul-precision
/// f32) for TG tokens (x rows ldx apart) and rows r0 .. r0 + R - 1 of w:
/// exact f32 products of x and the e4m3 values (as value / 2^8), 32
/// weights a row and step (one sign extension to words for both halves),
/// summed per block and scaled once (a multiply per weight would cost the
/// decode a fifth of its speed). Each row's block scales are its own, so
/// the rows may span block rows. R rows stream at once and, with
/// `prefetch`, fetch the rows two tiles on into L2 (one row's stream alone
/// reads half as fast).
template <int R, int TG>
MOERT_AVX512 void exactTileAvx512(const float *x, int64_t ldx, const Matrix &w, int64_t r0,
                                  bool prefetch, const float *bias, float *y, int64_t ldy) {
  const int64_t stride = w.rowStride;
  const uint8_t *q = rowBytes(w, r0);
  const float *scales[R];
  rowScales<R>(w, r0, scales);
  __m512 acc[R][TG], part[R][TG];
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < TG; ++t)
      acc[i][t] = _mm512_setzero_ps();
  const int64_t ahead = prefetch ? 2 * R * stride : 0; // (0: no branch in the loop)
  int64_t j = 0; // the block (rowScales' index)
  for (Blocks b(w, r0); b.next(); ++j) {
    const int64_t c0 = b.c0, c1 = b.c1;
    for (int i = 0; i < R; ++i)
      for (int t = 0; t < TG; ++t)
        part[i][t] = _mm512_setzero_ps();
    for (int64_t c = c0; c < c1; c += 32) {
      const int64_t n = c1 - c;
      const __mmask32 mask = n >= 32 ? __mmask32(~0u) : __mmask32((1u << n) - 1);
      __m512 xv[TG][2];
      for (int t = 0; t < TG; ++t) {
        xv[t][0] = _mm512_maskz_loadu_ps(firstLanes(n), x + t * ldx + c);
        xv[t][1] = _mm512_maskz_loadu_ps(firstLanes(n - 16), x + t * ldx + c + 16);
      }
      for (int i = 0; i < R; ++i) {
        const uint8_t *row = q + i * stride + c;
        _mm_prefetch(reinterpret_cast<const char *>(row) + ahead, _MM_HINT_T1);
        const __m512i half = e4m3Halves(_mm256_maskz_loadu_epi8(mask, row));
        const __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(half)),
                     hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(half, 1));
        for (int t = 0; t < TG; ++t)
          part[i][t] = _mm512_fmadd_ps(hi, xv[t][1], _mm512_fmadd_ps(lo, xv[t][0], part[i][t]));
      }
    }
    for (int i = 0; i < R; ++i) {
      const __m512 scale = _mm512_set1_ps(scales[i][j] * 256.0f);
      for (int t = 0; t < TG; ++t)
        acc[i][t] = _mm512_fmadd_ps(part[i][t], scale, acc[i][t]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < TG; ++t)
      y[t * ldy + i] = _mm512_reduce_add_ps(acc[i][t]) + (bias ? bias[i] : 0.0f);
}

/// The same with bf16 products (roundsToBf16: the avx512bf16 level): each
/// dequantised value rounded to bf16 (DeepSeek's reference weight_dequant
/// writes them so) and dotted with x already rounded to bf16 (xb: TG rows
/// of ldxb bf16 values, zero past K) by vdpbf16ps, 32 products a time.
template <int TG>
MOERT_AVX512_BF16 void fusedRowBf16(const uint16_t *xb, int64_t ldxb, const Matrix &w, int64_t r,
                                    const float *bias, float *y, int64_t ldy) {
  const uint8_t *q = rowBytes(w, r);
  __m512 acc[TG];
  for (int t = 0; t < TG; ++t)
    acc[t] = _mm512_setzero_ps();
  for (Blocks b(w, r); b.next();) {
    const __m512 scale = _mm512_set1_ps(b.scale * 256.0f);
    for (int64_t c = b.c0; c < b.c1; c += 32) {
      if (((reinterpret_cast<uintptr_t>(q + c)) & 63) < 32)
        _mm_prefetch(reinterpret_cast<const char *>(q + c) + kRowPrefetchBytes, _MM_HINT_T1);
      const int64_t n = b.c1 - c;
      const __mmask32 mask = n >= 32 ? __mmask32(~0u) : __mmask32((1u << n) - 1);
      const __m512i half = e4m3Halves(_mm256_maskz_loadu_epi8(mask, q + c));
      const __m512 lo = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(half)), scale),
                   hi = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(half, 1)), scale);
      const __m512bh wv = _mm512_cvtne2ps_pbh(hi, lo);
      for (int t = 0; t < TG; ++t)
        acc[t] = _mm512_dpbf16_ps(
            acc[t], wv, reinterpret_cast<__m512bh>(_mm512_loadu_si512(xb + t * ldxb + c)));
    }
  }
  for (int t = 0; t < TG; ++t)
    y[t * ldy] = _mm512_reduce_add_ps(acc[t]) + (bias ? *bias : 0.0f);
}

/// Whether the CPU has AVX512_VBMI (vpermt2b) for the table GEMV below.
bool haveVbmi() {
  static const bool has = __builtin_cpu_supports("avx512vbmi");
  return has;
}

/// The e4m3 magnitudes 0..127 as f32 (127: NaN), for the tables.
struct Magnitudes {
  alignas(64) float value[128];
  Magnitudes() {
    for (int i = 0; i < 128; ++i)
      value[i] = e4m3ToFloat(static_cast<uint8_t>(i));
  }
};

/// For `count` blocks (scales): bf16(e4m3(m) * scale) for the 128
/// magnitudes m, as 128 high bytes then 128 low bytes (256 bytes a block:
/// the byte tables of vpermt2b). The sign is the e4m3 byte's own bit 7.
MOERT_AVX512_VBMI_BF16 void buildTables(const float *scales, int64_t count, uint8_t *out) {
  static const Magnitudes magnitudes;
  for (int64_t i = 0; i < count; ++i, out += 256) {
    const __m512 scale = _mm512_set1_ps(scales[i]);
    for (int j = 0; j < 128; j += 16) {
      const __m256i h = reinterpret_cast<__m256i>(
          _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_load_ps(magnitudes.value + j), scale)));
      _mm_storeu_si128(reinterpret_cast<__m128i *>(out + j),
                       _mm256_cvtepi16_epi8(_mm256_srli_epi16(h, 8)));
      _mm_storeu_si128(reinterpret_cast<__m128i *>(out + 128 + j), _mm256_cvtepi16_epi8(h));
    }
  }
}

/// x rounded to bf16 in the table GEMV's order: per 64 values at c, the 32
/// that vpunpcklbw pairs (c + 16 l + i, l = 0..3, i = 0..7), then the 32 of
/// vpunpckhbw (c + 16 l + 8 + i); zero past K. Per 64 values: two
/// conversions of 32 and two selections of 128-bit lanes.
MOERT_AVX512_VBMI_BF16 void packTableTokens(const float *x, int64_t ldx, int64_t tokens, int64_t K,
                                            int64_t ldxp, uint16_t *out) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < ldxp; c += 64) {
      const float *xt = x + t * ldx + c;
      __m512i half[2];
      for (int j = 0; j < 2; ++j)
        half[j] = reinterpret_cast<__m512i>(
            _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(firstLanes(K - c - 32 * j - 16), xt + 32 * j + 16),
                                _mm512_maskz_loadu_ps(firstLanes(K - c - 32 * j), xt + 32 * j)));
      // half[0]'s 128-bit lanes hold x[c + 8 l, + 8): lanes 0, 2 of each
      // half are the vpunpcklbw order's, lanes 1, 3 the vpunpckhbw order's.
      _mm512_storeu_si512(out + t * ldxp + c, _mm512_shuffle_i64x2(half[0], half[1], 0x88));
      _mm512_storeu_si512(out + t * ldxp + c + 32, _mm512_shuffle_i64x2(half[0], half[1], 0xdd));
    }
}

/// fusedRowBf16's result for TG tokens and the R rows at q (row stride
/// `stride`, one block row: the same byte tables, buildTables: `tables` is
/// the rows' first block's): 64 weights a step by two vpermt2b lookups
/// (high and low bytes of their bf16 values, the sign or-ed in) and two
/// byte interleaves, then vdpbf16ps with each token's x in the matching
/// order (packTableTokens). Blocks of a multiple of 64 columns that start at
/// a multiple of 64. One token keeps two chains a row (one would wait on
/// vdpbf16ps's latency); more tokens have a chain each. With `prefetch`,
/// the rows two tiles on are fetched into L2 as the tile streams (R
/// streams: more lines in flight than one row's).
template <int R, int TG>
MOERT_AVX512_VBMI_BF16 void tableTile(const uint16_t *xp, int64_t ldxp, const uint8_t *q,
                                      int64_t stride, int64_t K, const uint8_t *tables,
                                      int64_t firstEnd, int64_t blockCols, bool prefetch,
                                      const float *bias, float *y, int64_t ldy) {
  constexpr int C = TG == 1 ? 2 : 1;
  __m512 acc[R][TG][C];
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < TG; ++t)
      for (int j = 0; j < C; ++j)
        acc[i][t][j] = _mm512_setzero_ps();
  // (Without `prefetch`, the line about to be loaded: no branch in the
  // loop, whose accumulators GCC would otherwise keep in memory.)
  const int64_t ahead = prefetch ? 2 * R * stride : 0;
  for (int64_t c0 = 0, c1 = std::min(K, firstEnd); c0 < K;
       c0 = c1, c1 = std::min(K, c1 + blockCols), tables += 256) {
    const __m512i hi0 = _mm512_loadu_si512(tables), hi1 = _mm512_loadu_si512(tables + 64),
                  lo0 = _mm512_loadu_si512(tables + 128), lo1 = _mm512_loadu_si512(tables + 192);
    for (int64_t c = c0; c < c1; c += 64) {
      const __mmask64 mask = c1 - c >= 64 ? ~__mmask64(0) : (__mmask64(1) << (c1 - c)) - 1;
      for (int i = 0; i < R; ++i) {
        const uint8_t *row = q + i * stride;
        _mm_prefetch(reinterpret_cast<const char *>(row + c) + ahead, _MM_HINT_T1);
        const __m512i b = _mm512_maskz_loadu_epi8(mask, row + c);
        const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi0, b, hi1), b,
                                                     _mm512_set1_epi8(char(0x80)),
                                                     0xf8); // table | (b & 0x80)
        const __m512i lo = _mm512_permutex2var_epi8(lo0, b, lo1);
        const __m512bh w0 = reinterpret_cast<__m512bh>(_mm512_unpacklo_epi8(lo, hi)),
                       w1 = reinterpret_cast<__m512bh>(_mm512_unpackhi_epi8(lo, hi));
        for (int t = 0; t < TG; ++t) {
          const uint16_t *xt = xp + t * ldxp + c;
          acc[i][t][0] = _mm512_dpbf16_ps(acc[i][t][0], w0,
                                          reinterpret_cast<__m512bh>(_mm512_loadu_si512(xt)));
          acc[i][t][C - 1] = _mm512_dpbf16_ps(
              acc[i][t][C - 1], w1, reinterpret_cast<__m512bh>(_mm512_loadu_si512(xt + 32)));
        }
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < TG; ++t)
      y[t * ldy + i] = _mm512_reduce_add_ps(C == 2 ? _mm512_add_ps(acc[i][t][0], acc[i][t][C - 1])
                                                   : acc[i][t][0]) +
                       (bias ? bias[i] : 0.0f);
}

using TableTile = void (*)(const uint16_t *, int64_t, const uint8_t *, int64_t, int64_t,
                           const uint8_t *, int64_t, int64_t, bool, const float *, float *,
                           int64_t);
/// The table tile of `rows` (4, or 1 at the edges of a block row) and a
/// group of 1-4 tokens.
TableTile tableTileFor(int rows, int64_t tokens) {
  static constexpr TableTile tiles[2][4] = {
      {tableTile<1, 1>, tableTile<1, 2>, tableTile<1, 3>, tableTile<1, 4>},
      {tableTile<4, 1>, tableTile<4, 2>, tableTile<4, 3>, tableTile<4, 4>}};
  return tiles[rows == 4][tokens - 1];
}

thread_local std::vector<uint8_t> rowTables;

/// exactTileAvx512's contract at the AVX2 level: 8 weights a row and step
/// (F16C's conversion), a block's last few columns (< 8) one at a time.
template <int R, int TG>
MOERT_AVX2 void exactTileAvx2(const float *x, int64_t ldx, const Matrix &w, int64_t r0,
                              bool prefetch, const float *bias, float *y, int64_t ldy) {
  const int64_t stride = w.rowStride;
  const uint8_t *q = rowBytes(w, r0);
  const float *scales[R];
  rowScales<R>(w, r0, scales);
  __m256 acc[R][TG], part[R][TG];
  float tail[R][TG] = {};
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < TG; ++t)
      acc[i][t] = _mm256_setzero_ps();
  const int64_t ahead = prefetch ? 2 * R * stride : 0;
  int64_t j = 0; // the block (rowScales' index)
  for (Blocks b(w, r0); b.next(); ++j) {
    const int64_t c0 = b.c0, c1 = b.c1;
    for (int i = 0; i < R; ++i)
      for (int t = 0; t < TG; ++t)
        part[i][t] = _mm256_setzero_ps();
    int64_t c = c0;
    for (; c + 8 <= c1; c += 8) {
      __m256 xv[TG];
      for (int t = 0; t < TG; ++t)
        xv[t] = _mm256_loadu_ps(x + t * ldx + c);
      for (int i = 0; i < R; ++i) {
        const uint8_t *row = q + i * stride + c;
        if (!((c - c0) & 63)) // (a line a row: the branch is the same for all)
          _mm_prefetch(reinterpret_cast<const char *>(row) + ahead, _MM_HINT_T1);
        const __m256 wv = e4m3x8(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(row)));
        for (int t = 0; t < TG; ++t)
          part[i][t] = _mm256_fmadd_ps(wv, xv[t], part[i][t]);
      }
    }
    for (int i = 0; i < R; ++i) {
      const __m256 scale = _mm256_set1_ps(scales[i][j] * 256.0f);
      for (int t = 0; t < TG; ++t)
        acc[i][t] = _mm256_fmadd_ps(part[i][t], scale, acc[i][t]);
    }
    for (; c < c1; ++c)
      for (int i = 0; i < R; ++i) {
        const float v = e4m3ToFloat(q[i * stride + c]) * scales[i][j];
        for (int t = 0; t < TG; ++t)
          tail[i][t] += v * x[t * ldx + c];
      }
  }
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < TG; ++t)
      y[t * ldy + i] = horizontalSum(acc[i][t]) + tail[i][t] + (bias ? bias[i] : 0.0f);
}

/// The fused kernel's per-row function for `tokens` (<= 4) tokens.
template <typename Row, template <int> class Kernel>
Row pick(int64_t tokens) {
  switch (tokens) {
  case 1: return Kernel<1>::f;
  case 2: return Kernel<2>::f;
  case 3: return Kernel<3>::f;
  default: return Kernel<4>::f;
  }
}
using Bf16Row = void (*)(const uint16_t *, int64_t, const Matrix &, int64_t, const float *,
                         float *, int64_t);
using ExactTile = void (*)(const float *, int64_t, const Matrix &, int64_t, bool, const float *,
                           float *, int64_t);
/// The exact tile of R rows (1, 2 or 4) for a group of 1-4 tokens.
template <template <int, int> class Tile>
ExactTile exactTileOf(int rows, int64_t tokens) {
  static constexpr ExactTile tiles[3][4] = {
      {Tile<1, 1>::f, Tile<1, 2>::f, Tile<1, 3>::f, Tile<1, 4>::f},
      {Tile<2, 1>::f, Tile<2, 2>::f, Tile<2, 3>::f, Tile<2, 4>::f},
      {Tile<4, 1>::f, Tile<4, 2>::f, Tile<4, 3>::f, Tile<4, 4>::f}};
  return tiles[rows == 4 ? 2 : rows - 1][tokens - 1];
}
template <int R, int TG> struct Avx512Tile { static constexpr ExactTile f = exactTileAvx512<R, TG>; };
template <int R, int TG> struct Avx2Tile { static constexpr ExactTile f = exactTileAvx2<R, TG>; };

/// The exact-product GEMV (exactTileAvx512 / exactTileAvx2) over rows
/// [n0, n1): near-equal groups of at most 4 tokens over each tile of rows
/// (which stay in L1 for the later groups). A tile has as many rows as
/// keep the largest group's accumulators and x in registers (32 zmm, 16
/// ymm); the last rows go one at a time.
void exactGemv(const float *x, int64_t ldx, int64_t tokens, const Matrix &w, const float *bias,
               int64_t n0, int64_t n1, float *y, int64_t ldy) {
  const TokenGroups groups(tokens);
  const int64_t largest = groups.largest();
  const bool avx512 = haveAvx512();
  const int tileRows = avx512 ? (largest <= 2 ? 4 : 2) : (largest == 1 ? 4 : largest == 2 ? 2 : 1);
  for (int64_t n = n0; n < n1;) {
    const int rows = n + tileRows <= n1 ? tileRows : 1;
    groups.forEach([&](int64_t t, int64_t count) {
      const ExactTile tile = avx512 ? exactTileOf<Avx512Tile>(rows, count)
                                    : exactTileOf<Avx2Tile>(rows, count);
      tile(x + t * ldx, ldx, w, n, t == 0, bias ? bias + n : nullptr, y + t * ldy + n, ldy);
    });
    n += rows;
  }
}

template <int TG> struct Bf16RowOf { static constexpr Bf16Row f = fusedRowBf16<TG>; };

/// The bf16-product GEMV by tables, where it applies (false elsewhere):
/// rows [n0, n1), the tables rebuilt whenever the rows enter another block
/// row.
bool tableGemv(const float *x, int64_t ldx, int64_t tokens, const Matrix &w, const float *bias,
               int64_t n0, int64_t n1, float *y, int64_t ldy) {
  const BlockScales &b = w.scales;
  if (!haveVbmi() || b.blockCols % 64 || b.colOrigin % 64)
    return false;
  const int64_t K = w.cols, ldxp = (K + 63) / 64 * 64;
  auto *xp = reinterpret_cast<uint16_t *>(roundedTokens.get(static_cast<size_t>(tokens * ldxp / 2)));
  packTableTokens(x, ldx, tokens, K, ldxp, xp);
  const int64_t firstBlock = b.colOrigin / b.blockCols,
                blocks = (b.colOrigin + K + b.blockCols - 1) / b.blockCols - firstBlock,
                firstEnd = (firstBlock + 1) * b.blockCols - b.colOrigin;
  rowTables.resize(static_cast<size_t>(blocks * 256));
  // The BF16 GEMV's token groups: a tile's rows stay in L1 for the later groups.
  const TokenGroups groups(tokens);
  int64_t tablesOf = -1; // the block row rowTables hold
  for (int64_t n = n0; n < n1;) {
    const int64_t blockRow = (b.rowOrigin + n) / b.blockRows;
    if (blockRow != tablesOf) {
      buildTables(b.data + blockRow * b.stride + firstBlock, blocks, rowTables.data());
      tablesOf = blockRow;
    }
    // 4 rows at once where they share the block row.
    const int rows = n + 4 <= n1 && (b.rowOrigin + n + 3) / b.blockRows == blockRow ? 4 : 1;
    groups.forEach([&](int64_t t, int64_t count) {
      tableTileFor(rows, count)(xp + t * ldxp, ldxp, rowBytes(w, n), w.rowStride, K,
                                rowTables.data(), firstEnd, b.blockCols, t == 0,
                                bias ? bias + n : nullptr, y + t * ldy + n, ldy);
    });
    n += rows;
  }
  return true;
}
#endif // MOERT_X86

#ifdef MOERT_X86
/// v[0, n) rounded to bf16 in place (to the front half), 16 at a time.
MOERT_AVX512_BF16 void roundRowsBf16Avx512(float *v, int64_t n) {
  auto *h = reinterpret_cast<uint16_t *>(v);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) // reads v[i, i+16) before writing h[i, i+16)
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(h + i),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(v + i))));
  for (; i < n; ++i)
    h[i] = floatToBf16(v[i]);
}
#endif

/// The bf16 rows of the chunked path (bf16 products: the avx512bf16 level).
void roundRowsBf16(float *v, int64_t n) {
#ifdef MOERT_X86
  if (activeIsa() >= Isa::Avx512Bf16)
    return roundRowsBf16Avx512(v, n);
#endif
  auto *h = reinterpret_cast<uint16_t *>(v);
  for (int64_t i = 0; i < n; ++i)
    h[i] = floatToBf16(v[i]);
}

thread_local Scratch chunkTokens;

/// x packed for the GEMV that columns() takes for `tokens` tokens and
/// weights of `dtype` at the active level, in a buffer of this thread; null
/// where columns() takes no GEMV (more tokens, the generic level).
const float *packTokensForChunks(const float *x, int64_t ldx, int64_t tokens, int64_t K,
                                 DType dtype) {
#ifdef MOERT_X86
  if (haveAvx512() && tokens <= kGemvMaxTokensAvx512) {
    float *out = chunkTokens.get(static_cast<size_t>(gemvTokensSizeAvx512(tokens, K)));
    packGemvTokensAvx512(x, ldx, tokens, K, dtype, out);
    return out;
  }
  if (!haveAvx512() && haveAvx2() && tokens <= kGemvMaxTokensAvx2) {
    float *out = chunkTokens.get(static_cast<size_t>(gemvTokensSizeAvx2(tokens, K)));
    packGemvTokensAvx2(x, ldx, tokens, K, out);
    return out;
  }
#endif
  return nullptr;
}

/// columns() through the GEMV of packTokensForChunks' level with its x.
void gemvPacked(const float *packed, int64_t tokens, const Matrix &w, const float *bias,
                int64_t n0, int64_t n1, float *y, int64_t ldy) {
#ifdef MOERT_X86
  if (haveAvx512())
    return gemvPackedAvx512(packed, tokens, w, bias, n0, n1, y, ldy);
  gemvPackedAvx2(packed, tokens, w, bias, n0, n1, y, ldy);
#endif
}

/// Row r of w dequantised to f32 at the best level the CPU runs.
/// f as float8_e4m3fn (nearest even; from 448 on saturated, NaN kept): the
/// bits of moe_to_e4m3 of the CUDA kernels, and of floatToE4m3.
inline uint8_t toE4m3(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u)
    return sign | 0x7f;
  float a;
  std::memcpy(&a, &u, 4);
  if (a >= 464.0f)
    return sign | 0x7e;
  if (a < 0.015625f) // subnormal: multiples of 2^-9
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  u += 0x7ffffu + ((u >> 20) & 1u); // 3 mantissa bits, nearest even
  const uint32_t b = (((u >> 23) - 120u) << 3) | ((u >> 20) & 7u);
  return sign | static_cast<uint8_t>(b > 0x7eu ? 0x7eu : b);
}

/// DeepSeek's act_quant as values (docs/quantization.md, "Whose numbers"):
/// each group of 128 columns of each of the `tokens` rows of x (rounded to
/// bf16 first when `bf16`) scaled by s = amax / 448 (1 for an all-zero
/// group), e4m3(x / s) * s into q (row stride K).
void quantiseActivations(const float *x, int64_t ldx, int64_t tokens, int64_t K, bool bf16,
                         float *q) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float *row = x + t * ldx;
    float *out = q + t * K;
    for (int64_t g = 0; g < K; g += 128) {
      const int64_t end = std::min(K, g + 128);
      float amax = 0.0f;
      for (int64_t c = g; c < end; ++c) {
        out[c] = bf16 ? roundBf16(row[c]) : row[c];
        amax = std::max(amax, std::fabs(out[c]));
      }
      const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
      static const E4m3Table table;
      for (int64_t c = g; c < end; ++c)
        out[c] = table.value[toE4m3(out[c] / s)] * s;
    }
  }
}

void dequantiseRow(const Matrix &w, int64_t r, float *out) {
  if (w.dtype == DType::I8)
    return dequantiseRowInt8(w, r, out);
#ifdef MOERT_X86
  if (haveAvx512())
    return dequantiseRowAvx512(w, r, out);
  if (haveAvx2())
    return dequantiseRowAvx2(w, r, out);
#endif
  dequantiseRowScalar(w, r, out);
}

} // namespace

void columnsScaled(const float *x, int64_t ldx, int64_t tokens, const Matrix &w,
                   const float *bias, int64_t n0, int64_t n1, float *y, int64_t ldy) {
  if (w.transposed)
    runtimeError("not supported yet: products with the transpose of a block-scaled weight");
  const int64_t K = w.cols;
  if (w.dtype == DType::F8E4M3 && w.scales.quantiseActivations) {
    // Dynamic FP8 activations: the rows quantised per 128 columns (each
    // thread its copy: K values a token next to the K (n1 - n0) of its
    // products), then exact f32 products of the dequantised weight.
    float *q = quantisedTokens.get(static_cast<size_t>(tokens * K));
    quantiseActivations(x, ldx, tokens, K, w.scales.computeDtype == DType::BF16, q);
    Matrix exact = w;
    exact.scales.quantiseActivations = false;
    exact.scales.computeDtype = DType::F32;
    return columnsScaled(q, K, tokens, exact, bias, n0, n1, y, ldy);
  }
  if (w.dtype == DType::I8 && gemvInt8(x, ldx, tokens, w, bias, n0, n1, y, ldy))
    return;
  // A BF16 model's FP8 weights take bf16 products exactly where BF16
  // weights do (roundsToBf16): the dequantised values and x rounded to bf16.
  // Elsewhere (F32 models, the lower levels, --matmul-precision f32) the
  // products are exact f32 ones of the dequantised weight.
  const bool bf16 = w.scales.computeDtype == DType::BF16 && roundsToBf16(DType::BF16);
#ifdef MOERT_X86
  const bool fp8 = w.dtype == DType::F8E4M3;
  if (fp8 && tokens <= kTableMaxTokens && bf16 &&
      tableGemv(x, ldx, tokens, w, bias, n0, n1, y, ldy))
    return;
  if (fp8 && tokens <= kFusedMaxTokens && bf16) {
    // (A block run may start anywhere: its last 32-value load may reach 32
    // values past K, all zero.)
    const int64_t ldxb = (K + 31) / 32 * 32 + 32;
    auto *xb = reinterpret_cast<uint16_t *>(roundedTokens.get(static_cast<size_t>(tokens * ldxb / 2)));
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t k = 0; k < ldxb; ++k)
        xb[t * ldxb + k] = k < K ? floatToBf16(x[t * ldx + k]) : 0;
    const Bf16Row row = pick<Bf16Row, Bf16RowOf>(tokens);
    for (int64_t n = n0; n < n1; ++n)
      row(xb, ldxb, w, n, bias ? bias + n : nullptr, y + n, ldy);
    return;
  }
  if (fp8 && !bf16 && tokens <= kFusedMaxTokens && (haveAvx512() || haveAvx2()))
    return exactGemv(x, ldx, tokens, w, bias, n0, n1, y, ldy);
#endif
  if (bf16 && gemmScaledBf16(x, ldx, tokens, w, bias, n0, n1, y, ldy))
    return;
  // Few tokens take the GEMV over chunks of up to 1 MiB of dequantised rows,
  // with x packed for it once: each chunk reads x again for every group of
  // tokens, so chunks of 64 KiB (5 rows of K = 2816) read more x than
  // weights (MOERT_ISA=avx512, int8, 8-32 tokens: 63-88 -> 106-166
  // GFLOP/s). More tokens (at the avx2 level from kScaledGemvMaxTokensAvx2
  // on) take the packed GEMM over whole column blocks.
  const bool gemvChunks =
      haveAvx512() ? tokens <= kGemvMaxTokensAvx512 : tokens <= kScaledGemvMaxTokensAvx2;
  const int64_t bytesPerRow = K * static_cast<int64_t>(sizeof(float));
  int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 20) / bytesPerRow);
  if (!gemvChunks)
    chunk = std::max<int64_t>(kColumnBlock, std::min<int64_t>(512, (int64_t(2) << 20) / bytesPerRow) /
                                                kColumnBlock * kColumnBlock);
  chunk = std::min(chunk, n1 - n0);
  float *rows = dequantised.get(static_cast<size_t>(chunk * K));
  const float *packed =
      gemvChunks ? packTokensForChunks(x, ldx, tokens, K, bf16 ? DType::BF16 : DType::F32)
                 : nullptr;
  const bool gemmAvx2Chunks = !gemvChunks && !haveAvx512() && haveAvx2();
  for (int64_t n = n0; n < n1; n += chunk) {
    const int64_t m = std::min(chunk, n1 - n);
    for (int64_t r = 0; r < m; ++r)
      dequantiseRow(w, n + r, rows + r * K);
    Matrix d;
    d.dtype = DType::F32;
    d.data = rows;
    d.rows = m;
    d.cols = d.rowStride = K;
    if (bf16) { // rounded in place: the bf16 rows fill the buffer's front half
      roundRowsBf16(rows, m * K);
      d.dtype = DType::BF16;
    }
    if (packed)
      gemvPacked(packed, tokens, d, bias ? bias + n : nullptr, 0, m, y + n, ldy);
    else if (gemmAvx2Chunks)
      gemmAvx2(x, ldx, tokens, d, bias ? bias + n : nullptr, 0, m, y + n, ldy);
    else
      columns(x, ldx, tokens, d, bias ? bias + n : nullptr, 0, m, y + n, ldy);
  }
}

} // namespace moert::cpu::gemm
