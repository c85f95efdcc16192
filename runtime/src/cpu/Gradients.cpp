// The backward pass's CPU kernels (moert/cpu/Gradients.h).
#include "moert/cpu/Gradients.h"
#include "Gemm.h"
#include "moert/Error.h"
#include "moert/Parallel.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace moert::cpu {
namespace {

/// out [cols, rows] = in [rows, cols]^T.
void transpose(const float *in, int64_t rows, int64_t cols, float *out) {
  parallelFor(cols, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      for (int64_t r = 0; r < rows; ++r)
        out[c * rows + r] = in[r * cols + c];
  }, 16);
}

/// A weight [rows, cols] of any dtype, widened to f32 and transposed:
/// [cols, rows].
std::vector<float> transposedF32(const Matrix &w) {
  std::vector<float> row(static_cast<size_t>(w.cols)), out(static_cast<size_t>(w.rows * w.cols));
  const size_t element = dtypeSize(w.dtype);
  for (int64_t r = 0; r < w.rows; ++r) {
    gemm::widen(w.dtype, static_cast<const char *>(w.data) + r * w.rowStride * element, w.cols,
                row.data());
    for (int64_t c = 0; c < w.cols; ++c)
      out[c * w.rows + r] = row[c];
  }
  return out;
}

Matrix f32Matrix(const float *data, int64_t rows, int64_t cols) {
  Matrix m;
  m.dtype = DType::F32;
  m.data = data;
  m.rows = rows;
  m.cols = cols;
  m.rowStride = cols;
  return m;
}

/// c [m, n] = a [m, k] b [k, n] with bT = b^T [n, k] given.
void matmul(const float *a, int64_t m, const float *bT, int64_t n, int64_t k, float *c) {
  linear(a, m, f32Matrix(bT, n, k), nullptr, c);
}

/// c [m, n] = a^T b for a [t, m], b [t, n] (sums over the rows t, in order).
void matmulTN(const float *a, const float *b, int64_t t, int64_t m, int64_t n, float *c) {
  std::vector<float> aT(static_cast<size_t>(m * t)), bT(static_cast<size_t>(n * t));
  transpose(a, t, m, aT.data());
  transpose(b, t, n, bT.data());
  matmul(aT.data(), m, bT.data(), n, t, c);
}

double activation(Activation act, double a) {
  switch (act) {
  case Activation::Silu: return a / (1 + std::exp(-a));
  case Activation::Gelu: return 0.5 * a * (1 + std::erf(a / std::sqrt(2.0)));
  case Activation::GeluTanh:
    return 0.5 * a * (1 + std::tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)));
  default: return a > 0 ? a : 0;
  }
}

double activationSlope(Activation act, double a) {
  switch (act) {
  case Activation::Silu: {
    const double s = 1 / (1 + std::exp(-a));
    return s * (1 + a * (1 - s));
  }
  case Activation::Gelu:
    return 0.5 * (1 + std::erf(a / std::sqrt(2.0))) +
           a * std::exp(-0.5 * a * a) / std::sqrt(2 * M_PI);
  case Activation::GeluTanh: {
    const double c = 0.7978845608028654, u = c * (a + 0.044715 * a * a * a);
    const double th = std::tanh(u);
    return 0.5 * (1 + th) + 0.5 * a * (1 - th * th) * c * (1 + 3 * 0.044715 * a * a);
  }
  default: return a > 0 ? 1 : 0;
  }
}

} // namespace

void crossEntropyGrad(const float *logits, int64_t tokens, int64_t width, int64_t vocab,
                      const int32_t *labels, const float ce[2], float *out) {
  const double scale = ce[1] > 0 ? 1.0 / ce[1] : 0.0;
  parallelFor(tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *row = logits + t * width;
      float *o = out + t * width;
      std::fill(o, o + width, 0.0f);
      if (labels[t] == -100)
        continue;
      if (labels[t] < 0 || labels[t] >= vocab)
        inputError("cross_entropy_grad: label {} of row {} is outside [0, {})", labels[t], t,
                   vocab);
      const float peak = *std::max_element(row, row + vocab);
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v)
        sum += std::exp(static_cast<double>(row[v]) - peak);
      for (int64_t v = 0; v < vocab; ++v)
        o[v] = static_cast<float>(std::exp(static_cast<double>(row[v]) - peak) / sum * scale);
      o[labels[t]] -= static_cast<float>(scale);
    }
  }, 4);
}

