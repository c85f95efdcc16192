// Fused routing + dispatch on bf16 activations (moert/cpu/Dispatch.h).
//
// Memory traffic is the cost: per token the bf16 row is read (H*2 bytes)
// and written k times. Pass 1 reads each row once for the router logits
// (vdpbf16ps against the bf16 gate, which stays in L1/L2), pass 2 reads it
// again to copy it, in reverse token order so that the rows pass 1 read last
// are still in L2/L3, and writes the copies with non-temporal stores when
// they would not fit in the caches anyway (no read-for-ownership, no
// eviction of the rows still to be read).
#include "moert/cpu/Dispatch.h"

#include "moert/Error.h"
#include "moert/cpu/Isa.h"
#include "moert/Parallel.h"
#include "moert/Tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "IsaTarget.h"
#ifdef MOERT_X86
#include <unistd.h>
#endif

namespace moert::cpu {
namespace {

//===----------------------------------------------------------------------===//
// Router logits
//===----------------------------------------------------------------------===//

/// Portable: out[r * ldo + e] = x[r] . gate[e] for r < rowsCount, e < E,
/// f32 products (exact for bf16) accumulated in f32 in 8 interleaved lanes.
void dotsScalar(const uint16_t *x, int64_t rowsCount, int64_t hidden, const uint16_t *gate,
                int64_t E, float *out, int64_t ldo) {
  for (int64_t r = 0; r < rowsCount; ++r) {
    const uint16_t *xr = x + r * hidden;
    for (int64_t e = 0; e < E; ++e) {
      const uint16_t *g = gate + e * hidden;
      float lane[8] = {};
      int64_t i = 0;
      for (; i + 8 <= hidden; i += 8)
        for (int l = 0; l < 8; ++l)
          lane[l] += bf16ToFloat(xr[i + l]) * bf16ToFloat(g[i + l]);
      for (; i < hidden; ++i)
        lane[0] += bf16ToFloat(xr[i]) * bf16ToFloat(g[i]);
      out[r * ldo + e] = ((lane[0] + lane[4]) + (lane[1] + lane[5])) +
                         ((lane[2] + lane[6]) + (lane[3] + lane[7]));
    }
  }
}

#if MOERT_X86
bool haveBf16Kernels() {
  return activeIsa() >= Isa::Avx512Bf16;
}

/// The gate re-laid for the kernel: experts in blocks of 8, and within a
/// block, for each 32-wide slice of the hidden dimension, the block's rows
/// one after another (one sequential stream instead of 8), zero-padded to a
/// multiple of 32 columns. Block b holds experts [8b, min(8b + 8, E)).
struct InterleavedGate {
  std::vector<uint16_t> data;
  int64_t paddedHidden = 0;
  InterleavedGate(const uint16_t *gate, int64_t E, int64_t hidden)
      : data(((E + 7) / 8) * 8 * ((hidden + 31) / 32 * 32), 0),
        paddedHidden((hidden + 31) / 32 * 32) {
    for (int64_t e0 = 0; e0 < E; e0 += 8) {
      const int64_t ne = std::min<int64_t>(8, E - e0);
      uint16_t *block = data.data() + e0 * paddedHidden;
      for (int64_t i = 0; i < hidden; i += 32)
        for (int64_t e = 0; e < ne; ++e)
          std::memcpy(block + i * ne + e * 32, gate + (e0 + e) * hidden + i,
                      std::min<int64_t>(32, hidden - i) * 2);
    }
  }
  const uint16_t *block(int64_t e0) const { return data.data() + e0 * paddedHidden; }
};

/// Sums of 8 accumulators: lane e of the result = horizontal sum of a[e]
/// (a transposing tree: 23 shuffles and adds instead of 8 reductions).
MOERT_AVX512_BF16 inline __m256 reduce8(const __m512 *a) {
  __m512 b[4], c[2];
  for (int i = 0; i < 4; ++i)
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 2; ++i)
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  // c[0]'s 128-bit lanes hold 4 partial sums of a[0..3], c[1]'s of a[4..7].
  const __m512 d = _mm512_add_ps(_mm512_unpacklo_ps(c[0], c[1]), _mm512_unpackhi_ps(c[0], c[1]));
  const __m512 f = _mm512_add_ps(d, _mm512_permute_ps(d, 0x4E));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, f));
}

