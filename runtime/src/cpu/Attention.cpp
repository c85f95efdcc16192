// Causal (sliding-window) GQA attention and DeepSeek's MLA over a KV cache.
// A batch first writes its keys and values into the cache at (sequence,
// position); then every (token, head) attends to rows 0..pos (or the last
// `window` of them) of its own sequence's slot, so prefill, decode and mixed
// batches are one code path and a decode step sees exactly the rows a full
// recomputation would.
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Isa.h"
#include "moert/cpu/Kernels.h"

#include "AttentionTile.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "IsaTarget.h"

namespace moert::cpu {
namespace {

/// a.b with eight independent partial sums, which the compiler turns into
/// SIMD lanes (a single running sum would be a serial chain).
inline float dot(const float *a, const float *b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j)
      acc[j] += a[i + j] * b[i + j];
  float tail = 0;
  for (; i < n; ++i)
    tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

/// Successive cache rows of one head are a whole cache row apart (often a
/// page or more), out of reach of the hardware stride prefetchers: without
/// this, a long decode waits on one cache miss after another.
constexpr int64_t kPrefetchRows = 8;
inline void prefetchRow(const float *row, int64_t n) {
  for (int64_t i = 0; i < n; i += 64 / sizeof(float))
    __builtin_prefetch(row + i);
}

/// Every token's slot and position must address a cache row.
void checkLayout(const TokenLayout &layout, const KVCache &cache, const char *op) {
  for (int64_t t = 0; t < layout.tokens; ++t) {
    if (layout.sequence[t] < 0 || layout.sequence[t] >= cache.slots)
      inputError("{}: token {} belongs to sequence slot {}, the cache has {} slots", op, t,
                 layout.sequence[t], cache.slots);
    if (layout.position[t] < 0 || layout.position[t] >= cache.maxSeqLen)
      inputError("{}: token {} is at position {}, the cache holds {} positions", op, t,
                 layout.position[t], cache.maxSeqLen);
  }
}


#ifdef MOERT_X86
// GCC 12 flags the _mm512_undefined_ps() inside max/min/roundscale/scalef.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

/// e^x for 16 lanes: x = n ln2 + r, |r| <= ln2/2, a degree-7 polynomial for
/// e^r (relative error about 1 ulp) and 2^n applied with scalef. Lanes far
/// below the f32 range give 0, -inf gives 0.
MOERT_AVX512 inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

/// One tile: `rows` query rows (tokens of one slot x the query heads of kv
/// head g) against keys [j0, j0 + nk) of that slot. Lane r of the score
/// vectors is query row r; each lane's arithmetic (an FMA chain over the head
/// dim from 0, the scale, a masked max, e^(s - max), a running sum over keys
/// in order, a value sum over keys in order, one division) never depends on
/// the other rows, so a token gets the same bits in any tile.
MOERT_AVX512 void attendTile(const float *const *qrow, float *const *orow, const int32_t *firstRow,
                             const int32_t *lastRow, int64_t rows, const float *keys, int64_t kw,
                             const float *values, int64_t vw, int64_t j0, int64_t nk, int64_t dq,
                             int64_t dv, float scale, TileScratch &ts) {
  const int64_t blocks = (rows + 15) / 16, ld = blocks * 16;
  ts.prepare(qrow, firstRow, lastRow, rows, ld, j0, nk, dq);
  float *S = ts.s.data();
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t b = 0; b < blocks; ++b) {
    const float *qt = ts.qt.data() + b * 16;
    float *sb = S + b * 16;
    int64_t j = 0;
    for (; j + 8 <= nk; j += 8) {
      const float *k0 = keys + j * kw;
      if (j + 16 <= nk)
        for (int u = 0; u < 8; ++u)
          prefetchRow(keys + (j + 8 + u) * kw, dq);
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
      for (int64_t d = 0; d < dq; ++d) {
        const __m512 qv = _mm512_loadu_ps(qt + d * ld);
        a0 = _mm512_fmadd_ps(qv, _mm512_set1_ps(k0[d]), a0);
        a1 = _mm512_fmadd_ps(qv, _mm512_set1_ps(k0[kw + d]), a1);
        a2 = _mm512_fmadd_ps(qv, _mm512_set1_ps(k0[2 * kw + d]), a2);
        a3 = _mm512_fmadd_ps(qv, _mm512_set1_ps(k0[3 * kw + d]), a3);
        a4 = _mm512_fmadd_ps(qv, _mm512_set1_ps(k0[4 * kw + d]), a4);
        a5 = _mm512_fmadd_ps(qv, _mm512_set1_ps(k0[5 * kw + d]), a5);
        a6 = _mm512_fmadd_ps(qv, _mm512_set1_ps(k0[6 * kw + d]), a6);
        a7 = _mm512_fmadd_ps(qv, _mm512_set1_ps(k0[7 * kw + d]), a7);
      }
      _mm512_storeu_ps(sb + (j + 0) * ld, _mm512_mul_ps(a0, vscale));
      _mm512_storeu_ps(sb + (j + 1) * ld, _mm512_mul_ps(a1, vscale));
      _mm512_storeu_ps(sb + (j + 2) * ld, _mm512_mul_ps(a2, vscale));
      _mm512_storeu_ps(sb + (j + 3) * ld, _mm512_mul_ps(a3, vscale));
      _mm512_storeu_ps(sb + (j + 4) * ld, _mm512_mul_ps(a4, vscale));
      _mm512_storeu_ps(sb + (j + 5) * ld, _mm512_mul_ps(a5, vscale));
      _mm512_storeu_ps(sb + (j + 6) * ld, _mm512_mul_ps(a6, vscale));
      _mm512_storeu_ps(sb + (j + 7) * ld, _mm512_mul_ps(a7, vscale));
    }
    for (; j < nk; ++j) {
      const float *k0 = keys + j * kw;
      __m512 a0 = _mm512_setzero_ps();
      for (int64_t d = 0; d < dq; ++d)
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(qt + d * ld), _mm512_set1_ps(k0[d]), a0);
      _mm512_storeu_ps(sb + j * ld, _mm512_mul_ps(a0, vscale));
    }
  }
  // Softmax numerators in place (0 outside each row's range), and the sums.
  std::vector<float> &sums = ts.qt; // reuse: ld values
  sums.assign(static_cast<size_t>(ld), 0.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    float *sb = S + b * 16;
    const __m512i lo = _mm512_loadu_si512(ts.first.data() + b * 16);
    const __m512i hi = _mm512_loadu_si512(ts.last.data() + b * 16);
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < nk; ++j) {
      const __m512i jv = _mm512_set1_epi32(static_cast<int32_t>(j));
      const __mmask16 m = _mm512_cmple_epi32_mask(lo, jv) & _mm512_cmpge_epi32_mask(hi, jv);
      mx = _mm512_mask_max_ps(mx, m, mx, _mm512_loadu_ps(sb + j * ld));
    }
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < nk; ++j) {
      const __m512i jv = _mm512_set1_epi32(static_cast<int32_t>(j));
      const __mmask16 m = _mm512_cmple_epi32_mask(lo, jv) & _mm512_cmpge_epi32_mask(hi, jv);
      const __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_loadu_ps(sb + j * ld), mx)));
      sum = _mm512_add_ps(sum, e);
      _mm512_storeu_ps(sb + j * ld, e);
    }
    _mm512_storeu_ps(sums.data() + b * 16, sum);
  }
  // out_r = (sum_j e[j][r] v_j) / sum_r, four rows and up to 64 columns at a time.
  for (int64_t c = 0; c < dv; c += 64) {
    const int64_t width = std::min<int64_t>(64, dv - c);
    const int nv = static_cast<int>((width + 15) / 16);
    const int64_t tail = width - (nv - 1) * 16;
    const __mmask16 tm = static_cast<__mmask16>(tail == 16 ? 0xffff : (1u << tail) - 1);
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
      const int nr = static_cast<int>(std::min<int64_t>(4, rows - r0));
      __m512 acc[4][4];
      for (int a = 0; a < 4; ++a)
        for (int b = 0; b < 4; ++b)
          acc[a][b] = _mm512_setzero_ps();
      const float *vp = values + c;
      const float *sp = S + r0;
      if (nr == 4 && nv == 4) {
        // Named accumulators: an array here would live on the stack.
        __m512 c00 = acc[0][0], c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00,
               c13 = c00, c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00,
               c32 = c00, c33 = c00;
        for (int64_t j = 0; j < nk; ++j, vp += vw, sp += ld) {
          const __m512 v0 = _mm512_loadu_ps(vp), v1 = _mm512_loadu_ps(vp + 16),
                       v2 = _mm512_loadu_ps(vp + 32), v3 = _mm512_maskz_loadu_ps(tm, vp + 48);
          __m512 p = _mm512_set1_ps(sp[0]);
          c00 = _mm512_fmadd_ps(p, v0, c00);
          c01 = _mm512_fmadd_ps(p, v1, c01);
          c02 = _mm512_fmadd_ps(p, v2, c02);
          c03 = _mm512_fmadd_ps(p, v3, c03);
          p = _mm512_set1_ps(sp[1]);
          c10 = _mm512_fmadd_ps(p, v0, c10);
          c11 = _mm512_fmadd_ps(p, v1, c11);
          c12 = _mm512_fmadd_ps(p, v2, c12);
          c13 = _mm512_fmadd_ps(p, v3, c13);
          p = _mm512_set1_ps(sp[2]);
          c20 = _mm512_fmadd_ps(p, v0, c20);
          c21 = _mm512_fmadd_ps(p, v1, c21);
          c22 = _mm512_fmadd_ps(p, v2, c22);
          c23 = _mm512_fmadd_ps(p, v3, c23);
          p = _mm512_set1_ps(sp[3]);
          c30 = _mm512_fmadd_ps(p, v0, c30);
          c31 = _mm512_fmadd_ps(p, v1, c31);
          c32 = _mm512_fmadd_ps(p, v2, c32);
          c33 = _mm512_fmadd_ps(p, v3, c33);
        }
        acc[0][0] = c00; acc[0][1] = c01; acc[0][2] = c02; acc[0][3] = c03;
        acc[1][0] = c10; acc[1][1] = c11; acc[1][2] = c12; acc[1][3] = c13;
        acc[2][0] = c20; acc[2][1] = c21; acc[2][2] = c22; acc[2][3] = c23;
        acc[3][0] = c30; acc[3][1] = c31; acc[3][2] = c32; acc[3][3] = c33;
      } else {
        for (int64_t j = 0; j < nk; ++j, vp += vw, sp += ld) {
          __m512 v[4];
          for (int b = 0; b < nv; ++b)
            v[b] = b == nv - 1 ? _mm512_maskz_loadu_ps(tm, vp + 16 * b) : _mm512_loadu_ps(vp + 16 * b);
          for (int a = 0; a < nr; ++a) {
            const __m512 p = _mm512_set1_ps(sp[a]);
            for (int b = 0; b < nv; ++b)
              acc[a][b] = _mm512_fmadd_ps(p, v[b], acc[a][b]);
          }
        }
      }
      for (int a = 0; a < nr; ++a) {
        const __m512 total = _mm512_set1_ps(sums[r0 + a]);
        float *o = orow[r0 + a] + c;
        for (int b = 0; b < nv; ++b) {
          const __m512 x = _mm512_div_ps(acc[a][b], total);
          if (b == nv - 1)
            _mm512_mask_storeu_ps(o + 16 * b, tm, x);
          else
            _mm512_storeu_ps(o + 16 * b, x);
        }
      }
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

/// The vector path of attendCached (AVX-512 or AVX2 `tile`): a work item is
/// a tile of up to `tq` consecutive batch tokens of one slot times the query
/// heads of one kv head, against every cached row any of them sees.
void attendTiled(AttendTile tile, const float *q, int64_t ldq, const TokenLayout &layout,
                 int64_t heads, int64_t kvHeads, int64_t dq, int64_t dv, double scale,
                 int64_t window, const KVCache &cache, float *out) {
  const int64_t group = heads / kvHeads, T = layout.tokens;
  const int64_t kw = cache.keyWidth, vw = cache.valueWidth;
  const float scaleF = static_cast<float>(scale);
  // Tiles: runs of consecutive tokens in one slot, at most tq tokens.
  int64_t tq = std::max<int64_t>(1, 64 / group);
  std::vector<std::pair<int64_t, int64_t>> tiles; // [begin, end) tokens
  for (;;) {
    tiles.clear();
    for (int64_t t = 0; t < T;) {
      int64_t e = t + 1;
      while (e < T && e - t < tq && layout.sequence[e] == layout.sequence[t])
        ++e;
      tiles.emplace_back(t, e);
      t = e;
    }
    if (tq == 1 || static_cast<int64_t>(tiles.size()) * kvHeads >= 2 * numThreads())
      break;
    tq /= 2;
  }
  // Costliest tiles first, dealt round-robin to the threads.
  auto cost = [&](const std::pair<int64_t, int64_t> &tile) {
    int64_t hi = 0;
    for (int64_t t = tile.first; t < tile.second; ++t)
      hi = std::max<int64_t>(hi, layout.position[t]);
    return hi * (tile.second - tile.first);
  };
  std::vector<std::pair<int64_t, int64_t>> order; // (cost, tile)
  for (size_t i = 0; i < tiles.size(); ++i)
    order.emplace_back(-cost(tiles[i]), static_cast<int64_t>(i));
  std::sort(order.begin(), order.end());
  const int64_t items = static_cast<int64_t>(tiles.size()) * kvHeads;
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(numThreads(), items));
  parallelFor(workers, [&](int64_t wb, int64_t we) {
    TileScratch ts;
    std::vector<const float *> qrow;
    std::vector<float *> orow;
    std::vector<int32_t> firstRow, lastRow;
    for (int64_t w = wb; w < we; ++w)
      for (int64_t item = w; item < items; item += workers) {
        const auto [tb, te] = tiles[order[item / kvHeads].second];
        const int64_t g = item % kvHeads;
        const int64_t slot = layout.sequence[tb];
        qrow.clear();
        orow.clear();
        firstRow.clear();
        lastRow.clear();
        int64_t lo = INT64_MAX, hi = 0;
        for (int64_t t = tb; t < te; ++t) {
          const int64_t pos = layout.position[t];
          const int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
          lo = std::min(lo, first);
          hi = std::max(hi, pos);
          for (int64_t h = g * group; h < (g + 1) * group; ++h) {
            qrow.push_back(q + t * ldq + h * dq);
            orow.push_back(out + t * heads * dv + h * dv);
            firstRow.push_back(static_cast<int32_t>(first));
            lastRow.push_back(static_cast<int32_t>(pos));
          }
        }
        const float *keys = cache.keyData + (slot * cache.maxSeqLen + lo) * kw + g * dq;
        const float *values = cache.valueData + (slot * cache.maxSeqLen + lo) * vw + g * dv;
        tile(qrow.data(), orow.data(), firstRow.data(), lastRow.data(),
                   static_cast<int64_t>(qrow.size()), keys, kw, values, vw, lo, hi - lo + 1, dq,
                   dv, scaleF, ts);
      }
  });
}
/// out[t, h*dv..] = softmax(q_h . K^T * scale) V over the cached rows of t's
/// slot in [pos - window + 1, pos] (from 0 without a window). Query head h
/// reads kv head h / (heads / kvHeads). The score of row j is the f32 dot
/// product times scale (transformers multiplies after the matmul); softmax
/// subtracts the max, and the probabilities are normalised before the value
/// sum, as softmax followed by a matmul does.
///
/// A work item is one token and a run of query heads that share a kv head,
/// so each cached key and value row is read once for all of them; the run is
/// shortened only when there would be fewer items than threads. Each head's
/// arithmetic is the same whatever the run, so results never depend on the
/// batch or the thread count. This is the portable path; on AVX2 and AVX-512
/// CPUs attendTiled does the same (in its own, equally batch-independent, f32
/// arithmetic) for tiles of tokens at once.
void attendCached(const float *q, int64_t ldq, const TokenLayout &layout, int64_t heads,
                  int64_t kvHeads, int64_t dq, int64_t dv, double scale, int64_t window,
                  const KVCache &cache, float *out) {
#ifdef MOERT_X86
  if (activeIsa() >= Isa::Avx512)
    return attendTiled(attendTile, q, ldq, layout, heads, kvHeads, dq, dv, scale, window, cache,
                       out);
  if (activeIsa() >= Isa::Avx2)
    return attendTiled(attendTileAvx2, q, ldq, layout, heads, kvHeads, dq, dv, scale, window,
                       cache, out);
#endif
  const int64_t group = heads / kvHeads;
  const int64_t kw = cache.keyWidth, vw = cache.valueWidth;
  const float scaleF = static_cast<float>(scale);
  int64_t run = group;
  while (run % 2 == 0 && layout.tokens * (heads / run) < numThreads())
    run /= 2;
  const int64_t runsPerToken = heads / run;
  parallelFor(layout.tokens * runsPerToken, [&](int64_t begin, int64_t end) {
    std::vector<float> probs; // [run, n]
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / runsPerToken, h0 = (item % runsPerToken) * run, g = h0 / group;
      const int64_t slot = layout.sequence[t], pos = layout.position[t];
      const int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
      const int64_t n = pos - first + 1;
      const float *keys = cache.keyData + (slot * cache.maxSeqLen + first) * kw + g * dq;
      const float *values = cache.valueData + (slot * cache.maxSeqLen + first) * vw + g * dv;
      probs.resize(static_cast<size_t>(run * n));
      for (int64_t j = 0; j < n; ++j) {
        if (j + kPrefetchRows < n)
          prefetchRow(keys + (j + kPrefetchRows) * kw, dq);
        for (int64_t r = 0; r < run; ++r)
          probs[r * n + j] = dot(q + t * ldq + (h0 + r) * dq, keys + j * kw, dq) * scaleF;
      }
      for (int64_t r = 0; r < run; ++r) {
        float *p = probs.data() + r * n;
        float max = -INFINITY;
        for (int64_t j = 0; j < n; ++j)
          max = std::max(max, p[j]);
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          p[j] = std::exp(p[j] - max);
          sum += p[j];
        }
        const float total = static_cast<float>(sum);
        for (int64_t j = 0; j < n; ++j)
          p[j] = p[j] / total;
        std::fill_n(out + t * heads * dv + (h0 + r) * dv, dv, 0.0f);
      }
      for (int64_t j = 0; j < n; ++j) {
        if (j + kPrefetchRows < n)
          prefetchRow(values + (j + kPrefetchRows) * vw, dv);
        const float *v = values + j * vw;
        for (int64_t r = 0; r < run; ++r) {
          const float p = probs[r * n + j];
          float *o = out + t * heads * dv + (h0 + r) * dv;
          for (int64_t d = 0; d < dv; ++d)
            o[d] += p * v[d];
        }
      }
    }
  });
}

} // namespace

