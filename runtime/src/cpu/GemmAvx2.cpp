// The matrix products under `linear` for AVX2 + FMA CPUs (F16C widens f16):
// the structure of the AVX-512 kernels in Gemm.cpp, sized for 16 ymm
// registers and the smaller caches of the CPUs that lack AVX-512 (Haswell,
// Zen 1-3: 32 KiB L1d, 256-512 KiB L2 per core).
//
// GEMM (y = x w^T, x [T, K] f32, w [N, K] any float dtype), BLIS-style:
//   for each chunk of kNC output columns, for each kKC-deep slice of K:
//     pack the weights' slice, widened to f32 and transposed, into panels of
//     kNR = 16 columns ([k][16], 256 KiB in all: L2-resident);
//     for each block of <= 6 tokens, run the micro-kernel over every panel:
//       a 6 x 16 tile of y in 12 registers, per k two panel loads and six
//       broadcasts from x's rows (6 x kc floats, L1-resident for all the
//       panels; packing them cost more than it saved) feeding 12 FMAs.
// GEMV (tokens <= kGemvMaxTokensAvx2, decode): every weight row is read from
// memory once, widened on the fly, and dotted with up to 6 tokens' x.
#include "Gemm.h"

#ifdef MOERT_X86
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

namespace moert::cpu::gemm {
#ifdef MOERT_X86
namespace {

constexpr int kNR = 16;               // tile width (output columns): 2 ymm
static_assert(kColumnBlock % kNR == 0, "threads split on tile boundaries");
constexpr int kMaxMR = 6;             // tile height: 12 accumulators + 3 of 16 ymm
constexpr int64_t kKC = 256;          // K slice: a 16 KiB weight panel + 6 KiB of x in L1
constexpr int64_t kNC = 256;          // column chunk: 256 KiB of packed weights in L2
constexpr int kGemvGroup = 6;         // tokens whose x one weight vector feeds

thread_local Scratch packedWeights, packedTokens;

/// 8 consecutive elements at p, widened to f32.
template <DType D>
MOERT_AVX2 inline __m256 load8(const void *p) {
  if constexpr (D == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float *>(p));
  } else {
    __m128i h = _mm_loadu_si128(static_cast<const __m128i *>(p));
    if constexpr (D == DType::BF16)
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    else
      return _mm256_cvtph_ps(h);
  }
}

/// The first `count` (0..8) elements at p, the others zero.
template <DType D>
MOERT_AVX2 inline __m256 load8Partial(const void *p, int64_t count) {
  if (count >= 8)
    return load8<D>(p);
  alignas(32) std::array<uint8_t, 32> buffer{};
  if (count > 0)
    std::memcpy(buffer.data(), p, static_cast<size_t>(count * kElementSize<D>));
  return load8<D>(buffer.data());
}

/// In-register transpose of an 8x8 f32 block: r[i] lane j <-> r[j] lane i.
MOERT_AVX2 inline void transpose8(__m256 r[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    s[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(s[i], s[4 + i], 0x20);
    r[4 + i] = _mm256_permute2f128_ps(s[i], s[4 + i], 0x31);
  }
}

template <DType D>
MOERT_AVX2 void widen(const void *src, int64_t n, float *out) {
  const char *p = static_cast<const char *>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, load8<D>(p + i * kElementSize<D>));
  if (i < n) {
    alignas(32) float tail[8];
    _mm256_store_ps(tail, load8Partial<D>(p + i * kElementSize<D>, n - i));
    std::copy_n(tail, n - i, out + i);
  }
}

//===----------------------------------------------------------------------===//
// GEMM
//===----------------------------------------------------------------------===//

/// Packs weight rows [n0, n0 + nc) x columns [k0, k0 + kc), widened to f32,
/// into panels of kNR rows laid out [k][kNR] (rows past nc are zero).
template <DType D>
MOERT_AVX2 void packWeights(const Matrix &w, int64_t n0, int64_t nc, int64_t k0, int64_t kc,
                            float *out) {
  constexpr int64_t size = kElementSize<D>;
  const int64_t rowBytes = w.rowStride * size;
  const int64_t rows = (nc + kNR - 1) / kNR * kNR;
  if (w.transposed) { // one k's 8 weights are consecutive: no transpose
    const char *base = static_cast<const char *>(w.data) + (k0 * w.rowStride + n0) * size;
    for (int64_t first = 0; first < rows; first += 8) {
      const int64_t valid = std::clamp<int64_t>(nc - first, 0, 8);
      float *dst = out + first / kNR * kNR * kc + first % kNR;
      for (int64_t k = 0; k < kc; ++k)
        _mm256_store_ps(dst + k * kNR, valid ? load8Partial<D>(base + k * rowBytes + first * size,
                                                                valid)
                                             : _mm256_setzero_ps());
    }
    return;
  }
  const char *base = static_cast<const char *>(w.data) + (n0 * w.rowStride + k0) * size;
  for (int64_t first = 0; first < rows; first += 8) {
    const int64_t valid = std::clamp<int64_t>(nc - first, 0, 8);
    const char *src = base + first * rowBytes;
    float *dst = out + first / kNR * kNR * kc + first % kNR;
    for (int64_t kk = 0; kk < kc; kk += 8) {
      const int64_t depth = std::min<int64_t>(8, kc - kk);
      __m256 r[8];
      for (int i = 0; i < 8; ++i)
        r[i] = i < valid ? load8Partial<D>(src + i * rowBytes + kk * size, depth)
                         : _mm256_setzero_ps();
      transpose8(r);
      for (int64_t j = 0; j < depth; ++j)
        _mm256_store_ps(dst + (kk + j) * kNR, r[j]);
    }
  }
}

/// c[MR, nvalid] (row stride ldc) = a (MR rows of x, stride lda) x b-panel over kc, plus c when
/// `accumulate` (later K slices), plus bias (the last K slice) when not null.
template <int MR>
MOERT_AVX2 void microKernel(int64_t kc, const float *a, int64_t lda, const float *b, float *c,
                            int64_t ldc, int64_t nvalid, bool accumulate, const float *bias) {
  // Every loop over the tile is unrolled: an accumulator indexed at run
  // time would live in memory, stored on every k.
  __m256 acc[MR][2];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r)
    acc[r][0] = acc[r][1] = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b + k * kNR), b1 = _mm256_load_ps(b + k * kNR + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + k);
      acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    float *p = c + r * ldc;
    if (nvalid == kNR) {
      for (int v = 0; v < 2; ++v) {
        __m256 value = acc[r][v];
        if (accumulate)
          value = _mm256_add_ps(value, _mm256_loadu_ps(p + 8 * v));
        if (bias)
          value = _mm256_add_ps(value, _mm256_loadu_ps(bias + 8 * v));
        _mm256_storeu_ps(p + 8 * v, value);
      }
      continue;
    }
    alignas(32) float tile[kNR];
    _mm256_store_ps(tile, acc[r][0]);
    _mm256_store_ps(tile + 8, acc[r][1]);
    for (int64_t j = 0; j < nvalid; ++j)
      p[j] = tile[j] + (accumulate ? p[j] : 0.0f) + (bias ? bias[j] : 0.0f);
  }
}

