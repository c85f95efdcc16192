// The AVX-512 GEMV (tokens <= kGemvMaxTokensAvx512, decode): every weight row is
// read from memory once, widened on the fly, and dotted with the tokens' x
// (Gemm.h: gemvAvx512).
#include "Gemm.h"
#include "LoadAvx512.h"

#include <algorithm>

namespace moert::cpu::gemm {
#ifdef MOERT_X86
namespace {

thread_local Scratch packedTokens;

/// x for the GEMV, [ceil(K/16) steps][T][16] and zero past K: each step of
/// a token group is one stream of aligned vectors. (x's own rows are often
/// 4 KiB apart, and eight such streams thrash one L1 set.)
MOERT_AVX512 void packGemvTokens(const float *x, int64_t ldx, int64_t tokens, int64_t K,
                                 float *out) {
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 mask = firstLanes(K - k);
    for (int64_t t = 0; t < tokens; ++t, out += 16)
      _mm512_store_ps(out, _mm512_maskz_loadu_ps(mask, x + t * ldx + k));
  }
}

/// The same, x rounded to bf16 (roundsToBf16(): the GEMM's contract, so
/// that few and many tokens compute the same products).
MOERT_AVX512_BF16 void packGemvTokensBf16(const float *x, int64_t ldx, int64_t tokens, int64_t K,
                                          float *out) {
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 mask = firstLanes(K - k);
    for (int64_t t = 0; t < tokens; ++t, out += 16)
      _mm512_store_ps(out, _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x + t * ldx + k))));
  }
}

/// One 16-wide step of K: TG token vectors times R widened weight rows.
template <DType D, int TG, int R, bool Masked>
MOERT_AVX512 inline __attribute__((always_inline)) void gemvStep(__m512 (&acc)[R][TG],
                                                                 const float *x, const char *w,
                                                                 int64_t rowBytes,
                                                                 __mmask16 mask) {
  __m512 xv[TG];
  for (int t = 0; t < TG; ++t)
    xv[t] = _mm512_load_ps(x + 16 * t);
  for (int r = 0; r < R; ++r) {
    __m512 wv = Masked ? load16<D>(w + r * rowBytes, mask) : load16<D>(w + r * rowBytes);
    for (int t = 0; t < TG; ++t)
      acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
  }
}

/// y[t, r] (+ bias[r]) for TG tokens and the R weight rows at w: each
/// widened weight vector feeds all TG tokens' x vectors (in registers). With
/// `prefetch`, also fetches the rows two tiles ahead into L2: short rows
/// defeat the hardware prefetcher, and on Zen 4 this lifts one core's
/// streaming from ~12 to ~20 GB/s (into L1 it gains nothing).
template <DType D, int TG, int R>
MOERT_AVX512 void gemvTile(const float *x, int64_t xStep, const char *w, int64_t rowBytes,
                           int64_t K, bool prefetch, const float *bias, float *y, int64_t ldy) {
  constexpr int64_t size = kElementSize<D>;
  __m512 acc[R][TG];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TG; ++t)
      acc[r][t] = _mm512_setzero_ps();
  const int64_t full = K / 16;
  int64_t s = 0;
  for (; s + 2 <= full; s += 2) {
    if (prefetch) // two steps read 32 * size bytes of each row
      for (int r = 0; r < R; ++r)
        for (int64_t line = 0; line < 32 * size; line += 64)
          _mm_prefetch(w + (2 * R + r) * rowBytes + s * 16 * size + line, _MM_HINT_T1);
    gemvStep<D, TG, R, false>(acc, x + s * xStep, w + s * 16 * size, rowBytes, 0);
    gemvStep<D, TG, R, false>(acc, x + (s + 1) * xStep, w + (s + 1) * 16 * size, rowBytes, 0);
  }
  for (; s < full; ++s)
    gemvStep<D, TG, R, false>(acc, x + s * xStep, w + s * 16 * size, rowBytes, 0);
  if (full * 16 < K)
    gemvStep<D, TG, R, true>(acc, x + full * xStep, w + full * 16 * size, rowBytes,
                             firstLanes(K - full * 16));
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TG; ++t)
      y[t * ldy + r] = _mm512_reduce_add_ps(acc[r][t]) + (bias ? bias[r] : 0.0f);
}

/// gemvTile's contract for one token and one row (decode): four
/// accumulator chains. Decoding one token reads the rows one after another,
/// a single sequential stream per thread: on Zen 4 twice the bandwidth of
/// tiles of 8 interleaved rows with L2 prefetch (bench-moe BF16 decode 60 ->
/// 112 tok/s in the same minute). On an Intel Xeon (2.5 GHz, 2 threads) the
/// hardware prefetcher alone streams 15-18 GB/s and a software prefetch
/// kRowPrefetchBytes ahead 18-21 GB/s (moe-gemm-bench --mmap, T=1; bench-moe
/// BF16 decode ~10% faster, paired runs).
template <DType D>
MOERT_AVX512 void gemvRow(const float *x, int64_t xStep, const char *w, int64_t, int64_t K, bool,
                          const float *bias, float *y, int64_t) {
  constexpr int64_t size = kElementSize<D>;
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  const int64_t full = K / 16;
  int64_t s = 0;
  for (; s + 4 <= full; s += 4) {
    // The stream's lines kRowPrefetchBytes ahead (past this row's end: the
    // next row's, as the rows of a matrix are contiguous), into L2.
    for (int64_t line = 0; line < 64 * size; line += 64)
      _mm_prefetch(w + s * 16 * size + kRowPrefetchBytes + line, _MM_HINT_T1);
    for (int j = 0; j < 4; ++j)
      acc[j] = _mm512_fmadd_ps(load16<D>(w + (s + j) * 16 * size),
                               _mm512_load_ps(x + (s + j) * xStep), acc[j]);
  }
  for (; s < full; ++s)
    acc[0] = _mm512_fmadd_ps(load16<D>(w + s * 16 * size), _mm512_load_ps(x + s * xStep), acc[0]);
  if (full * 16 < K)
    acc[1] = _mm512_fmadd_ps(load16<D>(w + full * 16 * size, firstLanes(K - full * 16)),
                             _mm512_load_ps(x + full * xStep), acc[1]);
  __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
  y[0] = _mm512_reduce_add_ps(sum) + (bias ? bias[0] : 0.0f);
}

