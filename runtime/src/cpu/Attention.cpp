// Causal (sliding-window) GQA attention and DeepSeek's MLA over a KV cache.
// A batch first writes its keys and values into the cache at (sequence,
// position); then every (token, head) attends to rows 0..pos (or the last
// `window` of them) of its own sequence's slot, so prefill, decode and mixed
// batches are one code path and a decode step sees exactly the rows a full
// recomputation would.
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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
/// batch or the thread count.
void attendCached(const float *q, int64_t ldq, const TokenLayout &layout, int64_t heads,
                  int64_t kvHeads, int64_t dq, int64_t dv, double scale, int64_t window,
                  const KVCache &cache, float *out) {
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
      const float *keys = cache.keys.data() + (slot * cache.maxSeqLen + first) * kw + g * dq;
      const float *values = cache.values.data() + (slot * cache.maxSeqLen + first) * vw + g * dv;
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

void KVCache::allocate(int64_t slots_, int64_t maxSeqLen_, int64_t keyWidth_, int64_t valueWidth_) {
  if (slots_ < 0 || maxSeqLen_ < 0 || keyWidth_ < 0 || valueWidth_ < 0)
    inputError("kv cache: negative size ({} slots, {} positions, widths {} and {})", slots_,
               maxSeqLen_, keyWidth_, valueWidth_);
  slots = slots_;
  maxSeqLen = maxSeqLen_;
  keyWidth = keyWidth_;
  valueWidth = valueWidth_;
  // Zero-filled so that reading a row never sees garbage, even if a caller
  // skipped a position.
  keys.assign(static_cast<size_t>(slots * maxSeqLen * keyWidth), 0.0f);
  values.assign(static_cast<size_t>(slots * maxSeqLen * valueWidth), 0.0f);
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