/// One 32-column step: acc[r][e] += x[r] . gate[e] (pairwise bf16 products).
template <int R, int NE>
MOERT_AVX512_BF16 inline void dotStep(__m512 (&acc)[R][NE], const __m512bh *xv,
                                      const uint16_t *g) {
  for (int e = 0; e < NE; ++e) {
    const __m512bh gv = (__m512bh)_mm512_loadu_si512(g + e * 32);
    for (int r = 0; r < R; ++r)
      acc[r][e] = _mm512_dpbf16_ps(acc[r][e], xv[r], gv);
  }
}

/// R token rows (row stride `hidden`) against NE gate rows of an
/// interleaved block: R*NE accumulators of 16 f32 lanes; each 32-bf16 step
/// loads R x vectors and NE gate vectors for R*NE vdpbf16ps, and prefetches
/// (into L2) the same columns of the R rows at `next` (null: none).
/// out[r * ldo + e].
template <int R, int NE>
MOERT_AVX512_BF16 void dotsBf16(const uint16_t *x, int64_t hidden, const uint16_t *gate,
                                const uint16_t *next, float *out, int64_t ldo) {
  __m512 acc[R][NE];
  for (int r = 0; r < R; ++r)
    for (int e = 0; e < NE; ++e)
      acc[r][e] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= hidden; i += 32) {
    __m512bh xv[R];
    for (int r = 0; r < R; ++r)
      xv[r] = (__m512bh)_mm512_loadu_si512(x + r * hidden + i);
    if (next)
      for (int r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char *>(next + r * hidden + i), _MM_HINT_T1);
    dotStep<R, NE>(acc, xv, gate + i * NE);
  }
  if (i < hidden) {
    const __mmask32 m = static_cast<__mmask32>((1ull << (hidden - i)) - 1);
    __m512bh xv[R];
    for (int r = 0; r < R; ++r)
      xv[r] = (__m512bh)_mm512_maskz_loadu_epi16(m, x + r * hidden + i);
    dotStep<R, NE>(acc, xv, gate + i * NE);
  }
  for (int r = 0; r < R; ++r) {
    if constexpr (NE == 8) {
      _mm256_storeu_ps(out + r * ldo, reduce8(acc[r]));
    } else {
      for (int e = 0; e < NE; ++e)
        out[r * ldo + e] = _mm512_reduce_add_ps(acc[r][e]);
    }
  }
}

template <int R>
MOERT_AVX512_BF16 void dotsBf16Block(const uint16_t *x, int64_t hidden, const uint16_t *gate,
                                     int64_t ne, const uint16_t *next, float *out,
                                     int64_t ldo) {
  switch (ne) {
  case 8: return dotsBf16<R, 8>(x, hidden, gate, next, out, ldo);
  case 7: return dotsBf16<R, 7>(x, hidden, gate, next, out, ldo);
  case 6: return dotsBf16<R, 6>(x, hidden, gate, next, out, ldo);
  case 5: return dotsBf16<R, 5>(x, hidden, gate, next, out, ldo);
  case 4: return dotsBf16<R, 4>(x, hidden, gate, next, out, ldo);
  case 3: return dotsBf16<R, 3>(x, hidden, gate, next, out, ldo);
  case 2: return dotsBf16<R, 2>(x, hidden, gate, next, out, ldo);
  default: return dotsBf16<R, 1>(x, hidden, gate, next, out, ldo);
  }
}

/// Tokens per register tile of the logits kernel (3 x 8 accumulators).
constexpr int kTileTokens = 3;

/// Logits of rows [r0, r1) of x into out (row stride ldo); the rows
/// before `limit` after each tile are prefetched while it computes.
MOERT_AVX512_BF16 void dotsAvx512(const uint16_t *x, int64_t r0, int64_t r1, int64_t limit,
                                  int64_t hidden, const InterleavedGate &gate, int64_t E,
                                  float *out, int64_t ldo) {
  int64_t r = r0;
  for (; r + kTileTokens <= r1; r += kTileTokens) {
    const bool more = r + 2 * kTileTokens <= limit;
    for (int64_t e = 0; e < E; e += 8)
      dotsBf16Block<kTileTokens>(x + r * hidden, hidden, gate.block(e),
                                 std::min<int64_t>(8, E - e),
                                 more && e == 0 ? x + (r + kTileTokens) * hidden : nullptr,
                                 out + (r - r0) * ldo + e, ldo);
  }
  for (; r < r1; ++r)
    for (int64_t e = 0; e < E; e += 8)
      dotsBf16Block<1>(x + r * hidden, hidden, gate.block(e), std::min<int64_t>(8, E - e),
                       nullptr, out + (r - r0) * ldo + e, ldo);
}

