// The matrix products under `linear`: a packed, register-blocked AVX-512 GEMM
// for many tokens, a weight-streaming GEMV for a few, and a portable scalar
// version of both; GemmAvx2.cpp has the AVX2 + FMA ones. The level is
// chosen at run time (moert/cpu/Isa.h).
//
// GEMM (y = x w^T, x [T, K] f32, w [N, K] any float dtype), BLIS-style:
//   for each chunk of kNC output columns, for each kKC-deep slice of K:
//     pack the weights' slice, widened to f32 and transposed, into panels of
//     kNR columns ([k][kNR], L2-resident);
//     for each block of <= kMaxMR tokens: pack x's slice ([k][16], L1) and
//       run the micro-kernel over every panel: an mr x kNR tile of y held in
//       registers (2 zmm per token), one broadcast of x and two panel loads
//       per k feeding 2*mr FMAs.
// BF16 weights under bf16Products() (moert/cpu/Isa.h, the avx512bf16 level)
// take the same loops with bf16 packing: weights packed as [k/2][kNR] pairs
// (not widened), x rounded to bf16 and packed as [k/2][16] pairs, and one
// vdpbf16ps per pair of k: twice the FMA's rate (measured on Zen 4: 460 vs
// 230 GFLOP/s on 2 cores), the products PyTorch's BF16 matmul computes.
//
// GEMV (tokens <= kGemvMaxTokensAvx512, decode; GemvAvx512.cpp): every weight row is read from
// memory once and widened on the fly; each widened vector feeds a group of
// up to 4 tokens' x vectors held in registers. Decode is bound by reading
// the weights, so they are not packed; up to 32 tokens this beats packing
// them (Intel Xeon, 2 threads, bf16 moe-gemm-bench: T=17 4.6-5.4 -> 6.6-7.0
// GB/s, T=24 4.1-4.7 -> 5.1-5.4, T=32 3.2-4.1 -> 4.1-4.2; at T=48 the GEMM
// is ahead, 2.7-3.2 against 2.4-2.9). With bf16 products (avx512bf16) the
// GEMM's vdpbf16ps rate moves that point down to 16 tokens
// (kGemvMaxTokensBf16).
#include "Gemm.h"
#include "LoadAvx512.h"

#include "moert/Error.h"

#ifdef MOERT_X86
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <new>
#include <utility>

