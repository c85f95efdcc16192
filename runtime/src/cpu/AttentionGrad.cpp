// The attention gradients (moert/cpu/Gradients.h): per sequence and head,
// the softmax recomputed as one [S, S] block and every product a GEMM
// through cpu::linear (so each ISA level's kernels).
#include "GradientUtil.h"
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Gradients.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace moert::cpu {
namespace {
using namespace grad;

/// The batch's sequences: contiguous runs of one slot, each whole
/// (positions 0, 1, ...); InputError otherwise.
std::vector<std::pair<int64_t, int64_t>> wholeSequences(const TokenLayout &layout) {
  std::vector<std::pair<int64_t, int64_t>> sequences;
  for (int64_t t = 0; t < layout.tokens;) {
    int64_t end = t;
    while (end < layout.tokens && layout.sequence[end] == layout.sequence[t]) {
      if (layout.position[end] != end - t)
        inputError("attention_grad: token {} of sequence slot {} is at position {}, not {} (a "
                   "training step holds whole sequences)",
                   end, layout.sequence[t], layout.position[end], end - t);
      ++end;
    }
    sequences.push_back({t, end});
    t = end;
  }
  return sequences;
}

/// p [S, S] = softmax over j <= i (and inside the window) of scale * p,
/// zero elsewhere.
void causalSoftmax(float *p, int64_t S, float scale, int64_t slidingWindow) {
  for (int64_t i = 0; i < S; ++i) {
    float *row = p + i * S;
    const int64_t first = slidingWindow > 0 ? std::max<int64_t>(0, i - slidingWindow + 1) : 0;
    float peak = -INFINITY;
    for (int64_t j = first; j <= i; ++j)
      peak = std::max(peak, row[j] * scale);
    double sum = 0;
    for (int64_t j = first; j <= i; ++j)
      sum += (row[j] = std::exp(row[j] * scale - peak));
    const float inverse = static_cast<float>(1 / sum);
    std::fill(row, row + first, 0.0f);
    for (int64_t j = first; j <= i; ++j)
      row[j] *= inverse;
    std::fill(row + i + 1, row + S, 0.0f);
  }
}

} // namespace

void attentionGrad(const float *dout, const float *q, const float *k, const float *v,
                   const TokenLayout &layout, int64_t heads, int64_t kvHeads, int64_t qkDim,
                   int64_t vDim, double scale, int64_t slidingWindow, float *dq, float *dk,
                   float *dv) {
  const int64_t T = layout.tokens, group = heads / kvHeads;
  const int64_t qw = heads * qkDim, kw = kvHeads * qkDim, vw = kvHeads * vDim, ow = heads * vDim;
  const auto sequences = wholeSequences(layout);
  // Each head's share of dk and dv, summed over its group in head order
  // afterwards (the same bits for any thread count).
  float *dkHeads = workspace(kAttnKeyGrads, static_cast<size_t>(T * heads * qkDim));
  float *dvHeads = workspace(kAttnValueGrads, static_cast<size_t>(T * heads * vDim));
  const float scaleF = static_cast<float>(scale);
  const int64_t tasks = static_cast<int64_t>(sequences.size()) * heads;
  parallelFor(tasks, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const auto [b, e] = sequences[task / heads];
      const int64_t h = task % heads, g = h / group, S = e - b;
      const size_t square = static_cast<size_t>(S * S);
      float *p = workspace(kAttnScores, square), *ds = workspace(kAttnDScores, square);
      float *squareT = workspace(kAttnSquareT, square);
      float *panelT = workspace(kAttnPanelT, static_cast<size_t>(std::max(qkDim, vDim) * S));
      const float *qh = q + b * qw + h * qkDim, *doh = dout + b * ow + h * vDim;
      const float *kg = k + b * kw + g * qkDim, *vg = v + b * vw + g * vDim;
      // P = softmax(scale Q K^T); dP = dO V^T; dS = P (dP - rowsum(P dP)) scale.
      linear(qh, S, f32Matrix(kg, S, qkDim, kw), nullptr, p, qw, S);
      causalSoftmax(p, S, scaleF, slidingWindow);
      linear(doh, S, f32Matrix(vg, S, vDim, vw), nullptr, ds, ow, S);
      for (int64_t i = 0; i < S; ++i) {
        const float *pi = p + i * S;
        float *di = ds + i * S;
        double dot = 0;
        for (int64_t j = 0; j <= i; ++j)
          dot += static_cast<double>(pi[j]) * di[j];
        const float rowDot = static_cast<float>(dot);
        for (int64_t j = 0; j < S; ++j)
          di[j] = pi[j] * (di[j] - rowDot) * scaleF;
      }
      // dQ = dS K; dK_h = dS^T Q; dV_h = P^T dO.
      transposeSerial(kg, S, qkDim, kw, panelT, S);
      linear(ds, S, f32Matrix(panelT, qkDim, S), nullptr, dq + b * qw + h * qkDim, S, qw);
      transposeSerial(ds, S, S, S, squareT, S);
      transposeSerial(qh, S, qkDim, qw, panelT, S);
      linear(squareT, S, f32Matrix(panelT, qkDim, S), nullptr, dkHeads + b * qw + h * qkDim, S,
             qw);
      transposeSerial(p, S, S, S, squareT, S);
      transposeSerial(doh, S, vDim, ow, panelT, S);
      linear(squareT, S, f32Matrix(panelT, vDim, S), nullptr, dvHeads + b * ow + h * vDim, S,
             ow);
    }
  });
  parallelFor(T, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t g = 0; g < kvHeads; ++g) {
        float *dkt = dk + t * kw + g * qkDim, *dvt = dv + t * vw + g * vDim;
        const float *kh = dkHeads + t * qw + g * group * qkDim;
        const float *vh = dvHeads + t * ow + g * group * vDim;
        std::copy_n(kh, qkDim, dkt);
        std::copy_n(vh, vDim, dvt);
        for (int64_t r = 1; r < group; ++r) {
          for (int64_t c = 0; c < qkDim; ++c)
            dkt[c] += kh[r * qkDim + c];
          for (int64_t c = 0; c < vDim; ++c)
            dvt[c] += vh[r * vDim + c];
        }
      }
  }, 16);
}