void KVCache::bind(float *keys_, float *values_, int64_t slots_, int64_t maxSeqLen_,
                   int64_t keyWidth_, int64_t valueWidth_) {
  if (slots_ < 0 || maxSeqLen_ < 0 || keyWidth_ < 0 || valueWidth_ < 0)
    inputError("kv cache: negative size ({} slots, {} positions, widths {} and {})", slots_,
               maxSeqLen_, keyWidth_, valueWidth_);
  slots = slots_;
  maxSeqLen = maxSeqLen_;
  keyWidth = keyWidth_;
  valueWidth = valueWidth_;
  keyData = keys_;
  valueData = values_;
}

void KVCache::allocate(int64_t slots_, int64_t maxSeqLen_, int64_t keyWidth_, int64_t valueWidth_) {
  // Zero-filled so that reading a row never sees garbage, even if a caller
  // skipped a position.
  keys.assign(static_cast<size_t>(std::max<int64_t>(slots_ * maxSeqLen_ * keyWidth_, 0)), 0.0f);
  values.assign(static_cast<size_t>(std::max<int64_t>(slots_ * maxSeqLen_ * valueWidth_, 0)),
                0.0f);
  bind(keys.data(), values.data(), slots_, maxSeqLen_, keyWidth_, valueWidth_);
}