namespace moert::cpu::gemm {
namespace {

constexpr int kNV = 2;                  // zmm vectors per tile row
constexpr int kNR = 16 * kNV;           // tile width (output columns)
static_assert(kNR == kColumnBlock, "threads split on tile boundaries");
constexpr int kMaxMR = 14;              // tile height (tokens): 28 accumulators of 32 zmm
static_assert(kMaxMR <= 16, "x is packed 16 tokens wide");
constexpr int64_t kKC = 256;            // K slice: x's packed block (16 KiB) stays in L1
constexpr int64_t kNC = 512;            // column chunk: packed weights (512 KiB) stay in L2

thread_local Scratch packedWeights, packedTokens, widenedRow;

//===----------------------------------------------------------------------===//
// Portable scalar versions
//===----------------------------------------------------------------------===//

void widenScalar(DType dtype, const void *src, int64_t n, float *out) {
  const auto *h = static_cast<const uint16_t *>(src);
  switch (dtype) {
  case DType::F32:
    std::copy_n(static_cast<const float *>(src), n, out);
    return;
  case DType::BF16:
    for (int64_t i = 0; i < n; ++i)
      out[i] = bf16ToFloat(h[i]);
    return;
  case DType::F16:
    for (int64_t i = 0; i < n; ++i)
      out[i] = f16ToFloat(h[i]);
    return;
  default:
    runtimeError("linear: weights must be F32, BF16 or F16, got {}", dtypeName(dtype));
  }
}

void columnsScalar(const float *x, int64_t ldx, int64_t tokens, const Matrix &w,
                   const float *bias, int64_t n0, int64_t n1, float *y, int64_t ldy) {
  int64_t K = w.cols;
  float *row = widenedRow.get(static_cast<size_t>(K));
  const int64_t size = static_cast<int64_t>(dtypeSize(w.dtype));
  for (int64_t n = n0; n < n1; ++n) {
    if (w.transposed) // a column of the storage, element by element
      for (int64_t k = 0; k < K; ++k)
        widenScalar(w.dtype, static_cast<const char *>(w.data) + (k * w.rowStride + n) * size, 1,
                    row + k);
    else
      widenScalar(w.dtype, rowAddress(w, n, 0), K, row);
    for (int64_t t = 0; t < tokens; ++t) {
      const float *xt = x + t * ldx;
      // Eight partial sums: independent chains the compiler can overlap.
      float s[8] = {};
      int64_t k = 0;
      for (; k + 8 <= K; k += 8)
        for (int j = 0; j < 8; ++j)
          s[j] += xt[k + j] * row[k + j];
      for (; k < K; ++k)
        s[0] += xt[k] * row[k];
      float sum = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
      y[t * ldy + n] = sum + (bias ? bias[n] : 0.0f);
    }
  }
}

#ifdef MOERT_X86
template <DType D>
MOERT_AVX512 void widenAvx512(const void *src, int64_t n, float *out) {
  constexpr int64_t size = D == DType::F32 ? 4 : 2;
  const char *p = static_cast<const char *>(src);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = firstLanes(n - i);
    _mm512_mask_storeu_ps(out + i, m, load16<D>(p + i * size, m));
  }
}

//===----------------------------------------------------------------------===//
// AVX-512 GEMM
//===----------------------------------------------------------------------===//

/// Prefetches the lines of a block of weight rows a few at a time, so the
/// fetches spread over the work done meanwhile.
class BlockPrefetcher {
public:
  /// Rows [0, rows) of `bytes` bytes each, rowStride bytes apart, from base;
  /// into L2 only (`toL2`) when they are needed much later.
  BlockPrefetcher(const char *base, int64_t rows, int64_t bytes, int64_t rowStride, bool toL2)
      : base(base), rows(rows), rowStride(rowStride),
        linesPerRow(rows > 0 ? (bytes + 63) / 64 + 1 : 0), toL2(toL2) {} // +1: not line-aligned
  int64_t lines() const { return rows * linesPerRow; }
  /// Issues the next `count` prefetches (fewer at the end of the block).
  void issue(int64_t count) {
    for (; count > 0 && row < rows; --count) {
      const char *p = base + row * rowStride + line * 64;
      if (toL2)
        _mm_prefetch(p, _MM_HINT_T1);
      else
        _mm_prefetch(p, _MM_HINT_T0);
      if (++line == linesPerRow) {
        line = 0;
        ++row;
      }
    }
  }

private:
  const char *base = nullptr;
  int64_t rows = 0, rowStride = 0, linesPerRow = 0, row = 0, line = 0;
  bool toL2;
};

/// Packs weight rows [n0, n0 + nc) x columns [k0, k0 + kc), widened to f32,
/// into panels of kNR rows laid out [k][kNR] (rows past nc are zero), so the
/// micro-kernel reads one k's kNR weights as kNV aligned vectors.
template <DType D>
MOERT_AVX512 void packWeights(const Matrix &w, int64_t n0, int64_t nc, int64_t k0, int64_t kc,
                              float *out) {
  constexpr int64_t size = kElementSize<D>;
  const int64_t rowBytes = w.rowStride * size;
  if (w.transposed) { // one k's kNR weights are consecutive: no transpose
    const char *base = static_cast<const char *>(w.data) + (k0 * w.rowStride + n0) * size;
    for (int64_t first = 0; first < nc; first += 16) {
      const __mmask16 mask = firstLanes(nc - first);
      float *dst = out + first / kNR * kNR * kc + first % kNR;
      for (int64_t k = 0; k < kc; ++k)
        _mm512_store_ps(dst + k * kNR, load16<D>(base + k * rowBytes + first * size, mask));
    }
    return;
  }
  const char *base = static_cast<const char *>(w.data) + (n0 * w.rowStride + k0) * size;
  const int64_t tiles = (kc + 15) / 16;
  for (int64_t first = 0; first < nc; first += 16) {
    const int64_t valid = std::min<int64_t>(16, nc - first);
    const char *src = base + first * rowBytes;
    float *dst = out + first / kNR * kNR * kc + first % kNR;
    // Rows are read 16 at a time, kc * size bytes each: streams too short
    // for the hardware prefetcher. So the tiles of one group of 16 rows also
    // fetch the next group's lines.
    BlockPrefetcher next(src + 16 * rowBytes, std::clamp<int64_t>(nc - first - 16, 0, 16),
                         kc * size, rowBytes, /*toL2=*/false);
    const int64_t perTile = (next.lines() + tiles - 1) / tiles;
    for (int64_t kk = 0; kk < kc; kk += 16) {
      next.issue(perTile);
      const int64_t depth = std::min<int64_t>(16, kc - kk);
      const __mmask16 mask = firstLanes(depth);
      __m512 r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = i < valid ? load16<D>(src + i * rowBytes + kk * size, mask) : _mm512_setzero_ps();
      transpose16(r);
      for (int64_t j = 0; j < depth; ++j)
        _mm512_store_ps(dst + (kk + j) * kNR, r[j]);
    }
  }
}

/// Packs x rows [0, mr) x columns [0, kc) as [k][16] (rows past mr are
/// zero): the kernel broadcasts one k's values from one cache line.
MOERT_AVX512 void packTokens(const float *x, int64_t ldx, int mr, int64_t kc, float *out) {
  for (int64_t kk = 0; kk < kc; kk += 16) {
    int64_t depth = std::min<int64_t>(16, kc - kk);
    __mmask16 mask = firstLanes(depth);
    __m512 r[16];
    for (int i = 0; i < 16; ++i)
      r[i] = i < mr ? _mm512_maskz_loadu_ps(mask, x + i * ldx + kk) : _mm512_setzero_ps();
    transpose16(r);
    for (int64_t j = 0; j < depth; ++j)
      _mm512_store_ps(out + (kk + j) * 16, r[j]);
  }
}

/// The tile's rows of y are read only at the end of a micro-kernel that
/// accumulates into them; it starts fetching them first.
template <int MR>
MOERT_AVX512 inline __attribute__((always_inline)) void prefetchTile(const float *c, int64_t ldc) {
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < kNV; ++v)
      _mm_prefetch(reinterpret_cast<const char *>(c + r * ldc + 16 * v), _MM_HINT_T0);
}