void linearGrad(const float *dy, const float *x, int64_t tokens, const Matrix &w, float *dx,
                float *dw) {
  const std::vector<float> wT = transposedF32(w); // [in, out]
  matmul(dy, tokens, wT.data(), w.cols, w.rows, dx);
  matmulTN(dy, x, tokens, w.rows, w.cols, dw);
}

void rmsNormGrad(const float *dy, const float *x, int64_t tokens, int64_t width,
                 const TensorView &weight, double eps, float *dx, float *dw) {
  const int64_t n = weight.numel(), groups = width / n;
  std::vector<float> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    w[i] = weight.at(i);
  // Per-thread partial dw, added in thread order (the same bits for a given
  // thread count).
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(tokens, numThreads()));
  std::vector<std::vector<double>> partial(chunks, std::vector<double>(n, 0.0));
  parallelFor(chunks, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t t = tokens * c / chunks; t < tokens * (c + 1) / chunks; ++t)
        for (int64_t g = 0; g < groups; ++g) {
          const float *xg = x + t * width + g * n, *dyg = dy + t * width + g * n;
          float *dxg = dx + t * width + g * n;
          double squares = 0;
          for (int64_t i = 0; i < n; ++i)
            squares += static_cast<double>(xg[i]) * xg[i];
          const double r = 1.0 / std::sqrt(squares / n + eps);
          double dot = 0;
          for (int64_t i = 0; i < n; ++i)
            dot += static_cast<double>(dyg[i]) * w[i] * xg[i] * r;
          for (int64_t i = 0; i < n; ++i) {
            dxg[i] = static_cast<float>(r * (dyg[i] * w[i] - xg[i] * r * dot / n));
            partial[c][i] += static_cast<double>(dyg[i]) * xg[i] * r;
          }
        }
  });
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0;
    for (const std::vector<double> &p : partial)
      sum += p[i];
    dw[i] = static_cast<float>(sum);
  }
}

void attentionGrad(const float *dout, const float *q, const float *k, const float *v,
                   const TokenLayout &layout, int64_t heads, int64_t kvHeads, int64_t qkDim,
                   int64_t vDim, double scale, int64_t slidingWindow, float *dq, float *dk,
                   float *dv) {
  const int64_t T = layout.tokens, group = heads / kvHeads;
  const int64_t qw = heads * qkDim, kw = kvHeads * qkDim, vw = kvHeads * vDim;
  // The sequences: contiguous runs of one slot, whole (positions 0, 1, ...).
  std::vector<std::pair<int64_t, int64_t>> sequences;
  for (int64_t t = 0; t < T;) {
    int64_t end = t;
    while (end < T && layout.sequence[end] == layout.sequence[t]) {
      if (layout.position[end] != end - t)
        inputError("attention_grad: token {} of sequence slot {} is at position {}, not {} (a "
                   "training step holds whole sequences)",
                   end, layout.sequence[t], layout.position[end], end - t);
      ++end;
    }
    sequences.push_back({t, end});
    t = end;
  }
  std::fill(dq, dq + T * qw, 0.0f);
  std::fill(dk, dk + T * kw, 0.0f);
  std::fill(dv, dv + T * vw, 0.0f);
  const int64_t tasks = static_cast<int64_t>(sequences.size()) * kvHeads;
  parallelFor(tasks, [&](int64_t begin, int64_t end) {
    std::vector<double> p, dp;
    for (int64_t task = begin; task < end; ++task) {
      const auto [b, e] = sequences[task / kvHeads];
      const int64_t g = task % kvHeads;
      for (int64_t h = g * group; h < (g + 1) * group; ++h)
        for (int64_t i = b; i < e; ++i) {
          const int64_t first =
              slidingWindow > 0 ? std::max<int64_t>(b, i - slidingWindow + 1) : b;
          const float *qi = q + i * qw + h * qkDim, *doi = dout + i * (heads * vDim) + h * vDim;
          p.assign(static_cast<size_t>(i - first + 1), 0.0);
          dp.assign(p.size(), 0.0);
          double peak = -INFINITY;
          for (int64_t j = first; j <= i; ++j) {
            const float *kj = k + j * kw + g * qkDim;
            double s = 0;
            for (int64_t d = 0; d < qkDim; ++d)
              s += static_cast<double>(qi[d]) * kj[d];
            p[j - first] = s * scale;
            peak = std::max(peak, p[j - first]);
          }
          double sum = 0;
          for (double &x : p)
            sum += (x = std::exp(x - peak));
          double rowDot = 0;
          for (int64_t j = first; j <= i; ++j) {
            p[j - first] /= sum;
            const float *vj = v + j * vw + g * vDim;
            double d = 0;
            for (int64_t c = 0; c < vDim; ++c)
              d += static_cast<double>(doi[c]) * vj[c];
            dp[j - first] = d;
            rowDot += p[j - first] * d;
          }
          float *dqi = dq + i * qw + h * qkDim;
          for (int64_t j = first; j <= i; ++j) {
            const double pj = p[j - first], ds = pj * (dp[j - first] - rowDot) * scale;
            const float *kj = k + j * kw + g * qkDim;
            float *dkj = dk + j * kw + g * qkDim, *dvj = dv + j * vw + g * vDim;
            for (int64_t d = 0; d < qkDim; ++d) {
              dqi[d] += static_cast<float>(ds * kj[d]);
              dkj[d] += static_cast<float>(ds * qi[d]);
            }
            for (int64_t c = 0; c < vDim; ++c)
              dvj[c] += static_cast<float>(pj * doi[c]);
          }
        }
    }
  });
}

