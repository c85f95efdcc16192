// The backward pass's CPU kernels (moert/cpu/Gradients.h).
#include "moert/cpu/Gradients.h"
#include "GradientUtil.h"
#include "Gemm.h"
#include "VectorMath.h"
#include "moert/Error.h"
#include "moert/Parallel.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace moert::cpu {
namespace {
using namespace grad;


/// act(a) and act'(a) (one exponential for SiLU).
void activationAndSlope(Activation act, double a, double &value, double &slope) {
  switch (act) {
  case Activation::Silu: {
    const double s = 1 / (1 + std::exp(-a));
    value = a * s;
    slope = s * (1 + a * (1 - s));
    return;
  }
  case Activation::Gelu: {
    const double phi = 0.5 * (1 + std::erf(a / std::sqrt(2.0)));
    value = a * phi;
    slope = phi + a * std::exp(-0.5 * a * a) / std::sqrt(2 * M_PI);
    return;
  }
  case Activation::GeluTanh: {
    const double c = 0.7978845608028654, u = c * (a + 0.044715 * a * a * a);
    const double th = std::tanh(u);
    value = 0.5 * a * (1 + th);
    slope = 0.5 * (1 + th) + 0.5 * a * (1 - th * th) * c * (1 + 3 * 0.044715 * a * a);
    return;
  }
  default:
    value = a > 0 ? a : 0;
    slope = a > 0 ? 1 : 0;
  }
}

/// h [T, I] = act(a) * u, with the forward kernels' arithmetic (the bits
/// of the h the forward multiplied by down: a recomputed expert output
/// equals the saved one).
void gatedProduct(const float *a, const float *u, int64_t T, int64_t I, Activation act,
                  float *h) {
  parallelFor(T, [&](int64_t begin, int64_t end) {
    std::copy(a + begin * I, a + end * I, h + begin * I);
    forwardGatedProduct(act, h + begin * I, u + begin * I, (end - begin) * I);
  }, 4);
}

#ifdef MOERT_X86
/// da = dh u silu'(a) and du = dh silu(a) over n values in f32, as torch's
/// SiLU backward: s = sigmoid(a), silu' = s + silu (1 - s).
MOERT_AVX512 void siluGradAvx512(const float *a, const float *u, const float *dh, float *da,
                                 float *du, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(m, a + i), g = _mm512_maskz_loadu_ps(m, dh + i);
    const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    const __m512 value = _mm512_mul_ps(x, s);
    const __m512 slope = _mm512_fmadd_ps(value, _mm512_sub_ps(one, s), s);
    _mm512_mask_storeu_ps(da + i, m, _mm512_mul_ps(_mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, u + i)), slope));
    _mm512_mask_storeu_ps(du + i, m, _mm512_mul_ps(g, value));
  }
}

/// siluGradAvx512 for AVX2 (8 lanes; the tail in f64).
MOERT_AVX2 int64_t siluGradAvx2(const float *a, const float *u, const float *dh, float *da,
                                float *du, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i), g = _mm256_loadu_ps(dh + i);
    const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
    const __m256 value = _mm256_mul_ps(x, s);
    const __m256 slope = _mm256_fmadd_ps(value, _mm256_sub_ps(one, s), s);
    _mm256_storeu_ps(da + i, _mm256_mul_ps(_mm256_mul_ps(g, _mm256_loadu_ps(u + i)), slope));
    _mm256_storeu_ps(du + i, _mm256_mul_ps(g, value));
  }
  return i;
}
#endif

#ifdef MOERT_X86
/// o[v] = e^(x[v] - peak) over n values in f32; returns their sum in f64.
MOERT_AVX512 double expShiftedAvx512(const float *x, int64_t n, float peak, float *o) {
  const __m512 shift = _mm512_set1_ps(peak);
  __m512d sum = _mm512_setzero_pd();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), shift)));
    _mm512_mask_storeu_ps(o + i, m, e);
    sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  return _mm512_reduce_add_pd(sum);
}

/// expShiftedAvx512 for AVX2 (8 lanes; returns how many it did).
MOERT_AVX2 int64_t expShiftedAvx2(const float *x, int64_t n, float peak, float *o, double &total) {
  const __m256 shift = _mm256_set1_ps(peak);
  __m256d sum = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift));
    _mm256_storeu_ps(o + i, e);
    sum = _mm256_add_pd(sum, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    sum = _mm256_add_pd(sum, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, sum);
  total = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  return i;
}
#endif

} // namespace