/// c[MR, nvalid] = acc, plus c when `accumulate`, plus bias when not null.
template <int MR>
MOERT_AVX512 inline __attribute__((always_inline)) void storeTile(const __m512 (&acc)[MR][kNV],
                                                                  float *c, int64_t ldc,
                                                                  int64_t nvalid, bool accumulate,
                                                                  const float *bias) {
  __mmask16 mask[kNV];
  for (int v = 0; v < kNV; ++v)
    mask[v] = firstLanes(nvalid - 16 * v);
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < kNV; ++v) {
      float *p = c + r * ldc + 16 * v;
      __m512 value = acc[r][v];
      if (accumulate)
        value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(mask[v], p));
      if (bias)
        value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(mask[v], bias + 16 * v));
      _mm512_mask_storeu_ps(p, mask[v], value);
    }
}

/// c[MR, nvalid] (row stride ldc) = a-panel x b-panel over kc, plus c when
/// `accumulate` (later K slices), plus bias (the last K slice) when not null.
template <int MR>
MOERT_AVX512 void microKernel(int64_t kc, const float *a, const float *b, float *c, int64_t ldc,
                              int64_t nvalid, bool accumulate, const float *bias) {
  if (accumulate)
    prefetchTile<MR>(c, ldc);
  __m512 acc[MR][kNV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < kNV; ++v)
      acc[r][v] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    __m512 bv[kNV];
    for (int v = 0; v < kNV; ++v)
      bv[v] = _mm512_load_ps(b + k * kNR + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      __m512 av = _mm512_set1_ps(a[k * 16 + r]);
      for (int v = 0; v < kNV; ++v)
        acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  storeTile<MR>(acc, c, ldc, nvalid, accumulate, bias);
}

using MicroKernel = void (*)(int64_t, const float *, const float *, float *, int64_t, int64_t,
                             bool, const float *);

template <size_t... MR>
constexpr auto microKernelTable(std::index_sequence<MR...>) {
  return std::array<MicroKernel, sizeof...(MR)>{{microKernel<static_cast<int>(MR) + 1>...}};
}
const auto kMicroKernels = microKernelTable(std::make_index_sequence<kMaxMR>());

/// The f32 path: weights widened to f32 when packed, one k per FMA.
template <DType D>
struct F32Path {
  using Word = float;
  static constexpr int64_t kUnit = 16; // K elements per packing step
  static constexpr int64_t kSlice = kKC;
  static int64_t steps(int64_t kc) { return kc; } // micro-kernel steps per K slice
  static void packWeights(const Matrix &w, int64_t n0, int64_t nc, int64_t k0, int64_t kc,
                          Word *out) {
    gemm::packWeights<D>(w, n0, nc, k0, kc, out);
  }
  static void packTokens(const float *x, int64_t ldx, int mr, int64_t kc, Word *out) {
    gemm::packTokens(x, ldx, mr, kc, out);
  }
  /// Where x's block of tokens from t and K from k starts.
  static const float *xBlock(const float *x, int64_t ldx, int64_t t, int64_t k) {
    return x + t * ldx + k;
  }
  static MicroKernel kernel(int mr) { return kMicroKernels[mr - 1]; }
};

/// GEMM y = x w^T over output columns [n0, n1), BLIS-style (see the top of
/// this file), with the packing and micro-kernels of `Path`.
template <class Path, DType D>
MOERT_AVX512 void gemm(const float *x, int64_t ldx, int64_t tokens, const Matrix &w,
                       const float *bias, int64_t n0, int64_t n1, float *y, int64_t ldy) {
  using Word = typename Path::Word;
  static_assert(sizeof(Word) == sizeof(float), "packed into float scratch");
  const int64_t K = w.cols;
  // Balanced blocks: a 128-token expert becomes 8x13 + 2x12 tokens rather
  // than 9x14 + 2, whose thin tail tile runs far below peak.
  const int64_t tokenBlocks = (tokens + kMaxMR - 1) / kMaxMR;
  const int64_t kStep = balancedStep(K, Path::kSlice, Path::kUnit);
  const int64_t nStep = balancedStep(n1 - n0, kNC, kNR);
  Word *weights = reinterpret_cast<Word *>(
      packedWeights.get(static_cast<size_t>(Path::steps(kStep) * nStep)));
  // With several column chunks, x is packed once (the first chunk's pass)
  // and its panels reused by the others: every token block of every K
  // slice, [slice][block][steps][16] words.
  const int64_t slices = (K + kStep - 1) / kStep, panelWords = Path::steps(kStep) * 16;
  const bool reuseX = n1 - n0 > nStep;
  Word *panelX = reinterpret_cast<Word *>(packedTokens.get(
      static_cast<size_t>(reuseX ? slices * tokenBlocks * panelWords : panelWords)));
  constexpr int64_t size = kElementSize<D>;
  const int64_t rowBytes = w.rowStride * size;
  const char *base = static_cast<const char *>(w.data);
  for (int64_t jc = n0; jc < n1; jc += nStep) {
    int64_t nc = std::min(nStep, n1 - jc);
    for (int64_t pc = 0; pc < K; pc += kStep) {
      int64_t kc = std::min(kStep, K - pc);
      Path::packWeights(w, jc, nc, pc, kc, weights);
      // While this slice is multiplied, the next one comes in from memory
      // (packing it would otherwise wait on it).
      int64_t nextJc = pc + kc < K ? jc : jc + nc, nextPc = pc + kc < K ? pc + kc : 0;
      BlockPrefetcher next(base + nextJc * rowBytes + nextPc * size,
                           nextJc < n1 && !w.transposed ? std::min(nStep, n1 - nextJc) : 0,
                           std::min(kStep, K - nextPc) * size, rowBytes, /*toL2=*/true);
      const int64_t kernelCalls = tokenBlocks * ((nc + kNR - 1) / kNR);
      const int64_t perCall = (next.lines() + kernelCalls - 1) / kernelCalls;
      const float *lastBias = pc + kc == K && bias ? bias + jc : nullptr;
      const int64_t steps = Path::steps(kc);
      for (int64_t blk = 0; blk < tokenBlocks; ++blk) {
        int64_t t0 = tokens * blk / tokenBlocks, t1 = tokens * (blk + 1) / tokenBlocks;
        int mr = static_cast<int>(t1 - t0);
        Word *panel = reuseX ? panelX + (pc / kStep * tokenBlocks + blk) * panelWords : panelX;
        if (!reuseX || jc == n0)
          Path::packTokens(Path::xBlock(x, ldx, t0, pc), ldx, mr, kc, panel);
        auto kernel = Path::kernel(mr);
        for (int64_t jp = 0; jp < nc; jp += kNR) {
          next.issue(perCall);
          kernel(steps, panel, weights + jp * steps, y + t0 * ldy + jc + jp, ldy,
                 std::min<int64_t>(kNR, nc - jp), pc > 0, lastBias ? lastBias + jp : nullptr);
        }
      }
    }
  }
}

//===----------------------------------------------------------------------===//
// AVX-512-BF16 GEMM (BF16 weights): x rounded to bf16, two k per vdpbf16ps
//===----------------------------------------------------------------------===//

/// Packs BF16 weight rows [n0, n0 + nc) x columns [k0, k0 + kc) into panels
/// of kNR rows laid out [k/2][kNR] of 32-bit words, each word the pair
/// (w[n][k], w[n][k+1]) that vdpbf16ps multiplies with a pair of x (an odd
/// last k is paired with zero; rows past nc are zero). The rows are not
/// widened: a 16 x 16 transpose of words moves 32 k at a time.
MOERT_AVX512_BF16 void packWeightsBf16(const Matrix &w, int64_t n0, int64_t nc, int64_t k0,
                                       int64_t kc, uint32_t *out) {
  const int64_t rowBytes = w.rowStride * 2;
  if (w.transposed) {
    // A transposed view (the backward's w^T, a gradient's b^T): one k's
    // columns are consecutive in storage row k, so a pair of k is two
    // storage rows' words interleaved (vpermt2w), kNR columns at a time.
    const char *base = static_cast<const char *>(w.data) + (k0 * w.rowStride + n0) * 2;
    const int64_t pairs = (kc + 1) / 2;
    alignas(64) static constexpr uint16_t lo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                    37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                    11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    alignas(64) static constexpr uint16_t hi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                    53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                                    27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
    const __m512i idxLo = _mm512_load_si512(lo), idxHi = _mm512_load_si512(hi);
    for (int64_t first = 0; first < nc; first += kNR) {
      const int64_t valid = std::min<int64_t>(kNR, nc - first);
      const __mmask32 mask = valid >= 32 ? ~__mmask32(0) : (__mmask32(1) << valid) - 1;
      uint32_t *dst = out + first * pairs;
      for (int64_t p = 0; p < pairs; ++p) {
        const char *row = base + 2 * p * rowBytes + first * 2;
        const __m512i a = _mm512_maskz_loadu_epi16(mask, row);
        const __m512i b =
            2 * p + 1 < kc ? _mm512_maskz_loadu_epi16(mask, row + rowBytes) : _mm512_setzero_si512();
        _mm512_store_si512(dst + p * kNR, _mm512_permutex2var_epi16(a, idxLo, b));
        _mm512_store_si512(dst + p * kNR + 16, _mm512_permutex2var_epi16(a, idxHi, b));
      }
    }
    return;
  }
  const char *base = static_cast<const char *>(w.data) + (n0 * w.rowStride + k0) * 2;
  const int64_t pairs = (kc + 1) / 2, tiles = (kc + 31) / 32;
  for (int64_t first = 0; first < nc; first += 16) {
    const int64_t valid = std::min<int64_t>(16, nc - first);
    const char *src = base + first * rowBytes;
    uint32_t *dst = out + first / kNR * kNR * pairs + first % kNR;
    BlockPrefetcher next(src + 16 * rowBytes, std::clamp<int64_t>(nc - first - 16, 0, 16), kc * 2,
                         rowBytes, /*toL2=*/false);
    const int64_t perTile = (next.lines() + tiles - 1) / tiles;
    for (int64_t kk = 0; kk < kc; kk += 32) {
      next.issue(perTile);
      const int64_t depth = std::min<int64_t>(32, kc - kk);
      const __mmask32 mask = depth >= 32 ? ~__mmask32(0) : (__mmask32(1) << depth) - 1;
      __m512 r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = i < valid ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(mask, src + i * rowBytes + kk * 2))
                         : _mm512_setzero_ps();
      transpose16(r);
      for (int64_t j = 0; j < (depth + 1) / 2; ++j)
        _mm512_store_ps(reinterpret_cast<float *>(dst + (kk / 2 + j) * kNR), r[j]);
    }
  }
}