using MicroKernel = void (*)(int64_t, const float *, int64_t, const float *, float *, int64_t,
                             int64_t, bool, const float *);

template <size_t... MR>
constexpr auto microKernelTable(std::index_sequence<MR...>) {
  return std::array<MicroKernel, sizeof...(MR)>{{microKernel<static_cast<int>(MR) + 1>...}};
}
const auto kMicroKernels = microKernelTable(std::make_index_sequence<kMaxMR>());

template <DType D>
MOERT_AVX2 void gemm(const float *x, int64_t ldx, int64_t tokens, const Matrix &w,
                     const float *bias, int64_t n0, int64_t n1, float *y, int64_t ldy) {
  const int64_t K = w.cols;
  // Balanced token blocks: 128 tokens are 18x6 + 4x5, not 21x6 + 2 (a thin
  // tail tile runs far below peak).
  const int64_t tokenBlocks = (tokens + kMaxMR - 1) / kMaxMR;
  const int64_t kStep = balancedStep(K, kKC, 8);
  const int64_t nStep = balancedStep(n1 - n0, kNC, kNR);
  float *weights = packedWeights.get(static_cast<size_t>(kStep * nStep));
  for (int64_t jc = n0; jc < n1; jc += nStep) {
    const int64_t nc = std::min(nStep, n1 - jc);
    for (int64_t pc = 0; pc < K; pc += kStep) {
      const int64_t kc = std::min(kStep, K - pc);
      packWeights<D>(w, jc, nc, pc, kc, weights);
      const float *lastBias = pc + kc == K && bias ? bias + jc : nullptr;
      for (int64_t blk = 0; blk < tokenBlocks; ++blk) {
        const int64_t t0 = tokens * blk / tokenBlocks, t1 = tokens * (blk + 1) / tokenBlocks;
        const int mr = static_cast<int>(t1 - t0);
        MicroKernel kernel = kMicroKernels[mr - 1];
        for (int64_t jp = 0; jp < nc; jp += kNR)
          kernel(kc, x + t0 * ldx + pc, ldx, weights + jp * kc, y + t0 * ldy + jc + jp, ldy,
                 std::min<int64_t>(kNR, nc - jp), pc > 0, lastBias ? lastBias + jp : nullptr);
      }
    }
  }
}