using GemvTile = void (*)(const float *, int64_t, const char *, int64_t, int64_t, bool,
                          const float *, float *, int64_t);

/// The tile for TG tokens x R rows, among the shapes the GEMV uses (gemv):
/// groups of 4 or 3 tokens over 6 rows, 3 or 2 over 8, 2 over 6, and any
/// group over one row (the edge of the columns).
template <DType D>
GemvTile gemvTileFor(int tokens, int rows) {
  switch (rows * 16 + tokens) {
  case 8 * 16 + 2: return gemvTile<D, 2, 8>;
  case 8 * 16 + 3: return gemvTile<D, 3, 8>;
  case 6 * 16 + 2: return gemvTile<D, 2, 6>;
  case 6 * 16 + 3: return gemvTile<D, 3, 6>;
  case 6 * 16 + 4: return gemvTile<D, 4, 6>;
  case 1 * 16 + 1: return gemvRow<D>;
  case 1 * 16 + 2: return gemvTile<D, 2, 1>;
  case 1 * 16 + 3: return gemvTile<D, 3, 1>;
  case 1 * 16 + 4: return gemvTile<D, 4, 1>;
  }
  return nullptr;
}

/// Few tokens: every weight row is read from memory once, widened on the
/// fly, and dotted with all tokens' x, in near-equal groups of at most 4
/// tokens (the rows stay in L1 for the later groups). A group's x comes
/// from L1 or L2 once per tile of rows: 4 tokens over 6 rows load 4 x and
/// 6 weight vectors per 24 FMAs, where groups of 8 tokens over 2 rows
/// loaded 8 x vectors (from L2 once x outgrows L1) per 16 FMAs (Intel Xeon,
/// 2 threads, bf16, interleaved runs of moe-gemm-bench: T = 8 10-12 ->
/// 11-13 GB/s, T = 12 7.4-8.2 -> 9.1-9.8, T = 16 6.2-6.8 -> 7.6-8.1).
template <DType D>
MOERT_AVX512 void gemvPacked(const float *packed, int64_t tokens, const Matrix &w,
                             const float *bias, int64_t n0, int64_t n1, float *y, int64_t ldy) {
  constexpr int64_t size = kElementSize<D>;
  const int64_t K = w.cols, rowBytes = w.rowStride * size, xStep = tokens * 16;
  // Rows per tile: as many as keep R x TG accumulators and TG x vectors in
  // the 32 zmm registers.
  const TokenGroups groups(tokens);
  const int rows = tokens == 1 ? 1 : groups.largest() == 3 ? 8 : 6;
  const char *base = static_cast<const char *>(w.data);
  for (int64_t n = n0; n < n1;) {
    const bool full = n + rows <= n1; // else single rows up to n1
    groups.forEach([&](int64_t t, int64_t count) {
      GemvTile tile = gemvTileFor<D>(static_cast<int>(count), full ? rows : 1);
      tile(packed + t * 16, xStep, base + n * rowBytes, rowBytes, K, t == 0 && full && rows > 1,
           bias ? bias + n : nullptr, y + t * ldy + n, ldy);
    });
    n += full ? rows : 1;
  }
}

} // namespace

int64_t gemvTokensSizeAvx512(int64_t tokens, int64_t K) { return (K + 15) / 16 * tokens * 16; }

void packGemvTokensAvx512(const float *x, int64_t ldx, int64_t tokens, int64_t K, DType dtype,
                          float *out) {
  if (roundsToBf16(dtype))
    packGemvTokensBf16(x, ldx, tokens, K, out);
  else
    packGemvTokens(x, ldx, tokens, K, out);
}

void gemvPackedAvx512(const float *packed, int64_t tokens, const Matrix &w, const float *bias,
                      int64_t n0, int64_t n1, float *y, int64_t ldy) {
  forFloatDtype(w.dtype, [&](auto d) {
    gemvPacked<decltype(d)::value>(packed, tokens, w, bias, n0, n1, y, ldy);
  });
}

void gemvAvx512(const float *x, int64_t ldx, int64_t tokens, const Matrix &w, const float *bias,
                int64_t n0, int64_t n1, float *y, int64_t ldy) {
  float *packed = packedTokens.get(static_cast<size_t>(gemvTokensSizeAvx512(tokens, w.cols)));
  packGemvTokensAvx512(x, ldx, tokens, w.cols, w.dtype, packed);
  gemvPackedAvx512(packed, tokens, w, bias, n0, n1, y, ldy);
}
#endif // MOERT_X86
} // namespace moert::cpu::gemm