/// packWeightsBf16's panels for a block-scaled weight (FP8 or int8; not
/// transposed), each run of 32 columns dequantised with its block's scale
/// and rounded to bf16 (scaledBf16x32) on the way: the blocks hold whole
/// 32-column runs (gemmScaledBf16 checks), and k0 starts one.
template <DType D>
MOERT_AVX512_BF16 void packWeightsScaledBf16(const Matrix &w, int64_t n0, int64_t nc, int64_t k0,
                                             int64_t kc, uint32_t *out) {
  const BlockScales &s = w.scales;
  const int64_t pairs = (kc + 1) / 2, tiles = (kc + 31) / 32;
  const int64_t firstBlock = (s.colOrigin + k0) / s.blockCols;
  for (int64_t first = 0; first < nc; first += 16) {
    const int64_t valid = std::min<int64_t>(16, nc - first);
    const char *src = rowAddress(w, n0 + first, k0);
    uint32_t *dst = out + first / kNR * kNR * pairs + first % kNR;
    const float *scales[16];
    for (int i = 0; i < valid; ++i)
      scales[i] = s.data + (s.rowOrigin + n0 + first + i) / s.blockRows * s.stride + firstBlock;
    BlockPrefetcher next(src + 16 * w.rowStride, std::clamp<int64_t>(nc - first - 16, 0, 16), kc,
                         w.rowStride, /*toL2=*/false);
    const int64_t perTile = (next.lines() + tiles - 1) / tiles;
    for (int64_t kk = 0; kk < kc; kk += 32) {
      next.issue(perTile);
      const int64_t depth = std::min<int64_t>(32, kc - kk);
      const __mmask32 mask = depth >= 32 ? ~__mmask32(0) : (__mmask32(1) << depth) - 1;
      const int64_t block = (s.colOrigin + k0 + kk) / s.blockCols - firstBlock;
      __m512 r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = i < valid ? _mm512_castsi512_ps(scaledBf16x32<D>(src + i * w.rowStride + kk, mask,
                                                                scales[i][block]))
                         : _mm512_setzero_ps();
      transpose16(r);
      for (int64_t j = 0; j < (depth + 1) / 2; ++j)
        _mm512_store_ps(reinterpret_cast<float *>(dst + (kk / 2 + j) * kNR), r[j]);
    }
  }
}