//===----------------------------------------------------------------------===//
// GEMV
//===----------------------------------------------------------------------===//

/// x for the GEMV, [ceil(K/8) steps][T][8] and zero past K: each step of a
/// token group is one stream of aligned vectors.
MOERT_AVX2 void packGemvTokens(const float *x, int64_t ldx, int64_t tokens, int64_t K,
                               float *out) {
  for (int64_t k = 0; k < K; k += 8)
    for (int64_t t = 0; t < tokens; ++t, out += 8)
      _mm256_store_ps(out, load8Partial<DType::F32>(x + t * ldx + k, K - k));
}

/// y[t, r] (+ bias[r]) for TG tokens and the R weight rows at w. With
/// `prefetch`, also fetches the rows two tiles ahead into L2 (short rows
/// defeat the hardware prefetcher).
template <DType D, int TG, int R>
MOERT_AVX2 void gemvTile(const float *x, int64_t xStep, const char *w, int64_t rowBytes,
                         int64_t K, bool prefetch, const float *bias, float *y, int64_t ldy) {
  constexpr int64_t size = kElementSize<D>;
  constexpr int64_t stepsPerLine = 64 / (8 * size);
  __m256 acc[R][TG]; // loops over it unrolled: registers, not memory
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 6
    for (int t = 0; t < TG; ++t)
      acc[r][t] = _mm256_setzero_ps();
  auto step = [&](int64_t s, int64_t count) MOERT_AVX2 {
    __m256 wv[R];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r)
      wv[r] = count >= 8 ? load8<D>(w + r * rowBytes + s * 8 * size)
                         : load8Partial<D>(w + r * rowBytes + s * 8 * size, count);
#pragma GCC unroll 6
    for (int t = 0; t < TG; ++t) {
      const __m256 xv = _mm256_load_ps(x + s * xStep + 8 * t);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r)
        acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  };
  const int64_t full = K / 8;
  int64_t s = 0;
  for (; s + stepsPerLine <= full; s += stepsPerLine) {
    if (prefetch)
      for (int r = 0; r < R; ++r)
        _mm_prefetch(w + (2 * R + r) * rowBytes + s * 8 * size, _MM_HINT_T1);
    for (int64_t i = 0; i < stepsPerLine; ++i)
      step(s + i, 8);
  }
  for (; s < full; ++s)
    step(s, 8);
  if (full * 8 < K)
    step(full, K - full * 8);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 6
    for (int t = 0; t < TG; ++t)
      y[t * ldy + r] = horizontalSum(acc[r][t]) + (bias ? bias[r] : 0.0f);
}