/// o[v] = e^(x[v] - peak) over n values (f32, the softmax's numerators, as
/// torch's f32 softmax; f64 on the portable level); returns their sum (f64).
double grad::expShifted(const float *x, int64_t n, float peak, float *o) {
  double sum = 0;
  int64_t i = 0;
#ifdef MOERT_X86
  if (gemm::haveAvx512())
    return expShiftedAvx512(x, n, peak, o);
  if (gemm::haveAvx2())
    i = expShiftedAvx2(x, n, peak, o, sum);
#endif
  for (; i < n; ++i) {
    const double e = std::exp(static_cast<double>(x[i]) - peak);
    o[i] = static_cast<float>(e);
    sum += e;
  }
  return sum;
}

namespace {

/// The gated product's gradient over n values: da = dh u act'(a), du = dh
/// act(a) (SiLU vectorised in f32 where the level has it; f64 otherwise).
void gatedProductGrad(Activation act, const float *a, const float *u, const float *dh, float *da,
                      float *du, int64_t n) {
  int64_t i = 0;
#ifdef MOERT_X86
  if (act == Activation::Silu && gemm::haveAvx512())
    return siluGradAvx512(a, u, dh, da, du, n);
  if (act == Activation::Silu && gemm::haveAvx2())
    i = siluGradAvx2(a, u, dh, da, du, n);
#endif
  for (; i < n; ++i) {
    double value, slope;
    activationAndSlope(act, a[i], value, slope);
    da[i] = static_cast<float>(static_cast<double>(dh[i]) * u[i] * slope);
    du[i] = static_cast<float>(dh[i] * value);
  }
}

/// The gated MLP's gradients given its recomputed a = x gate^T, u = x up^T
/// and h = act(a) * u [T, I]: dx [T, H] and the weight gradients.
void mlpBackward(const float *dy, const float *x, int64_t T, const Matrix &gate,
                 const Matrix &up, const Matrix &down, Activation act, const float *a,
                 const float *u, const float *h, float *dx, float *dgate, float *dup,
                 float *ddown) {
  const int64_t H = gate.cols, I = gate.rows;
  matmulTN(dy, H, h, I, T, H, I, ddown, 0, bf16Products(down));
  float *dh = workspace(kMlpDh, static_cast<size_t>(T * I));
  linear(dy, T, down.transpose(), nullptr, dh);
  // [da | du] [T, 2I].
  float *dadu = workspace(kMlpDaDu, static_cast<size_t>(2 * T * I));
  parallelFor(T, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      gatedProductGrad(act, a + t * I, u + t * I, dh + t * I, dadu + 2 * t * I,
                       dadu + 2 * t * I + I, I);
  }, 4);
  matmulTN(dadu, 2 * I, x, H, T, I, H, dgate, 0, bf16Products(gate));
  matmulTN(dadu + I, 2 * I, x, H, T, I, H, dup, 0, bf16Products(up));
  // dx = da gate + du up.
  float *part = workspace(kMlpPart, static_cast<size_t>(T * H));
  linear(dadu, T, gate.transpose(), nullptr, dx, 2 * I);
  linear(dadu + I, T, up.transpose(), nullptr, part, 2 * I);
  add(dx, part, T * H, dx);
}

} // namespace

void grad::mlpBackwardRecomputed(const float *dy, const float *x, int64_t T, const Matrix &gate,
                                 const Matrix &up, const Matrix &down, Activation act,
                                 float *dx, float *dgate, float *dup, float *ddown) {
  const size_t inner = static_cast<size_t>(T * gate.rows);
  float *a = workspace(kMlpA, inner), *u = workspace(kMlpU, inner), *h = workspace(kMlpH, inner);
  linear(x, T, gate, nullptr, a);
  linear(x, T, up, nullptr, u);
  gatedProduct(a, u, T, gate.rows, act, h);
  mlpBackward(dy, x, T, gate, up, down, act, a, u, h, dx, dgate, dup, ddown);
}