/// Packs x rows [0, mr) x columns [0, kc), rounded to bf16 (to nearest even),
/// as [k/2][16] words of (x[t][k], x[t][k+1]); rows past mr are zero.
MOERT_AVX512_BF16 void packTokensBf16(const float *x, int64_t ldx, int mr, int64_t kc,
                                      uint32_t *out) {
  for (int64_t kk = 0; kk < kc; kk += 32) {
    const int64_t depth = std::min<int64_t>(32, kc - kk);
    const __mmask16 lo = firstLanes(depth), hi = firstLanes(depth - 16);
    __m512 r[16];
    for (int i = 0; i < 16; ++i)
      r[i] = i < mr ? _mm512_castsi512_ps((__m512i)_mm512_cvtne2ps_pbh(
                          _mm512_maskz_loadu_ps(hi, x + i * ldx + kk + 16),
                          _mm512_maskz_loadu_ps(lo, x + i * ldx + kk)))
                    : _mm512_setzero_ps();
    transpose16(r);
    for (int64_t j = 0; j < (depth + 1) / 2; ++j)
      _mm512_store_ps(reinterpret_cast<float *>(out + (kk / 2 + j) * 16), r[j]);
  }
}

/// packTokensBf16's words for the x whose element (t, k) is xT[k * ldx + t]
/// (stored transposed: a weight gradient's a of a^T b): each pair of k is
/// two rows of xT, converted together (the same vcvtne2ps2bf16 as
/// packTokensBf16: the same bits) and interleaved into 16 words, with no
/// transpose (the backward's transposes took 2% of a bench-moe update).
MOERT_AVX512_BF16 void packTokensBf16Transposed(const float *xT, int64_t ldx, int mr, int64_t kc,
                                                uint32_t *out) {
  alignas(64) static constexpr uint16_t pairs[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                     21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                     11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i index = _mm512_load_si512(pairs);
  const __mmask16 rows = firstLanes(mr);
  for (int64_t p = 0; p < (kc + 1) / 2; ++p) {
    const float *even = xT + 2 * p * ldx;
    const __m512 lo = _mm512_maskz_loadu_ps(rows, even);
    const __m512 hi = 2 * p + 1 < kc ? _mm512_maskz_loadu_ps(rows, even + ldx) : _mm512_setzero_ps();
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    _mm512_store_si512(out + p * 16, _mm512_permutexvar_epi16(index, both));
  }
}

/// microKernel's contract over `pairs` pairs of k: one broadcast word of x
/// and kNV weight vectors feed kNV vdpbf16ps per token.
template <int MR>
MOERT_AVX512_BF16 void microKernelBf16(int64_t pairs, const uint32_t *a, const uint32_t *b,
                                       float *c, int64_t ldc, int64_t nvalid, bool accumulate,
                                       const float *bias) {
  if (accumulate)
    prefetchTile<MR>(c, ldc);
  __m512 acc[MR][kNV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < kNV; ++v)
      acc[r][v] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh bv[kNV];
    for (int v = 0; v < kNV; ++v)
      bv[v] = (__m512bh)_mm512_load_si512(b + p * kNR + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[p * 16 + r]));
      for (int v = 0; v < kNV; ++v)
        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  storeTile<MR>(acc, c, ldc, nvalid, accumulate, bias);
}