void mlpGrad(const float *dy, const float *x, int64_t tokens, const Matrix &gate,
             const Matrix &up, const Matrix &down, Activation act, float *dx, float *dgate,
             float *dup, float *ddown) {
  const int64_t T = tokens, H = gate.cols, I = gate.rows;
  std::vector<float> a(static_cast<size_t>(T * I)), u(a.size()), h(a.size()), dh(a.size());
  linear(x, T, gate, nullptr, a.data());
  linear(x, T, up, nullptr, u.data());
  for (size_t i = 0; i < a.size(); ++i)
    h[i] = static_cast<float>(activation(act, a[i]) * u[i]);
  matmulTN(dy, h.data(), T, H, I, ddown);
  const std::vector<float> downT = transposedF32(down); // [I, H]
  matmul(dy, T, downT.data(), I, H, dh.data());
  // da and du take the places of h and u (read for the last time here).
  std::vector<float> &da = h, &du = u;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = dh[i], upValue = u[i];
    da[i] = static_cast<float>(d * upValue * activationSlope(act, a[i]));
    du[i] = static_cast<float>(d * activation(act, a[i]));
  }
  matmulTN(da.data(), x, T, I, H, dgate);
  matmulTN(du.data(), x, T, I, H, dup);
  const std::vector<float> gateT = transposedF32(gate), upT = transposedF32(up); // [H, I]
  std::vector<float> part(static_cast<size_t>(T * H));
  matmul(da.data(), T, gateT.data(), H, I, dx);
  matmul(du.data(), T, upT.data(), H, I, part.data());
  for (size_t i = 0; i < part.size(); ++i)
    dx[i] += part[i];
}

void embeddingGrad(const float *dy, const int32_t *ids, int64_t tokens, int64_t width,
                   int64_t rows, float *out) {
  for (int64_t t = 0; t < tokens; ++t)
    if (ids[t] < 0 || ids[t] >= rows)
      inputError("embedding_grad: token {} is id {}, outside [0, {})", t, ids[t], rows);
  std::fill(out, out + rows * width, 0.0f);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < width; ++c)
      out[ids[t] * width + c] += dy[t * width + c];
}