namespace {

/// The cross-entropy's gradient row by row: out 0, and for a row with a
/// label (checked against vocab) its `n` columns from the softmax's
/// `peak` and normaliser `sum` (null: the columns' own), the label's
/// column (`label` in the row: -1 when another part holds it) less 1, all
/// over ce[1].
template <typename Totals>
void crossEntropyRows(const float *logits, int64_t tokens, int64_t width, int64_t n,
                      int64_t first, int64_t vocab, const int32_t *labels, const float ce[2],
                      Totals totals, float *out) {
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
      float peak;
      double sum;
      totals(t, row, peak, sum);
      const double own = grad::expShifted(row, n, peak, o);
      const float factor = static_cast<float>(scale / (sum > 0 ? sum : own));
      for (int64_t v = 0; v < n; ++v)
        o[v] *= factor;
      const int64_t label = labels[t] - first;
      if (label >= 0 && label < n)
        o[label] -= static_cast<float>(scale);
    }
  }, 4);
}

} // namespace

void crossEntropyGrad(const float *logits, int64_t tokens, int64_t width, int64_t vocab,
                      const int32_t *labels, const float ce[2], float *out) {
  crossEntropyRows(logits, tokens, width, vocab, 0, vocab, labels, ce,
                   [&](int64_t, const float *row, float &peak, double &sum) {
                     peak = *std::max_element(row, row + vocab);
                     sum = 0; // (the row's own)
                   },
                   out);
}

void crossEntropyGradPart(const float *logits, int64_t tokens, int64_t width, int64_t real,
                          int64_t first, int64_t vocab, const int32_t *labels, const float ce[2],
                          const float *stats, int64_t parts, float *out) {
  // The whole row's shift and normaliser, from every part's statistics.
  crossEntropyRows(logits, tokens, width, real, first, vocab, labels, ce,
                   [&](int64_t t, const float *, float &peak, double &sum) {
                     const VocabTotals v = vocabTotals(stats + 4 * parts * t, parts);
                     peak = v.peak;
                     sum = v.sum;
                   },
                   out);
}

void linearGrad(const float *dy, const float *x, int64_t tokens, const Matrix &w, float *dx,
                float *dw) {
  linear(dy, tokens, w.transpose(), nullptr, dx);
  matmulTN(dy, w.rows, x, w.cols, tokens, w.rows, w.cols, dw, 0, bf16Products(w));
}

namespace {

/// rms_norm_grad's loop over rows in groups of w.size(): `factors(t, xg,
/// dyg)` gives a group's r and its sum of dy w x r, `n` the count they are
/// a mean over; dx = r (dy w - x r dot / n) and dw the sum of dy x r,
/// per-thread partial sums added in thread order (the same bits for a given
/// thread count).
template <class Factors>
void rmsNormGradRows(const float *dy, const float *x, int64_t tokens, int64_t width,
                     const std::vector<float> &w, double n, Factors factors, float *dx,
                     float *dw) {
  const int64_t group = static_cast<int64_t>(w.size()), groups = width / group;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(tokens, numThreads()));
  std::vector<std::vector<double>> partial(chunks, std::vector<double>(group, 0.0));
  parallelFor(chunks, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t t = tokens * c / chunks; t < tokens * (c + 1) / chunks; ++t)
        for (int64_t g = 0; g < groups; ++g) {
          const float *xg = x + t * width + g * group, *dyg = dy + t * width + g * group;
          float *dxg = dx + t * width + g * group;
          const auto [r, dot] = factors(t, xg, dyg);
          for (int64_t i = 0; i < group; ++i) {
            dxg[i] = static_cast<float>(r * (dyg[i] * w[i] - xg[i] * r * dot / n));
            partial[c][i] += static_cast<double>(dyg[i]) * xg[i] * r;
          }
        }
  });
  for (int64_t i = 0; i < group; ++i) {
    double sum = 0;
    for (const std::vector<double> &p : partial)
      sum += p[i];
    dw[i] = static_cast<float>(sum);
  }
}

std::vector<float> widened(const TensorView &weight) {
  std::vector<float> w(static_cast<size_t>(weight.numel()));
  for (int64_t i = 0; i < weight.numel(); ++i)
    w[i] = weight.at(i);
  return w;
}

} // namespace