//===----------------------------------------------------------------------===//
// Router logits, AVX2
//===----------------------------------------------------------------------===//

/// The gate widened to f32 once per call, rows `ld` floats apart.
struct WidenedGate {
  std::vector<float> data;
  int64_t ld = 0;
  WidenedGate(const uint16_t *gate, int64_t E, int64_t hidden)
      : data(static_cast<size_t>(E * hidden)), ld(hidden) {
    for (int64_t i = 0; i < E * hidden; ++i)
      data[i] = bf16ToFloat(gate[i]);
  }
};

/// R token rows against NE gate rows. Lane l of acc[r][e] sums the products
/// of the columns i = l (mod 8) in order, and the lanes are added as
/// dotsScalar adds its eight partial sums: bf16 products are exact in f32,
/// so an FMA rounds as the portable multiply-then-add does and the logits
/// are bitwise the portable ones.
template <int R, int NE>
MOERT_AVX2 void dotsAvx2Tile(const uint16_t *x, int64_t hidden, const float *g, int64_t ldg,
                                    const uint16_t *next, float *out, int64_t ldo) {
  __m256 acc[R][NE];
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int e = 0; e < NE; ++e)
      acc[r][e] = _mm256_setzero_ps();
  const int64_t full = hidden / 8 * 8;
  for (int64_t i = 0; i < full; i += 8) {
    if (next && (i & 31) == 0)
#pragma GCC unroll 3
      for (int r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char *>(next + r * hidden + i), _MM_HINT_T1);
    __m256 xv[R];
#pragma GCC unroll 3
    for (int r = 0; r < R; ++r)
      xv[r] = _mm256_castsi256_ps(_mm256_slli_epi32(
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(x + r * hidden + i))),
          16));
#pragma GCC unroll 4
    for (int e = 0; e < NE; ++e) {
      const __m256 gv = _mm256_loadu_ps(g + e * ldg + i);
#pragma GCC unroll 3
      for (int r = 0; r < R; ++r)
        acc[r][e] = _mm256_fmadd_ps(xv[r], gv, acc[r][e]);
    }
  }
#pragma GCC unroll 3
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int e = 0; e < NE; ++e) {
      alignas(32) float lane[8];
      _mm256_store_ps(lane, acc[r][e]);
      for (int64_t i = full; i < hidden; ++i)
        lane[0] += bf16ToFloat(x[r * hidden + i]) * g[e * ldg + i];
      out[r * ldo + e] = ((lane[0] + lane[4]) + (lane[1] + lane[5])) +
                         ((lane[2] + lane[6]) + (lane[3] + lane[7]));
    }
}

using DotsTile = void (*)(const uint16_t *, int64_t, const float *, int64_t, const uint16_t *,
                          float *, int64_t);

template <int R>
DotsTile dotsAvx2TileFor(int64_t ne) {
  return ne >= 4 ? dotsAvx2Tile<R, 4> : ne == 3 ? dotsAvx2Tile<R, 3>
       : ne == 2 ? dotsAvx2Tile<R, 2> : dotsAvx2Tile<R, 1>;
}