/// gemvTile's contract for one token and one row (decode): four
/// accumulator chains. Decoding one token then reads the rows one after
/// another, one sequential stream per thread, prefetched kRowPrefetchBytes
/// ahead into L2 (as gemvRow of the AVX-512 path).
template <DType D>
MOERT_AVX2 void gemvRow(const float *x, int64_t xStep, const char *w, int64_t, int64_t K, bool,
                        const float *bias, float *y, int64_t) {
  constexpr int64_t size = kElementSize<D>;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  const int64_t full = K / 8;
  int64_t s = 0;
  for (; s + 4 <= full; s += 4) {
    for (int64_t line = 0; line < 32 * size; line += 64)
      _mm_prefetch(w + s * 8 * size + kRowPrefetchBytes + line, _MM_HINT_T1);
    for (int j = 0; j < 4; ++j)
      acc[j] = _mm256_fmadd_ps(load8<D>(w + (s + j) * 8 * size),
                               _mm256_load_ps(x + (s + j) * xStep), acc[j]);
  }
  for (; s < full; ++s)
    acc[0] = _mm256_fmadd_ps(load8<D>(w + s * 8 * size), _mm256_load_ps(x + s * xStep), acc[0]);
  if (full * 8 < K)
    acc[1] = _mm256_fmadd_ps(load8Partial<D>(w + full * 8 * size, K - full * 8),
                             _mm256_load_ps(x + full * xStep), acc[1]);
  __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  y[0] = horizontalSum(sum) + (bias ? bias[0] : 0.0f);
}

using GemvTile = void (*)(const float *, int64_t, const char *, int64_t, int64_t, bool,
                          const float *, float *, int64_t);

template <DType D, int TG>
GemvTile gemvTileRows(int rows) {
  switch (rows) {
  case 1:
    if constexpr (TG == 1)
      return gemvRow<D>;
    else
      return gemvTile<D, TG, 1>;
  case 2: return gemvTile<D, TG, 2>;
  case 3: return gemvTile<D, TG, 3>;
  case 4: return gemvTile<D, TG, 4>;
  default: return gemvTile<D, TG, 6>;
  }
}

template <DType D>
GemvTile gemvTileFor(int tokens, int rows) {
  switch (tokens) {
  case 1: return gemvTileRows<D, 1>(rows);
  case 2: return gemvTileRows<D, 2>(rows);
  case 3: return gemvTileRows<D, 3>(rows);
  case 4: return gemvTileRows<D, 4>(rows);
  case 5: return gemvTileRows<D, 5>(rows);
  default: return gemvTileRows<D, 6>(rows);
  }
}