void routeGrad(const float *dw, const float *logits, const int32_t *experts, int64_t tokens,
               int64_t numExperts, const RoutingParams &params, float *dlogits) {
  const int64_t E = numExperts, k = params.topK;
  parallelFor(tokens, [&](int64_t begin, int64_t end) {
    std::vector<double> p(E), raw(k), draw(k);
    for (int64_t t = begin; t < end; ++t) {
      const float *l = logits + t * E;
      const int32_t *sel = experts + t * k;
      const float *g = dw + t * k;
      float *out = dlogits + t * E;
      for (int64_t j = 0; j < k; ++j)
        if (sel[j] < 0 || sel[j] >= E)
          inputError("route_grad: token {} selected expert {} of {}", t, sel[j], E);
      // The scores and the selected ones before renormalising.
      const bool selectedSoftmax = !params.sigmoid && params.topkOnLogits;
      if (params.sigmoid) {
        for (int64_t e = 0; e < E; ++e)
          p[e] = 1 / (1 + std::exp(-static_cast<double>(l[e])));
      } else {
        double peak = -INFINITY, sum = 0;
        if (selectedSoftmax) {
          for (int64_t j = 0; j < k; ++j)
            peak = std::max<double>(peak, l[sel[j]]);
          for (int64_t j = 0; j < k; ++j)
            sum += std::exp(l[sel[j]] - peak);
          for (int64_t e = 0; e < E; ++e)
            p[e] = 0;
          for (int64_t j = 0; j < k; ++j)
            p[sel[j]] = std::exp(l[sel[j]] - peak) / sum;
        } else {
          for (int64_t e = 0; e < E; ++e)
            peak = std::max<double>(peak, l[e]);
          for (int64_t e = 0; e < E; ++e)
            sum += (p[e] = std::exp(l[e] - peak));
          for (int64_t e = 0; e < E; ++e)
            p[e] /= sum;
        }
      }
      double total = 0;
      for (int64_t j = 0; j < k; ++j)
        total += (raw[j] = p[sel[j]]);
      const double c = params.scalingFactor, S = total + 1e-20;
      double weighted = 0;
      for (int64_t j = 0; j < k; ++j)
        weighted += g[j] * raw[j];
      for (int64_t j = 0; j < k; ++j)
        draw[j] = params.normalize ? c * (g[j] / S - weighted / (S * S)) : c * g[j];
      std::fill(out, out + E, 0.0f);
      if (params.sigmoid) {
        for (int64_t j = 0; j < k; ++j)
          out[sel[j]] = static_cast<float>(draw[j] * p[sel[j]] * (1 - p[sel[j]]));
        continue;
      }
      // Softmax (over all experts, or over the selected ones): ds is dr at
      // the selected experts.
      double dot = 0;
      for (int64_t j = 0; j < k; ++j)
        dot += p[sel[j]] * draw[j];
      for (int64_t e = 0; e < E; ++e)
        out[e] = static_cast<float>(-p[e] * dot);
      for (int64_t j = 0; j < k; ++j)
        out[sel[j]] += static_cast<float>(p[sel[j]] * draw[j]);
    }
  }, 16);
}