/// Logits of rows [r0, r1) of x into out (row stride ldo): tiles of 3
/// tokens x 4 experts (12 accumulators); the next tile's rows (before
/// `limit`) are prefetched into L2 while the first experts' tile computes.
void dotsAvx2(const uint16_t *x, int64_t r0, int64_t r1, int64_t limit, int64_t hidden,
              const WidenedGate &gate, int64_t E, float *out, int64_t ldo) {
  for (int64_t r = r0; r < r1;) {
    const int64_t rows = std::min<int64_t>(3, r1 - r);
    const bool more = r + rows + 3 <= limit;
    for (int64_t e = 0; e < E; e += 4) {
      const int64_t ne = std::min<int64_t>(4, E - e);
      DotsTile tile = rows == 3 ? dotsAvx2TileFor<3>(ne)
                    : rows == 2 ? dotsAvx2TileFor<2>(ne) : dotsAvx2TileFor<1>(ne);
      tile(x + r * hidden, hidden, gate.data.data() + e * gate.ld, gate.ld,
           more && e == 0 ? x + (r + rows) * hidden : nullptr, out + (r - r0) * ldo + e, ldo);
    }
    r += rows;
  }
}
#endif

//===----------------------------------------------------------------------===//
// Selection and weights
//===----------------------------------------------------------------------===//

float selectionKey(float v) {
  return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
}

/// Top-k of one token's logits (descending, lower index first on ties, NaN
/// last) and their renormalised softmax weights.
void selectTopK(const float *logit, int64_t E, int64_t k, float *w, int32_t *chosen) {
  if (k == 2) {
    int32_t a = 0, b = -1;
    float ka = selectionKey(logit[0]), kb = -std::numeric_limits<float>::infinity();
    for (int32_t e = 1; e < E; ++e) {
      const float v = selectionKey(logit[e]);
      if (v > ka) {
        b = a;
        kb = ka;
        a = e;
        ka = v;
      } else if (b < 0 || v > kb) {
        b = e;
        kb = v;
      }
    }
    chosen[0] = a;
    chosen[1] = b;
  } else {
    float key[64];
    std::vector<float> bigKey;
    float *keys = key;
    if (k > 64) {
      bigKey.resize(k);
      keys = bigKey.data();
    }
    int64_t n = 0;
    for (int32_t e = 0; e < E; ++e) {
      const float v = selectionKey(logit[e]);
      if (n == k && !(v > keys[k - 1]))
        continue;
      int64_t pos = n < k ? n++ : k - 1;
      while (pos > 0 && v > keys[pos - 1]) {
        keys[pos] = keys[pos - 1];
        chosen[pos] = chosen[pos - 1];
        --pos;
      }
      keys[pos] = v;
      chosen[pos] = e;
    }
  }
  // softmax(l)_j / sum_chosen softmax(l)_i: the denominator of the softmax
  // cancels, and the top logit is the maximum the softmax subtracts.
  const float top = logit[chosen[0]];
  double e[64];
  std::vector<double> bigE;
  double *ex = e;
  if (k > 64) {
    bigE.resize(k);
    ex = bigE.data();
  }
  ex[0] = 1.0;
  double sum = 1.0;
  for (int64_t j = 1; j < k; ++j) {
    ex[j] = std::exp(static_cast<double>(logit[chosen[j]] - top));
    sum += ex[j];
  }
  for (int64_t j = 0; j < k; ++j)
    w[j] = static_cast<float>(ex[j] / sum);
}

//===----------------------------------------------------------------------===//
// Row copies
//===----------------------------------------------------------------------===//

#if MOERT_X86
/// Copies n bytes; with `stream`, every whole 64-byte line of dst is written
/// with a non-temporal store (the partial lines at either end normally).
/// Optionally prefetches `next` (the next row to copy), one line per line.
MOERT_AVX512 void copyBytesAvx512(uint8_t *dst, const uint8_t *src, int64_t n,
                                           bool stream, const uint8_t *next) {
  int64_t i = 0;
  const int64_t head = std::min<int64_t>(n, (64 - (reinterpret_cast<uintptr_t>(dst) & 63)) & 63);
  if (head) {
    const __mmask64 m = (1ull << head) - 1;
    _mm512_mask_storeu_epi8(dst, m, _mm512_maskz_loadu_epi8(m, src));
    i = head;
  }
  // dst + i is 64-byte aligned from here on; the store kind is the only
  // difference between the two modes (the branch is loop-invariant).
  auto store = [stream](uint8_t *to, __m512i v) MOERT_AVX512 {
    if (stream)
      _mm512_stream_si512(reinterpret_cast<__m512i *>(to), v);
    else
      _mm512_storeu_si512(to, v);
  };
  for (; i + 256 <= n; i += 256) {
    if (next)
      for (int line = 0; line < 256; line += 64)
        _mm_prefetch(reinterpret_cast<const char *>(next + i + line), _MM_HINT_T1);
    const __m512i a = _mm512_loadu_si512(src + i), b = _mm512_loadu_si512(src + i + 64);
    const __m512i c = _mm512_loadu_si512(src + i + 128), d = _mm512_loadu_si512(src + i + 192);
    store(dst + i, a);
    store(dst + i + 64, b);
    store(dst + i + 128, c);
    store(dst + i + 192, d);
  }
  for (; i + 64 <= n; i += 64)
    store(dst + i, _mm512_loadu_si512(src + i));
  if (i < n) {
    const __mmask64 m = (1ull << (n - i)) - 1;
    _mm512_mask_storeu_epi8(dst + i, m, _mm512_maskz_loadu_epi8(m, src + i));
  }
}