void attention(const float *q, const float *k, const float *v, const TokenLayout &layout,
               int64_t heads, int64_t kvHeads, int64_t dq, int64_t dv, double scale,
               int64_t slidingWindow, KVCache &cache, float *out) {
  if (heads <= 0 || kvHeads <= 0 || heads % kvHeads != 0)
    inputError("attention: {} heads cannot share {} kv heads", heads, kvHeads);
  if (dq <= 0 || dv <= 0)
    inputError("attention: head dims must be positive (q/k {}, v {})", dq, dv);
  if (cache.keyWidth != kvHeads * dq || cache.valueWidth != kvHeads * dv)
    inputError("attention: cache rows of {}/{} values, expected {}/{}", cache.keyWidth,
               cache.valueWidth, kvHeads * dq, kvHeads * dv);
  checkLayout(layout, cache, "attention");
  // Serial: a few rows per token, and a layout that repeats a (slot,
  // position) must not turn into a data race.
  for (int64_t t = 0; t < layout.tokens; ++t) {
    const int64_t slot = layout.sequence[t], pos = layout.position[t];
    std::memcpy(cache.key(slot, pos), k + t * cache.keyWidth, sizeof(float) * cache.keyWidth);
    std::memcpy(cache.value(slot, pos), v + t * cache.valueWidth, sizeof(float) * cache.valueWidth);
  }
  attendCached(q, heads * dq, layout, heads, kvHeads, dq, dv, scale, slidingWindow, cache, out);
}