using MicroKernelBf16 = void (*)(int64_t, const uint32_t *, const uint32_t *, float *, int64_t,
                                 int64_t, bool, const float *);

template <size_t... MR>
constexpr auto microKernelBf16Table(std::index_sequence<MR...>) {
  return std::array<MicroKernelBf16, sizeof...(MR)>{{microKernelBf16<static_cast<int>(MR) + 1>...}};
}
const auto kMicroKernelsBf16 = microKernelBf16Table(std::make_index_sequence<kMaxMR>());

struct Bf16Path {
  using Word = uint32_t;
  static constexpr int64_t kUnit = 32;
  static constexpr int64_t kSlice = 2 * kKC; // the same bytes of packed weights as F32Path
  static int64_t steps(int64_t kc) { return (kc + 1) / 2; }
  static void packWeights(const Matrix &w, int64_t n0, int64_t nc, int64_t k0, int64_t kc,
                          Word *out) {
    packWeightsBf16(w, n0, nc, k0, kc, out);
  }
  static void packTokens(const float *x, int64_t ldx, int mr, int64_t kc, Word *out) {
    packTokensBf16(x, ldx, mr, kc, out);
  }
  static const float *xBlock(const float *x, int64_t ldx, int64_t t, int64_t k) {
    return x + t * ldx + k;
  }
  static MicroKernelBf16 kernel(int mr) { return kMicroKernelsBf16[mr - 1]; }
};