/// Few tokens: every weight row is read from memory once, widened on the
/// fly, and dotted with all tokens' x, 6 tokens at a time (the rows stay in
/// L1 for the later groups).
template <DType D>
MOERT_AVX2 void gemvPacked(const float *packed, int64_t tokens, const Matrix &w,
                           const float *bias, int64_t n0, int64_t n1, float *y, int64_t ldy) {
  constexpr int64_t size = kElementSize<D>;
  const int64_t K = w.cols, rowBytes = w.rowStride * size, xStep = tokens * 8;
  // Rows per tile: R weight vectors, one x vector and R x TG accumulators
  // within the 16 ymm registers.
  const int64_t group = std::min<int64_t>(tokens, kGemvGroup);
  // One token: F32 rows one at a time (gemvRow); BF16 rows 4 at a time,
  // prefetched two tiles on (bench-moe BF16 decode under MOERT_ISA=avx2 on
  // Zen 4, interleaved: 70-77 -> 81-85 tok/s; F32 and the AVX-512 GEMV
  // showed no difference either way).
  const int rows = group == 1 ? (D == DType::BF16 ? 4 : 1) : group == 2 ? 4 : group == 3 ? 3 : 2;
  const char *base = static_cast<const char *>(w.data);
  for (int64_t n = n0; n < n1;) {
    const bool full = n + rows <= n1; // else single rows up to n1
    for (int64_t t = 0; t < tokens; t += kGemvGroup) {
      const int count = static_cast<int>(std::min<int64_t>(kGemvGroup, tokens - t));
      gemvTileFor<D>(count, full ? rows : 1)(packed + t * 8, xStep, base + n * rowBytes,
                                             rowBytes, K, t == 0 && full && rows > 1,
                                             bias ? bias + n : nullptr, y + t * ldy + n, ldy);
    }
    n += full ? rows : 1;
  }
}

template <DType D>
void columns(const float *x, int64_t ldx, int64_t tokens, const Matrix &w, const float *bias,
             int64_t n0, int64_t n1, float *y, int64_t ldy) {
  if (tokens <= kGemvMaxTokensAvx2 && !w.transposed) {
    float *packed = packedTokens.get(static_cast<size_t>(gemvTokensSizeAvx2(tokens, w.cols)));
    packGemvTokens(x, ldx, tokens, w.cols, packed);
    gemvPacked<D>(packed, tokens, w, bias, n0, n1, y, ldy);
  } else {
    gemm<D>(x, ldx, tokens, w, bias, n0, n1, y, ldy);
  }
}

} // namespace

void packGemvTokensAvx2(const float *x, int64_t ldx, int64_t tokens, int64_t K, float *out) {
  packGemvTokens(x, ldx, tokens, K, out);
}

void gemvPackedAvx2(const float *packed, int64_t tokens, const Matrix &w, const float *bias,
                    int64_t n0, int64_t n1, float *y, int64_t ldy) {
  forFloatDtype(w.dtype, [&](auto d) {
    gemvPacked<decltype(d)::value>(packed, tokens, w, bias, n0, n1, y, ldy);
  });
}

void columnsAvx2(const float *x, int64_t ldx, int64_t tokens, const Matrix &w, const float *bias,
                 int64_t n0, int64_t n1, float *y, int64_t ldy) {
  forFloatDtype(w.dtype, [&](auto d) {
    columns<decltype(d)::value>(x, ldx, tokens, w, bias, n0, n1, y, ldy);
  });
}

void gemmAvx2(const float *x, int64_t ldx, int64_t tokens, const Matrix &w, const float *bias,
              int64_t n0, int64_t n1, float *y, int64_t ldy) {
  forFloatDtype(w.dtype, [&](auto d) {
    gemm<decltype(d)::value>(x, ldx, tokens, w, bias, n0, n1, y, ldy);
  });
}

void widenAvx2(DType dtype, const void *src, int64_t n, float *out) {
  forFloatDtype(dtype, [&](auto d) { widen<decltype(d)::value>(src, n, out); });
}

#else
void columnsAvx2(const float *, int64_t, int64_t, const Matrix &, const float *, int64_t, int64_t,
                 float *, int64_t) {}
void gemmAvx2(const float *, int64_t, int64_t, const Matrix &, const float *, int64_t, int64_t,
              float *, int64_t) {}
void packGemvTokensAvx2(const float *, int64_t, int64_t, int64_t, float *) {}
void gemvPackedAvx2(const float *, int64_t, const Matrix &, const float *, int64_t, int64_t,
                    float *, int64_t) {}
void widenAvx2(DType, const void *, int64_t, float *) {}
#endif // MOERT_X86

} // namespace moert::cpu::gemm