void mlaAttentionGrad(const float *dout, const float *q, const float *kv, const float *keyRope,
                      const TokenLayout &layout, int64_t heads, int64_t nope, int64_t rope,
                      int64_t vdim, double scale, const RopeTable &table, float *dq, float *dkv,
                      float *dkeyRope) {
  const int64_t T = layout.tokens, qk = nope + rope, kvWidth = nope + vdim;
  if (table.params().rotaryDim != rope)
    inputError("mla_attention_grad: rope rotary_dim {} differs from the key_rope width {}",
               table.params().rotaryDim, rope);
  // The forward's operands of attention: the rotated query, the keys
  // [kv_h[:n], rope(key_rope)] and the values kv_h[n:].
  std::vector<float> query(q, q + T * heads * qk), keyRot(keyRope, keyRope + T * rope);
  table.apply(query.data() + nope, T, heads * qk, qk, layout.position, heads * qk);
  table.apply(keyRot.data(), T, rope, rope, layout.position);
  std::vector<float> keys(static_cast<size_t>(T * heads * qk)),
      values(static_cast<size_t>(T * heads * vdim));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const float *src = kv + (t * heads + h) * kvWidth;
      std::copy_n(src, nope, keys.data() + (t * heads + h) * qk);
      std::copy_n(keyRot.data() + t * rope, rope, keys.data() + (t * heads + h) * qk + nope);
      std::copy_n(src + nope, vdim, values.data() + (t * heads + h) * vdim);
    }
  std::vector<float> dkeys(keys.size()), dvalues(values.size());
  attentionGrad(dout, query.data(), keys.data(), values.data(), layout, heads, heads, qk, vdim,
                scale, 0, dq, dkeys.data(), dvalues.data());
  table.applyTransposed(dq + nope, T, heads * qk, qk, layout.position);
  std::fill(dkeyRope, dkeyRope + T * rope, 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      float *dst = dkv + (t * heads + h) * kvWidth;
      const float *dk = dkeys.data() + (t * heads + h) * qk;
      std::copy_n(dk, nope, dst);
      std::copy_n(dvalues.data() + (t * heads + h) * vdim, vdim, dst + nope);
      for (int64_t i = 0; i < rope; ++i)
        dkeyRope[t * rope + i] += dk[nope + i];
    }
  table.applyTransposed(dkeyRope, T, rope, rope, layout.position);
}

} // namespace moert::cpu