void expertsGrad(const float *dy, const float *x, int64_t tokens, int64_t hidden,
                 const float *weights, const int32_t *experts, int64_t k,
                 const std::vector<Matrix> &gate, const std::vector<Matrix> &up,
                 const std::vector<Matrix> &down, Activation act, float *dx, float *dweights,
                 float *dgate, float *dup, float *ddown) {
  const int64_t E = static_cast<int64_t>(gate.size()), H = hidden;
  const int64_t I = E ? gate[0].rows : 0;
  for (int64_t i = 0; i < tokens * k; ++i)
    if (experts[i] < 0 || experts[i] >= E)
      inputError("experts_grad: token {} selected expert {} of {}", i / k, experts[i], E);
  // Each (token, slot)'s input gradient, summed per token in slot order.
  std::vector<float> rowsDx(static_cast<size_t>(tokens * k * H), 0.0f);
  std::fill(dweights, dweights + tokens * k, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> rows; // (t * k + j)
    for (int64_t i = 0; i < tokens * k; ++i)
      if (experts[i] == e)
        rows.push_back(i);
    float *dg = dgate + e * I * H, *du = dup + e * I * H, *dd = ddown + e * H * I;
    const int64_t n = static_cast<int64_t>(rows.size());
    if (n == 0) {
      std::fill(dg, dg + I * H, 0.0f);
      std::fill(du, du + I * H, 0.0f);
      std::fill(dd, dd + H * I, 0.0f);
      continue;
    }
    std::vector<float> xe(static_cast<size_t>(n * H)), ye(xe.size()), dye(xe.size()),
        dxe(xe.size()), scratch(static_cast<size_t>(2 * n * I));
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(x + (rows[r] / k) * H, H, xe.data() + r * H);
    mlp(xe.data(), n, gate[e], up[e], down[e], act, scratch.data(), ye.data());
    for (int64_t r = 0; r < n; ++r) {
      const float *g = dy + (rows[r] / k) * H;
      double d = 0;
      for (int64_t c = 0; c < H; ++c) {
        d += static_cast<double>(g[c]) * ye[r * H + c];
        dye[r * H + c] = weights[rows[r]] * g[c];
      }
      dweights[rows[r]] = static_cast<float>(d);
    }
    mlpGrad(dye.data(), xe.data(), n, gate[e], up[e], down[e], act, dxe.data(), dg, du, dd);
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(dxe.data() + r * H, H, rowsDx.data() + rows[r] * H);
  }
  for (int64_t t = 0; t < tokens; ++t) {
    float *o = dx + t * H;
    std::copy_n(rowsDx.data() + t * k * H, H, o);
    for (int64_t j = 1; j < k; ++j)
      for (int64_t c = 0; c < H; ++c)
        o[c] += rowsDx[(t * k + j) * H + c];
  }
}

void routerStatsGrad(const float *logits, int64_t tokens, int64_t experts,
                     const float *const *stats, int64_t layers, double auxCoef, double zCoef,
                     float *dlogits) {
  const int64_t E = experts;
  double rows = 0;
  std::vector<double> counts(E, 0.0);
  for (int64_t l = 0; l < layers; ++l) {
    rows += stats[l][2 * E + 1];
    for (int64_t e = 0; e < E; ++e)
      counts[e] += stats[l][E + e];
  }
  std::vector<double> g(E, 0.0);
  if (auxCoef > 0 && rows > 0)
    for (int64_t e = 0; e < E; ++e)
      g[e] = auxCoef * E * counts[e] / (rows * rows);
  parallelFor(tokens, [&](int64_t begin, int64_t end) {
    std::vector<double> p(E);
    for (int64_t t = begin; t < end; ++t) {
      const float *l = logits + t * E;
      double peak = -INFINITY, sum = 0;
      for (int64_t e = 0; e < E; ++e)
        peak = std::max<double>(peak, l[e]);
      for (int64_t e = 0; e < E; ++e)
        sum += (p[e] = std::exp(l[e] - peak));
      const double lse = peak + std::log(sum);
      double dot = 0;
      for (int64_t e = 0; e < E; ++e)
        dot += (p[e] /= sum) * g[e];
      const double z = tokens > 0 ? 2 * zCoef * lse / tokens : 0.0;
      for (int64_t e = 0; e < E; ++e)
        dlogits[t * E + e] = static_cast<float>(p[e] * (g[e] - dot) + z * p[e]);
    }
  }, 16);
}

void biasGrad(const float *dy, int64_t tokens, int64_t width, float *out) {
  parallelFor(width, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      double sum = 0;
      for (int64_t t = 0; t < tokens; ++t)
        sum += dy[t * width + o];
      out[o] = static_cast<float>(sum);
    }
  }, 16);
}

void sigmoidGateGrad(const float *dy, const float *x, const float *gate, int64_t tokens,
                     int64_t width, float *dx, float *dgate) {
  parallelFor(tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const double s = 1 / (1 + std::exp(-static_cast<double>(gate[t])));
      double dot = 0;
      for (int64_t i = 0; i < width; ++i) {
        dot += static_cast<double>(dy[t * width + i]) * x[t * width + i];
        dx[t * width + i] = static_cast<float>(dy[t * width + i] * s);
      }
      dgate[t] = static_cast<float>(dot * s * (1 - s));
    }
  }, 4);
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