/// copyBytesAvx512 for AVX2: with `stream`, every whole 32-byte block of dst
/// is written with a non-temporal store; `next` (or null) is prefetched
/// into L2 alongside, one line per line copied.
MOERT_AVX2 void copyBytesAvx2(uint8_t *dst, const uint8_t *src, int64_t n, bool stream,
                              const uint8_t *next) {
  if (!stream) {
    if (next)
      for (int64_t line = 0; line < n; line += 64)
        _mm_prefetch(reinterpret_cast<const char *>(next + line), _MM_HINT_T1);
    std::memcpy(dst, src, static_cast<size_t>(n));
    return;
  }
  const int64_t head = std::min<int64_t>(n, (32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31);
  std::memcpy(dst, src, static_cast<size_t>(head));
  int64_t i = head;
  for (; i + 128 <= n; i += 128) {
    if (next) {
      _mm_prefetch(reinterpret_cast<const char *>(next + i), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char *>(next + i + 64), _MM_HINT_T1);
    }
    for (int v = 0; v < 4; ++v)
      _mm256_stream_si256(reinterpret_cast<__m256i *>(dst + i + 32 * v),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i *>(src + i + 32 * v)));
  }
  for (; i + 32 <= n; i += 32)
    _mm256_stream_si256(reinterpret_cast<__m256i *>(dst + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i *>(src + i)));
  std::memcpy(dst + i, src + i, static_cast<size_t>(n - i));
}
#endif

/// Bytes (input + output) beyond which the copies bypass the caches: half
/// the last-level cache a core shares (taken as at most 32 MiB: virtual
/// machines report whole-socket sums). Below, the dispatched rows stay
/// cached for the expert GEMMs that read them next; above, they would be
/// evicted anyway, and regular stores would also read every line (RFO) and
/// push out the input rows pass 2 still has to read.
int64_t streamingThreshold() {
  static const int64_t bytes = [] {
    int64_t l3 = 32ll << 20;
#if defined(_SC_LEVEL3_CACHE_SIZE)
    const long reported = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (reported > 0)
      l3 = std::min<int64_t>(l3, reported);
#endif
    return l3 / 2;
  }();
  return bytes;
}

} // namespace