/// Bf16Path with x given transposed (element (t, k) at x[k * ldx + t]):
/// a weight gradient's left operand a^T of a^T b, packed from a's rows.
struct Bf16PathLeftTransposed : Bf16Path {
  static void packTokens(const float *x, int64_t ldx, int mr, int64_t kc, Word *out) {
    packTokensBf16Transposed(x, ldx, mr, kc, out);
  }
  static const float *xBlock(const float *x, int64_t ldx, int64_t t, int64_t k) {
    return x + k * ldx + t;
  }
};

/// Bf16Path for a block-scaled weight (packWeightsScaledBf16).
template <DType D>
struct ScaledBf16Path : Bf16Path {
  static void packWeights(const Matrix &w, int64_t n0, int64_t nc, int64_t k0, int64_t kc,
                          Word *out) {
    packWeightsScaledBf16<D>(w, n0, nc, k0, kc, out);
  }
};

template <DType D>
void columnsAvx512(const float *x, int64_t ldx, int64_t tokens, const Matrix &w,
                   const float *bias, int64_t n0, int64_t n1, float *y, int64_t ldy) {
  if (tokens <= (roundsToBf16(D) ? kGemvMaxTokensBf16 : kGemvMaxTokensAvx512) && !w.transposed)
    gemvAvx512(x, ldx, tokens, w, bias, n0, n1, y, ldy);
  else if (roundsToBf16(D))
    gemm<Bf16Path, D>(x, ldx, tokens, w, bias, n0, n1, y, ldy);
  else
    gemm<F32Path<D>, D>(x, ldx, tokens, w, bias, n0, n1, y, ldy);
}
#endif // MOERT_X86

} // namespace