void mlaAttention(const float *q, const float *kv, const float *keyRope,
                  const TokenLayout &layout, int64_t heads, int64_t nope, int64_t rope,
                  int64_t vdim, double scale, const RopeTable &table, KVCache &cache,
                  float *out) {
  const int64_t T = layout.tokens, qk = nope + rope;
  if (heads <= 0 || nope < 0 || rope <= 0 || vdim <= 0)
    inputError("mla_attention: bad dims (heads {}, nope {}, rope {}, v {})", heads, nope, rope, vdim);
  if (table.params().rotaryDim != rope)
    inputError("mla_attention: rope rotary_dim {} differs from the key_rope width {}",
               table.params().rotaryDim, rope);
  if (cache.keyWidth != heads * qk || cache.valueWidth != heads * vdim)
    inputError("mla_attention: cache rows of {}/{} values, expected {}/{}", cache.keyWidth,
               cache.valueWidth, heads * qk, heads * vdim);
  checkLayout(layout, cache, "mla_attention");
  // Rotate copies (the operands are const): the rotary tail of each query
  // head (x + nope: heads of width qk whose first `rope` values rotate) and
  // the shared key_rope.
  std::vector<float> query(q, q + T * heads * qk);
  table.apply(query.data() + nope, T, heads * qk, qk, layout.position, heads * qk);
  std::vector<float> keyRot(keyRope, keyRope + T * rope);
  table.apply(keyRot.data(), T, rope, rope, layout.position);
  // Per head: key = [kv_h[:nope], rope(key_rope)], value = kv_h[nope:].
  const int64_t kvWidth = nope + vdim;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t slot = layout.sequence[t], pos = layout.position[t];
    float *keyRow = cache.key(slot, pos), *valueRow = cache.value(slot, pos);
    for (int64_t h = 0; h < heads; ++h) {
      const float *src = kv + (t * heads + h) * kvWidth;
      std::memcpy(keyRow + h * qk, src, sizeof(float) * nope);
      std::memcpy(keyRow + h * qk + nope, keyRot.data() + t * rope, sizeof(float) * rope);
      std::memcpy(valueRow + h * vdim, src + nope, sizeof(float) * vdim);
    }
  }
  attendCached(query.data(), heads * qk, layout, heads, heads, qk, vdim, scale, 0, cache, out);
}

} // namespace moert::cpu