void rmsNormGrad(const float *dy, const float *x, int64_t tokens, int64_t width,
                 const TensorView &weight, double eps, float *dx, float *dw) {
  const std::vector<float> w = widened(weight);
  const int64_t n = weight.numel();
  rmsNormGradRows(dy, x, tokens, width, w, static_cast<double>(n),
                  [&](int64_t, const float *xg, const float *dyg) {
                    double squares = 0;
                    for (int64_t i = 0; i < n; ++i)
                      squares += static_cast<double>(xg[i]) * xg[i];
                    const double r = 1.0 / std::sqrt(squares / n + eps);
                    double dot = 0;
                    for (int64_t i = 0; i < n; ++i)
                      dot += static_cast<double>(dyg[i]) * w[i] * xg[i] * r;
                    return std::pair(r, dot);
                  },
                  dx, dw);
}

void rmsNormGradStats(const float *dy, const float *x, int64_t tokens, int64_t width,
                      const TensorView &weight, float *out) {
  const std::vector<float> w = widened(weight);
  parallelFor(tokens, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float *xt = x + t * width, *dyt = dy + t * width;
      double squares = 0, dot = 0;
      for (int64_t i = 0; i < width; ++i) {
        squares += static_cast<double>(xt[i]) * xt[i];
        dot += static_cast<double>(dyt[i]) * w[i] * xt[i];
      }
      out[2 * t] = static_cast<float>(squares);
      out[2 * t + 1] = static_cast<float>(dot);
    }
  }, 16);
}

void rmsNormGradOfStats(const float *dy, const float *x, int64_t tokens, int64_t width,
                        const TensorView &weight, const float *stats, int64_t rowWidth,
                        double eps, float *dx, float *dw) {
  // (The whole rows' sums: their r, and their sum of dy w x times it.)
  const double n = static_cast<double>(rowWidth);
  rmsNormGradRows(dy, x, tokens, width, widened(weight), n,
                  [&](int64_t t, const float *, const float *) {
                    const double r = 1.0 / std::sqrt(static_cast<double>(stats[2 * t]) / n + eps);
                    return std::pair(r, static_cast<double>(stats[2 * t + 1]) * r);
                  },
                  dx, dw);
}