void columns(const float *x, int64_t ldx, int64_t tokens, const Matrix &w, const float *bias,
             int64_t n0, int64_t n1, float *y, int64_t ldy) {
  if (tokens <= 0 || n1 <= n0)
    return;
  if (w.cols == 0) { // an empty sum
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t n = n0; n < n1; ++n)
        y[t * ldy + n] = bias ? bias[n] : 0.0f;
    return;
  }
  if (w.dtype == DType::F8E4M3 || w.dtype == DType::I8)
    return columnsScaled(x, ldx, tokens, w, bias, n0, n1, y, ldy);
#ifdef MOERT_X86
  if (haveAvx512())
    switch (w.dtype) {
    case DType::F32: return columnsAvx512<DType::F32>(x, ldx, tokens, w, bias, n0, n1, y, ldy);
    case DType::BF16: return columnsAvx512<DType::BF16>(x, ldx, tokens, w, bias, n0, n1, y, ldy);
    case DType::F16: return columnsAvx512<DType::F16>(x, ldx, tokens, w, bias, n0, n1, y, ldy);
    default: break;
    }
  if (haveAvx2() && (w.dtype == DType::F32 || w.dtype == DType::BF16 || w.dtype == DType::F16))
    return columnsAvx2(x, ldx, tokens, w, bias, n0, n1, y, ldy);
#endif
  columnsScalar(x, ldx, tokens, w, bias, n0, n1, y, ldy);
}

void columnsLeftTransposed(const float *xT, int64_t ldx, int64_t tokens, const Matrix &w,
                           int64_t n0, int64_t n1, float *y, int64_t ldy) {
  if (!leftTransposedApplies(w, tokens))
    runtimeError("columnsLeftTransposed: {} tokens of {} weights take no packed bf16 GEMM", tokens,
                 dtypeName(w.dtype));
#ifdef MOERT_X86
  if (n1 > n0)
    gemm<Bf16PathLeftTransposed, DType::BF16>(xT, ldx, tokens, w, nullptr, n0, n1, y, ldy);
#endif
}

bool leftTransposedApplies(const Matrix &w, int64_t tokens) {
#ifdef MOERT_X86
  return roundsToBf16(w.dtype) && w.cols > 0 && tokens > kGemvMaxTokensBf16;
#else
  return false;
#endif
}

bool gemmScaledBf16(const float *x, int64_t ldx, int64_t tokens, const Matrix &w,
                    const float *bias, int64_t n0, int64_t n1, float *y, int64_t ldy) {
#ifdef MOERT_X86
  const BlockScales &s = w.scales;
  if (tokens <= (w.dtype == DType::I8 ? kInt8GemvMaxTokens : kGemvMaxTokensAvx512) ||
      w.transposed || activeIsa() < Isa::Avx512Bf16 ||
      s.blockCols % 32 || s.colOrigin % 32)
    return false;
  if (w.dtype == DType::F8E4M3)
    gemm<ScaledBf16Path<DType::F8E4M3>, DType::F8E4M3>(x, ldx, tokens, w, bias, n0, n1, y, ldy);
  else if (w.dtype == DType::I8)
    gemm<ScaledBf16Path<DType::I8>, DType::I8>(x, ldx, tokens, w, bias, n0, n1, y, ldy);
  else
    return false;
  return true;
#else
  return false;
#endif
}

void widen(DType dtype, const void *src, int64_t n, float *out) {
#ifdef MOERT_X86
  if (haveAvx512())
    switch (dtype) {
    case DType::F32: return widenAvx512<DType::F32>(src, n, out);
    case DType::BF16: return widenAvx512<DType::BF16>(src, n, out);
    case DType::F16: return widenAvx512<DType::F16>(src, n, out);
    default: break;
    }
  if (haveAvx2() && (dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16))
    return widenAvx2(dtype, src, n, out);
#endif
  widenScalar(dtype, src, n, out);
}

} // namespace moert::cpu::gemm