void routeAndDispatchBf16(const uint16_t *x, int64_t tokens, int64_t hidden,
                          const uint16_t *gate, int64_t E, int64_t k, float *weights,
                          int32_t *expertIds, int32_t *rows, int64_t *expertOffsets,
                          uint16_t *dispatched, float *logits, DispatchKernel kernel) {
  if (E <= 0 || k <= 0 || k > E)
    inputError("routeAndDispatchBf16: top_k {} must lie in [1, {}]", k, E);
  if (hidden <= 0 || tokens < 0)
    inputError("routeAndDispatchBf16: bad shape [{}, {}]", tokens, hidden);
  if (tokens * k > std::numeric_limits<int32_t>::max())
    inputError("routeAndDispatchBf16: {} rows exceed the int32 row indices", tokens * k);
#if MOERT_X86
  const bool vector = kernel == DispatchKernel::Auto && haveBf16Kernels();
  const bool avx2 = kernel == DispatchKernel::Auto && !vector && activeIsa() >= Isa::Avx2;
#else
  const bool vector = false, avx2 = false;
  (void)kernel;
#endif
  const int64_t rowBytes = hidden * 2;
  const bool stream = tokens * (k + 1) * rowBytes > streamingThreshold();

  // Contiguous token chunks, one per thread (parallelFor hands index c to
  // the same thread in both passes, so pass 2 finds its rows in its L2).
  const int64_t minChunk = 16;
  const int64_t chunks =
      std::max<int64_t>(1, std::min<int64_t>(numThreads(), tokens / minChunk));
  auto chunkBegin = [&](int64_t c) { return tokens * c / chunks; };
  std::vector<int64_t> counts(chunks * E), start(chunks * E);

#if MOERT_X86
  std::unique_ptr<InterleavedGate> interleaved;
  if (vector)
    interleaved = std::make_unique<InterleavedGate>(gate, E, hidden);
  std::unique_ptr<WidenedGate> widened;
  if (avx2)
    widened = std::make_unique<WidenedGate>(gate, E, hidden);
#endif
  // Pass 1: logits, top-k, weights, per-chunk per-expert counts.
  parallelFor(chunks, [&](int64_t c0, int64_t c1) {
    constexpr int64_t kBlock = 24; // tokens per logits block (a multiple of 3)
    std::vector<float> local(logits ? 0 : kBlock * E);
    std::vector<int64_t> count(E); // the chunk's counts (not shared lines)
    for (int64_t c = c0; c < c1; ++c) {
      std::fill(count.begin(), count.end(), 0);
      for (int64_t t0 = chunkBegin(c), end = chunkBegin(c + 1); t0 < end; t0 += kBlock) {
        const int64_t n = std::min(kBlock, end - t0);
        float *l = logits ? logits + t0 * E : local.data();
#if MOERT_X86
        if (vector)
          dotsAvx512(x, t0, t0 + n, end, hidden, *interleaved, E, l, E);
        else if (avx2)
          dotsAvx2(x, t0, t0 + n, end, hidden, *widened, E, l, E);
        else
#endif
          dotsScalar(x + t0 * hidden, n, hidden, gate, E, l, E);
        for (int64_t t = 0; t < n; ++t) {
          int32_t *chosen = expertIds + (t0 + t) * k;
          selectTopK(l + t * E, E, k, weights + (t0 + t) * k, chosen);
          for (int64_t j = 0; j < k; ++j)
            ++count[chosen[j]];
        }
      }
      std::copy(count.begin(), count.end(), counts.begin() + c * E);
    }
  }, 1);

  // Rows in expert order: expert-major, then chunk (token order) minor.
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    expertOffsets[e] = row;
    for (int64_t c = 0; c < chunks; ++c) {
      start[c * E + e] = row;
      row += counts[c * E + e];
    }
  }
  expertOffsets[E] = row;

  // Pass 2: each chunk's rows to their positions, last token first (the
  // rows read last in pass 1 are the ones still cached).
  parallelFor(chunks, [&](int64_t c0, int64_t c1) {
    std::vector<int64_t> cursor(E);
    for (int64_t c = c0; c < c1; ++c) {
      for (int64_t e = 0; e < E; ++e)
        cursor[e] = start[c * E + e] + counts[c * E + e];
      const int64_t begin = chunkBegin(c);
      for (int64_t t = chunkBegin(c + 1) - 1; t >= begin; --t) {
        const uint8_t *src = reinterpret_cast<const uint8_t *>(x + t * hidden);
        const uint8_t *next = t > begin ? src - rowBytes : nullptr;
        for (int64_t j = k - 1; j >= 0; --j) {
          const int64_t r = --cursor[expertIds[t * k + j]];
          rows[t * k + j] = static_cast<int32_t>(r);
          uint8_t *dst = reinterpret_cast<uint8_t *>(dispatched + r * hidden);
#if MOERT_X86
          if (vector) {
            copyBytesAvx512(dst, src, rowBytes, stream, j == k - 1 ? next : nullptr);
            continue;
          }
          if (avx2) {
            copyBytesAvx2(dst, src, rowBytes, stream, j == k - 1 ? next : nullptr);
            continue;
          }
#endif
          std::memcpy(dst, src, rowBytes);
        }
      }
    }
#if MOERT_X86
    if ((vector || avx2) && stream)
      _mm_sfence();
#endif
  }, 1);
}

} // namespace moert::cpu