void mlpGrad(const float *dy, const float *x, int64_t tokens, const Matrix &gate,
             const Matrix &up, const Matrix &down, Activation act, float *dx, float *dgate,
             float *dup, float *ddown) {
  const size_t size = static_cast<size_t>(tokens * gate.rows);
  float *a = workspace(kMlpA, size), *u = workspace(kMlpU, size), *h = workspace(kMlpH, size);
  linear(x, tokens, gate, nullptr, a);
  linear(x, tokens, up, nullptr, u);
  gatedProduct(a, u, tokens, gate.rows, act, h);
  mlpBackward(dy, x, tokens, gate, up, down, act, a, u, h, dx, dgate, dup, ddown);
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
                 float *dgate, float *dup, float *ddown, const float *savedGate,
                 const float *savedUp, const float *savedOutput, double capacityFactor) {
  const int64_t E = static_cast<int64_t>(gate.size()), H = hidden;
  const bool saved = savedGate && savedUp && savedOutput;
  const int64_t I = E ? gate[0].rows : 0;
  // Each (token, slot)'s input gradient, summed per token in slot order.
  float *rowsDx = workspace(kExpertRowsDx, static_cast<size_t>(tokens * k * H));
  std::fill(rowsDx, rowsDx + tokens * k * H, 0.0f);
  std::fill(dweights, dweights + tokens * k, 0.0f);
  // The pairs (t * k + j) of each expert, the forward's drops left out:
  // those take no gradient.
  const ExpertAssignments assigned =
      assignmentsByExpert(experts, tokens, k, E, capacityFactor, "experts_grad");
  for (int64_t e = 0; e < E; ++e) {
    const int64_t *rows = assigned.order.data() + assigned.start[e];
    float *dg = dgate + e * I * H, *du = dup + e * I * H, *dd = ddown + e * H * I;
    const int64_t n = assigned.start[e + 1] - assigned.start[e];
    if (n == 0) {
      std::fill(dg, dg + I * H, 0.0f);
      std::fill(du, du + I * H, 0.0f);
      std::fill(dd, dd + H * I, 0.0f);
      continue;
    }
    const size_t rowFloats = static_cast<size_t>(n * H), inner = static_cast<size_t>(n * I);
    float *xe = workspace(kExpertX, rowFloats), *ye = workspace(kExpertY, rowFloats);
    float *dye = workspace(kExpertDy, rowFloats), *dxe = workspace(kExpertDx, rowFloats);
    float *a = workspace(kMlpA, inner), *u = workspace(kMlpU, inner);
    float *h = workspace(kMlpH, inner);
    parallelFor(n, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        std::copy_n(x + (rows[r] / k) * H, H, xe + r * H);
        if (saved) {
          std::copy_n(savedGate + rows[r] * I, I, a + r * I);
          std::copy_n(savedUp + rows[r] * I, I, u + r * I);
        }
      }
    }, 16);
    // The expert's forward: a, u and its output ye saved by the forward
    // pass (moe.experts_saved) or recomputed here; h = act(a) u.
    if (!saved) {
      linear(xe, n, gate[e], nullptr, a);
      linear(xe, n, up[e], nullptr, u);
    }
    gatedProduct(a, u, n, I, act, h);
    // The forward's output as experts computed it (h has the forward's
    // arithmetic), so that the routing weights' gradient dy . y has the
    // bits of a plan that saved it.
    if (!saved)
      linear(h, n, down[e], nullptr, ye);
    parallelFor(n, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float *g = dy + (rows[r] / k) * H;
        const float *yr = saved ? savedOutput + rows[r] * H : ye + r * H;
        double d = 0;
        for (int64_t c = 0; c < H; ++c) {
          d += static_cast<double>(g[c]) * yr[c];
          dye[r * H + c] = weights[rows[r]] * g[c];
        }
        dweights[rows[r]] = static_cast<float>(d);
      }
    }, 16);
    mlpBackward(dye, xe, n, gate[e], up[e], down[e], act, a, u, h, dxe, dg, du, dd);
    parallelFor(n, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        std::copy_n(dxe + r * H, H, rowsDx + rows[r] * H);
    }, 16);
  }
  parallelFor(tokens, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float *o = dx + t * H;
      std::copy_n(rowsDx + t * k * H, H, o);
      for (int64_t j = 1; j < k; ++j)
        for (int64_t c = 0; c < H; ++c)
          o[c] += rowsDx[(t * k + j) * H + c];
    }
  }, 16);
}

void routerStatsGrad(const float *logits, int64_t tokens, int64_t experts,
                     const float *const *stats, int64_t layers, double auxCoef, double zCoef,
                     float *dlogits, int64_t sequences) {
  const int64_t E = experts;
  double rows = 0;
  std::vector<double> counts(E, 0.0);
  for (int64_t l = 0; l < layers; ++l) {
    rows += stats[l][2 * E + 1];
    for (int64_t e = 0; e < E; ++e)
      counts[e] += stats[l][E + e];
  }
  std::vector<double> g(E, 0.0);
  if (auxCoef > 0 && rows > 0 && sequences <= 0)
    for (int64_t e = 0; e < E; ++e)
      g[e] = auxCoef * E * counts[e] / (rows * rows);
  // DeepSeek-V3's sequence-wise loss: d/ds'_te = aux_coef f_be / (B L) for
  // t in sequence b, through s' = s / sum(s), s = sigmoid(l).
  std::vector<double> seqG;
  int64_t L = 0;
  if (auxCoef > 0 && sequences > 0 && layers > 0 && tokens > 0) {
    const int64_t k = static_cast<int64_t>(stats[0][2 * E + 2]);
    seqG = sequenceTopKCounts(logits, tokens, E, k, sequences);
    L = tokens / sequences;
    for (double &c : seqG)
      c = auxCoef * (c * E / (static_cast<double>(L) * k)) / (static_cast<double>(sequences) * L);
  }
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
      if (seqG.empty())
        continue;
      const double *gs = seqG.data() + (t / L) * E;
      double total = 0, weighted = 0;
      for (int64_t e = 0; e < E; ++e) {
        p[e] = 1 / (1 + std::exp(-static_cast<double>(l[e])));
        total += p[e];
        weighted += gs[e] * p[e];
      }
      for (int64_t e = 0; e < E; ++e)
        dlogits[t * E + e] += static_cast<float>(p[e] * (1 - p[e]) *
                                                 (gs[e] / total - weighted / (total * total)));
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

} // namespace moert::cpu
