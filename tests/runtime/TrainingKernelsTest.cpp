// The training kernels: the loss (cpu::crossEntropy, routerStats, lmLoss)
// against direct f64 implementations of MoETrainingOps.td's formulas, and
// the backward pass's (moert/cpu/Gradients.h) against central finite
// differences of f64 implementations of the forward ops' formulas
// (MoEOps.td): for a random cotangent r, d/dx sum(r * f(x)) computed both
// ways (the routing, router statistics and experts' in
// MoEGradientsTest.cpp). Run at every ISA level (moert-unit-tests-isa-*: the GEMMs inside go
// through cpu::linear).
#include "GradientCheck.h"
#include "moert/Error.h"
#include "moert/cpu/Gradients.h"
#include "moert/cpu/Isa.h"
#include "moert/Parallel.h"
#include "../../runtime/src/cpu/GradientUtil.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <cmath>
#include <functional>
#include <random>

using namespace moert;
using namespace moert::gradcheck;

namespace {

TEST(LossTest, CrossEntropySkipsIgnoredRowsAndPadding) {
  const int64_t T = 37, width = 20, vocab = 17;
  std::vector<float> logits = randomValues(T * width, 1, 3.0f);
  // Padding columns hold large values that must not count.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = vocab; v < width; ++v)
      logits[t * width + v] = 50.0f;
  std::vector<int32_t> labels(T);
  for (int64_t t = 0; t < T; ++t)
    labels[t] = t % 5 == 0 ? -100 : static_cast<int32_t>((t * 7) % vocab);
  double sum = 0;
  int counted = 0;
  for (int64_t t = 0; t < T; ++t)
    if (labels[t] != -100) {
      sum += lse(&logits[t * width], vocab) - logits[t * width + labels[t]];
      ++counted;
    }
  float out[2];
  cpu::crossEntropy(logits.data(), T, width, vocab, labels.data(), out);
  EXPECT_NEAR(out[0], sum, 1e-6 * sum);
  EXPECT_EQ(out[1], counted);
  // Every row ignored: nothing counted.
  std::vector<int32_t> none(T, -100);
  cpu::crossEntropy(logits.data(), T, width, vocab, none.data(), out);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  // A label outside the vocabulary (the padding included) is an error.
  labels[3] = static_cast<int32_t>(vocab);
  EXPECT_THROW(cpu::crossEntropy(logits.data(), T, width, vocab, labels.data(), out), InputError);
}

TEST(LossTest, RouterStatsAndLoss) {
  const int64_t T = 23, E = 6, k = 2, layers = 3;
  std::vector<std::vector<float>> stats(layers, std::vector<float>(3 * E));
  std::vector<double> P(E, 0), C(E, 0);
  double z = 0;
  for (int64_t l = 0; l < layers; ++l) {
    std::vector<float> logits = randomValues(T * E, 10 + l, 3.0f);
    // A tie: tokens 0 has two equal largest logits (the lower index wins).
    logits[0] = logits[1] = 9.0f;
    double zl = 0;
    std::vector<double> counts(E, 0);
    for (int64_t t = 0; t < T; ++t) {
      const float *row = &logits[t * E];
      const double s = lse(row, E);
      zl += s * s;
      std::vector<std::pair<double, int64_t>> p;
      for (int64_t e = 0; e < E; ++e) {
        p.push_back({-std::exp(row[e] - s), e});
        P[e] += std::exp(row[e] - s);
      }
      std::sort(p.begin(), p.end());
      for (int64_t j = 0; j < k; ++j)
        counts[p[j].second] += 1;
    }
    cpu::routerStats(logits.data(), T, E, k, stats[l].data());
    for (int64_t e = 0; e < E; ++e) {
      EXPECT_EQ(stats[l][E + e], counts[e]) << "layer " << l << " expert " << e;
      C[e] += counts[e];
    }
    EXPECT_NEAR(stats[l][2 * E], zl, 1e-6 * zl);
    EXPECT_EQ(stats[l][2 * E + 1], T);
    z += zl / T;
  }
  for (int64_t e = 0; e < E; ++e) {
    double p = 0;
    for (int64_t l = 0; l < layers; ++l)
      p += stats[l][e];
    EXPECT_NEAR(p, P[e], 1e-5);
  }
  const double N = double(layers * T);
  double aux = 0;
  for (int64_t e = 0; e < E; ++e)
    aux += (C[e] / N) * (P[e] / N);
  aux *= E;
  const float ce[2] = {11.5f, 4.0f};
  std::vector<const float *> pointers;
  for (const auto &s : stats)
    pointers.push_back(s.data());
  float out[4];
  cpu::lmLoss(ce, pointers.data(), layers, E, 0.01, 0.001, out);
  EXPECT_NEAR(out[1], 11.5 / 4, 1e-6);
  EXPECT_NEAR(out[2], aux, 1e-6 * aux);
  EXPECT_NEAR(out[3], z, 1e-6 * z);
  EXPECT_NEAR(out[0], 11.5 / 4 + 0.01 * aux + 0.001 * z, 1e-6 * out[0]);
  // No balancing coefficient: aux is 0 (z is still reported).
  cpu::lmLoss(ce, pointers.data(), layers, E, 0.0, 0.0, out);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_NEAR(out[3], z, 1e-6 * z);
  EXPECT_NEAR(out[0], 11.5 / 4, 1e-6);
  // A dense model, and no counted row.
  const float empty[2] = {0.0f, 0.0f};
  cpu::lmLoss(empty, nullptr, 0, 0, 0.01, 0.0, out);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[2], 0.0f);
}

TEST(GradientsTest, CrossEntropy) {
  const int64_t T = 6, width = 9, vocab = 7;
  std::vector<float> logits = randomValues(T * width, 1, 3.0f);
  const std::vector<int32_t> labels = {3, -100, 0, 6, 2, -100};
  auto loss = [&](const std::vector<double> &l) {
    double sum = 0;
    int n = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (labels[t] == -100)
        continue;
      double m = -1e300, s = 0;
      for (int64_t v = 0; v < vocab; ++v)
        m = std::max(m, l[t * width + v]);
      for (int64_t v = 0; v < vocab; ++v)
        s += std::exp(l[t * width + v] - m);
      sum += m + std::log(s) - l[t * width + labels[t]];
      ++n;
    }
    return sum / n;
  };
  float ce[2];
  cpu::crossEntropy(logits.data(), T, width, vocab, labels.data(), ce);
  std::vector<float> grad(T * width);
  cpu::crossEntropyGrad(logits.data(), T, width, vocab, labels.data(), ce, grad.data());
  expectClose(grad.data(), numericGradient(logits, loss), 1e-5, "dlogits");
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = vocab; v < width; ++v)
      EXPECT_EQ(grad[t * width + v], 0.0f) << "padding column " << v;
}

TEST(GradientsTest, Linear) {
  const int64_t T = 5, in = 7, out = 4;
  std::vector<float> x = randomValues(T * in, 2), w = randomValues(out * in, 3),
                     r = randomValues(T * out, 4);
  auto f = [&](const std::vector<double> &xs, const std::vector<double> &ws) {
    std::vector<double> y(T * out, 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i)
          y[t * out + o] += xs[t * in + i] * ws[o * in + i];
    return dot(y, r);
  };
  std::vector<double> wd(w.begin(), w.end()), xd(x.begin(), x.end());
  std::vector<float> dx(T * in), dw(out * in);
  cpu::linearGrad(r.data(), x.data(), T, matrixOf(w, out, in), dx.data(), dw.data());
  expectClose(dx.data(), numericGradient(x, [&](const std::vector<double> &v) { return f(v, wd); }),
              1e-5, "dx");
  expectClose(dw.data(), numericGradient(w, [&](const std::vector<double> &v) { return f(xd, v); }),
              1e-5, "dw");
}

TEST(GradientsTest, LinearWithBf16WeightsTakesBf16Products) {
  // At the avx512bf16 level a BF16 weight's gradient products round their
  // operands to bf16 as its forward products do (PyTorch's BF16 autograd):
  // dx = round(dy) w and dw = round(dy)^T round(x), f32 sums.
  if (!cpu::bf16Products())
    GTEST_SKIP() << "bf16 products need avx512bf16; this level is "
                 << cpu::isaName(cpu::activeIsa());
  const int64_t T = 45, in = 70, out = 37;
  std::vector<float> x = randomValues(T * in, 5), dy = randomValues(T * out, 6),
                     wf = randomValues(out * in, 7);
  std::vector<uint16_t> w16(wf.size());
  for (size_t i = 0; i < wf.size(); ++i)
    w16[i] = floatToBf16(wf[i]);
  cpu::Matrix w = matrixOf(wf, out, in);
  w.dtype = DType::BF16;
  w.data = w16.data();
  std::vector<float> dx(T * in), dw(out * in), dx32(T * in), dw32(out * in);
  cpu::linearGrad(dy.data(), x.data(), T, w, dx.data(), dw.data());
  auto r = [](float v) { return static_cast<double>(roundBf16(v)); };
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < in; ++i) {
      double ref = 0, absSum = 0;
      for (int64_t o = 0; o < out; ++o) {
        const double p = r(dy[t * out + o]) * bf16ToFloat(w16[o * in + i]);
        ref += p;
        absSum += std::fabs(p);
      }
      ASSERT_NEAR(dx[t * in + i], ref, 1e-6 * absSum + 1e-30) << "dx t=" << t << " i=" << i;
    }
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      double ref = 0, absSum = 0;
      for (int64_t t = 0; t < T; ++t) {
        const double p = r(dy[t * out + o]) * r(x[t * in + i]);
        ref += p;
        absSum += std::fabs(p);
      }
      ASSERT_NEAR(dw[o * in + i], ref, 1e-6 * absSum + 1e-30) << "dw o=" << o << " i=" << i;
    }
  // Not the f32 products (which the same weight takes at f32 precision).
  const cpu::MatmulPrecision saved = cpu::requestedMatmulPrecision();
  cpu::setMatmulPrecision(cpu::MatmulPrecision::F32);
  cpu::linearGrad(dy.data(), x.data(), T, w, dx32.data(), dw32.data());
  cpu::setMatmulPrecision(saved);
  EXPECT_NE(dx, dx32);
  EXPECT_NE(dw, dw32);
}

TEST(GradientsTest, RmsNormInGroups) {
  for (int64_t groups : {1, 2}) {
    const int64_t T = 4, n = 6, width = n * groups;
    const double eps = 1e-5;
    std::vector<float> x = randomValues(T * width, 5), w = randomValues(n, 6),
                       r = randomValues(T * width, 7);
    auto f = [&](const std::vector<double> &xs, const std::vector<double> &ws) {
      std::vector<double> y(T * width);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t g = 0; g < groups; ++g) {
          double ss = 0;
          for (int64_t i = 0; i < n; ++i)
            ss += xs[t * width + g * n + i] * xs[t * width + g * n + i];
          const double rr = 1 / std::sqrt(ss / n + eps);
          for (int64_t i = 0; i < n; ++i)
            y[t * width + g * n + i] = xs[t * width + g * n + i] * rr * ws[i];
        }
      return dot(y, r);
    };
    TensorView view{DType::F32, {n}, w.data()};
    std::vector<float> dx(T * width), dw(n);
    cpu::rmsNormGrad(r.data(), x.data(), T, width, view, eps, dx.data(), dw.data());
    std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end());
    expectClose(dx.data(),
                numericGradient(x, [&](const std::vector<double> &v) { return f(v, wd); }), 1e-5,
                "dx");
    expectClose(dw.data(),
                numericGradient(w, [&](const std::vector<double> &v) { return f(xd, v); }), 1e-5,
                "dw");
  }
}

// A norm of whole rows that tensor parallelism splits (OLMoE's q_norm):
// each part's row sums added stand for the whole row's, forward and
// backward, and the parts give the whole row's values and its weight's
// gradient in parts.
TEST(GradientsTest, RmsNormOfRowPartsIsTheWholeRows) {
  const int64_t T = 5, part = 8, parts = 2, width = part * parts;
  const double eps = 1e-6;
  std::vector<float> x = randomValues(T * width, 11), w = randomValues(width, 12),
                     dy = randomValues(T * width, 13);
  TensorView whole{DType::F32, {width}, w.data()};
  std::vector<float> y(T * width), dx(T * width), dw(width);
  cpu::rmsNorm(x.data(), T, width, whole, eps, y.data());
  cpu::rmsNormGrad(dy.data(), x.data(), T, width, whole, eps, dx.data(), dw.data());
  // Each part's rows, its sums, and their totals.
  auto columns = [&](const std::vector<float> &v, int64_t p) {
    std::vector<float> out(T * part);
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(v.data() + t * width + p * part, part, out.data() + t * part);
    return out;
  };
  std::vector<float> squares(T, 0.0f), stats(2 * T, 0.0f);
  for (int64_t p = 0; p < parts; ++p) {
    std::vector<float> xp = columns(x, p), dyp = columns(dy, p), s(T), st(2 * T);
    TensorView wp{DType::F32, {part}, w.data() + p * part};
    cpu::rowSumSquares(xp.data(), T, part, s.data());
    cpu::rmsNormGradStats(dyp.data(), xp.data(), T, part, wp, st.data());
    for (int64_t i = 0; i < T; ++i)
      squares[i] += s[i];
    for (int64_t i = 0; i < 2 * T; ++i)
      stats[i] += st[i];
  }
  for (int64_t p = 0; p < parts; ++p) {
    std::vector<float> xp = columns(x, p), dyp = columns(dy, p), yp(T * part), dxp(T * part),
                       dwp(part);
    TensorView wp{DType::F32, {part}, w.data() + p * part};
    cpu::rmsNormOfSquares(xp.data(), T, part, wp, squares.data(), width, eps, yp.data());
    cpu::rmsNormGradOfStats(dyp.data(), xp.data(), T, part, wp, stats.data(), width, eps,
                            dxp.data(), dwp.data());
    const std::vector<float> wantY = columns(y, p), wantDx = columns(dx, p);
    for (int64_t i = 0; i < T * part; ++i) {
      EXPECT_NEAR(yp[i], wantY[i], 1e-6 * std::abs(wantY[i]) + 1e-7) << "y " << p << " " << i;
      EXPECT_NEAR(dxp[i], wantDx[i], 1e-5 * std::abs(wantDx[i]) + 1e-6) << "dx " << p << " " << i;
    }
    for (int64_t i = 0; i < part; ++i)
      EXPECT_NEAR(dwp[i], dw[p * part + i], 1e-5 * std::abs(dw[p * part + i]) + 1e-6)
          << "dw " << p << " " << i;
  }
}

TEST(GradientsTest, AttentionOfTwoSequencesWithGqaAndWindow) {
  for (int64_t window : {0, 2}) {
    const int64_t heads = 4, kvHeads = 2, d = 3, vd = 2, T = 7;
    const std::vector<int32_t> slots = {0, 0, 0, 1, 1, 1, 1}, positions = {0, 1, 2, 0, 1, 2, 3};
    cpu::TokenLayout layout{slots.data(), positions.data(), T};
    const double scale = 0.7;
    std::vector<float> q = randomValues(T * heads * d, 8), k = randomValues(T * kvHeads * d, 9),
                       v = randomValues(T * kvHeads * vd, 10), r = randomValues(T * heads * vd, 11);
    auto f = [&](const std::vector<double> &qs, const std::vector<double> &ks,
                 const std::vector<double> &vs) {
      std::vector<double> o(T * heads * vd, 0.0);
      for (int64_t i = 0; i < T; ++i)
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t g = h / (heads / kvHeads);
          std::vector<std::pair<int64_t, double>> s;
          for (int64_t j = 0; j <= i; ++j) {
            if (slots[j] != slots[i] || (window && positions[i] - positions[j] >= window))
              continue;
            double x = 0;
            for (int64_t c = 0; c < d; ++c)
              x += qs[(i * heads + h) * d + c] * ks[(j * kvHeads + g) * d + c];
            s.push_back({j, x * scale});
          }
          double m = -1e300, sum = 0;
          for (auto &e : s)
            m = std::max(m, e.second);
          for (auto &e : s)
            sum += (e.second = std::exp(e.second - m));
          for (auto &e : s)
            for (int64_t c = 0; c < vd; ++c)
              o[(i * heads + h) * vd + c] += e.second / sum * vs[(e.first * kvHeads + g) * vd + c];
        }
      return dot(o, r);
    };
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    cpu::attentionGrad(r.data(), q.data(), k.data(), v.data(), layout, heads, kvHeads, d, vd,
                       scale, window, dq.data(), dk.data(), dv.data());
    std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vdv(v.begin(), v.end());
    expectClose(dq.data(), numericGradient(q, [&](const auto &x) { return f(x, kd, vdv); }), 1e-5,
                "dq");
    expectClose(dk.data(), numericGradient(k, [&](const auto &x) { return f(qd, x, vdv); }), 1e-5,
                "dk");
    expectClose(dv.data(), numericGradient(v, [&](const auto &x) { return f(qd, kd, x); }), 1e-5,
                "dv");
  }
  // A sequence that does not start at position 0 (a chunk after cached
  // tokens) is refused: its keys before the step are not in the batch.
  const std::vector<int32_t> slots = {0, 0}, positions = {3, 4};
  cpu::TokenLayout layout{slots.data(), positions.data(), 2};
  std::vector<float> x(2 * 4, 0.5f), g(2 * 4);
  EXPECT_THROW(cpu::attentionGrad(x.data(), x.data(), x.data(), x.data(), layout, 2, 2, 2, 2, 1.0,
                                  0, g.data(), g.data(), g.data()),
               InputError);
}

/// The attention gradients of causal attention over whole sequences (with
/// a sliding window when `window` > 0) by the textbook formulas in double:
/// P = softmax(scale q k^T), dS = P (dP - rowsum(P dP)), dq = scale dS k,
/// dk = scale dS^T q, dv = P^T dout.
void attentionGradReference(const std::vector<float> &dout, const std::vector<float> &q,
                            const std::vector<float> &k, const std::vector<float> &v,
                            const std::vector<int64_t> &lengths, int64_t heads, int64_t kvHeads,
                            int64_t d, int64_t vd, double scale, int64_t window,
                            std::vector<double> &dq, std::vector<double> &dk,
                            std::vector<double> &dv) {
  const int64_t T = static_cast<int64_t>(q.size()) / (heads * d), group = heads / kvHeads;
  dq.assign(q.size(), 0.0), dk.assign(k.size(), 0.0), dv.assign(v.size(), 0.0);
  int64_t b = 0;
  for (int64_t S : lengths) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / group;
      auto Q = [&](int64_t i, int64_t c) { return double(q[((b + i) * heads + h) * d + c]); };
      auto K = [&](int64_t j, int64_t c) { return double(k[((b + j) * kvHeads + g) * d + c]); };
      auto V = [&](int64_t j, int64_t c) { return double(v[((b + j) * kvHeads + g) * vd + c]); };
      auto O = [&](int64_t i, int64_t c) { return double(dout[((b + i) * heads + h) * vd + c]); };
      for (int64_t i = 0; i < S; ++i) {
        const int64_t j0 = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
        std::vector<double> p(static_cast<size_t>(i + 1 - j0)), dp(p.size());
        double peak = -1e300, sum = 0, rowDot = 0;
        for (int64_t j = j0; j <= i; ++j) {
          double x = 0;
          for (int64_t c = 0; c < d; ++c)
            x += Q(i, c) * K(j, c);
          p[j - j0] = x * scale;
          peak = std::max(peak, p[j - j0]);
        }
        for (double &x : p)
          sum += (x = std::exp(x - peak));
        for (int64_t j = j0; j <= i; ++j) {
          p[j - j0] /= sum;
          for (int64_t c = 0; c < vd; ++c)
            dp[j - j0] += O(i, c) * V(j, c);
          rowDot += p[j - j0] * dp[j - j0];
        }
        for (int64_t j = j0; j <= i; ++j) {
          const double dsij = p[j - j0] * (dp[j - j0] - rowDot) * scale;
          for (int64_t c = 0; c < d; ++c) {
            dq[((b + i) * heads + h) * d + c] += dsij * K(j, c);
            dk[((b + j) * kvHeads + g) * d + c] += dsij * Q(i, c);
          }
          for (int64_t c = 0; c < vd; ++c)
            dv[((b + j) * kvHeads + g) * vd + c] += p[j - j0] * O(i, c);
        }
      }
    }
    b += S;
  }
}

// Sequences longer than attentionGrad's blocks of 64 queries and keys
// (which it skips above the diagonal and outside the window): the textbook
// gradients, with windows that end inside a block, at a block edge and
// past the sequence. A first call on other shapes leaves the thread's
// workspaces full of other values: nothing stale may show.
TEST(GradientsTest, AttentionOverSeveralBlocks) {
  const int64_t heads = 4, kvHeads = 2, d = 16, vd = 8;
  const double scale = 0.25;
  {
    const int64_t T = 400;
    std::vector<int32_t> slots(T, 0), positions(T);
    for (int64_t t = 0; t < T; ++t)
      positions[t] = static_cast<int32_t>(t);
    cpu::TokenLayout layout{slots.data(), positions.data(), T};
    std::vector<float> x = randomValues(T * heads * d, 20, 3.0f), g(x.size());
    cpu::attentionGrad(x.data(), x.data(), x.data(), x.data(), layout, heads, heads, d, d, scale,
                       0, g.data(), g.data(), g.data());
  }
  const std::vector<int64_t> lengths = {300, 261};
  const int64_t T = 561;
  std::vector<int32_t> slots, positions;
  for (size_t s = 0; s < lengths.size(); ++s)
    for (int64_t i = 0; i < lengths[s]; ++i) {
      slots.push_back(static_cast<int32_t>(s));
      positions.push_back(static_cast<int32_t>(i));
    }
  cpu::TokenLayout layout{slots.data(), positions.data(), T};
  std::vector<float> q = randomValues(T * heads * d, 21), k = randomValues(T * kvHeads * d, 22),
                     v = randomValues(T * kvHeads * vd, 23), r = randomValues(T * heads * vd, 24);
  for (int64_t window : {0, 2, 100, 128, 200, 1000}) {
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    cpu::attentionGrad(r.data(), q.data(), k.data(), v.data(), layout, heads, kvHeads, d, vd,
                       scale, window, dq.data(), dk.data(), dv.data());
    std::vector<double> wq, wk, wv;
    attentionGradReference(r, q, k, v, lengths, heads, kvHeads, d, vd, scale, window, wq, wk, wv);
    SCOPED_TRACE("window " + std::to_string(window));
    expectClose(dq.data(), wq, 1e-5, "dq");
    expectClose(dk.data(), wk, 1e-5, "dk");
    expectClose(dv.data(), wv, 1e-5, "dv");
  }
}

double act(cpu::Activation a, double x) {
  if (a == cpu::Activation::Silu)
    return x / (1 + std::exp(-x));
  if (a == cpu::Activation::GeluTanh)
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

// The backward's transposes (16 x 16 register tiles at the AVX-512 level,
// scalar blocks below it): every element moved, none written outside the
// [cols, rows] block of the output, whatever the edges and strides.
TEST(GradientsTest, Transposes) {
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> uniform(-1, 1);
  const int threads = numThreads();
  setNumThreads(2);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {16, 16}, {17, 33}, {300, 7},
                            {5, 261}, {64, 512}}) {
    const int64_t ldIn = cols + 3, ldOut = rows + 5;
    std::vector<float> in(static_cast<size_t>(rows * ldIn));
    for (float &x : in)
      x = uniform(rng);
    for (bool parallel : {false, true}) {
      std::vector<float> out(static_cast<size_t>(cols * ldOut), -7.0f);
      (parallel ? cpu::grad::transpose : cpu::grad::transposeSerial)(in.data(), rows, cols, ldIn, out.data(),
                                                           ldOut);
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t r = 0; r < ldOut; ++r)
          ASSERT_EQ(out[c * ldOut + r], r < rows ? in[r * ldIn + c] : -7.0f)
              << rows << " x " << cols << ": out[" << c << ", " << r << "] at "
              << cpu::isaName(cpu::activeIsa());
    }
  }
  setNumThreads(threads);
}

// matmulTN with bf16 products packs its left operand a^T straight from a's
// rows (linearLeftTransposed) where the GEMM can: the bits of the transposed
// copy through linear(), with 1 and 2 threads, odd depths and strided rows;
// and b's vectorized rounding is floatToBf16's, special values included.
TEST(GradientsTest, WeightGradientProductOfTheUntransposedLeftOperand) {
  auto bitsOf = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  };
  auto floatOf = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  std::mt19937 rng(41);
  std::uniform_real_distribution<float> uniform(-2, 2);
  const int threads = numThreads();
  for (auto [t, m, n] : {std::array<int64_t, 3>{37, 45, 40}, {128, 300, 96}, {1, 20, 33},
                         {2, 17, 32}, {64, 16, 64}, {129, 2816, 64}}) {
    const int64_t lda = m + 3, ldb = n + 1, ldc = n + 2;
    std::vector<float> a(static_cast<size_t>(t * lda)), b(static_cast<size_t>(t * ldb));
    for (float &x : a)
      x = uniform(rng);
    for (float &x : b)
      x = uniform(rng);
    // The reference: a^T copied, b rounded by floatToBf16, linear().
    std::vector<float> aT(static_cast<size_t>(m * t));
    for (int64_t r = 0; r < t; ++r)
      for (int64_t c = 0; c < m; ++c)
        aT[c * t + r] = a[r * lda + c];
    std::vector<uint16_t> rounded(static_cast<size_t>(t * n));
    for (int64_t r = 0; r < t; ++r)
      for (int64_t c = 0; c < n; ++c)
        rounded[r * n + c] = floatToBf16(b[r * ldb + c]);
    cpu::Matrix right = cpu::grad::f32Matrix(nullptr, t, n);
    right.dtype = DType::BF16;
    right.data = rounded.data();
    for (int count : {1, 2}) {
      setNumThreads(count);
      std::vector<float> want(static_cast<size_t>(m * ldc), -3.0f), got = want;
      cpu::linear(aT.data(), m, right.transpose(), nullptr, want.data(), 0, ldc);
      cpu::grad::matmulTN(a.data(), lda, b.data(), ldb, t, m, n, got.data(), ldc, true);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(bitsOf(got[i]), bitsOf(want[i]))
            << t << " x " << m << " x " << n << ", " << count << " threads: element " << i
            << " at " << cpu::isaName(cpu::activeIsa());
    }
  }
  setNumThreads(threads);
  // Rounding: ties both ways, NaNs (signalling and quiet), infinities,
  // denormals (not flushed), the largest finite values; 37 lanes (a tail).
  std::vector<uint32_t> bits = {0x3f808000u, 0x3f818000u, 0x7f800001u, 0xffc00000u, 0x7f800000u,
                                0xff800000u, 0x00000001u, 0x807fffffu, 0x00008000u, 0x7f7fffffu,
                                0xff7fffffu, 0x00000000u, 0x80000000u};
  while (bits.size() < 37)
    bits.push_back(bitsOf(uniform(rng) * 1e-38f));
  std::vector<float> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i)
    values[i] = floatOf(bits[i]);
  std::vector<uint16_t> out(bits.size() + 1, 0xabcd);
  cpu::grad::roundRowToBf16(values.data(), static_cast<int64_t>(values.size()), out.data());
  for (size_t i = 0; i < bits.size(); ++i)
    EXPECT_EQ(out[i], floatToBf16(values[i])) << std::hex << bits[i];
  EXPECT_EQ(out.back(), 0xabcd) << "wrote past the row";
}

TEST(GradientsTest, Mlp) {
  for (cpu::Activation a : {cpu::Activation::Silu, cpu::Activation::GeluTanh, cpu::Activation::Gelu}) {
    const int64_t T = 3, H = 5, I = 4;
    std::vector<float> x = randomValues(T * H, 12), wg = randomValues(I * H, 13),
                       wu = randomValues(I * H, 14), wd = randomValues(H * I, 15),
                       r = randomValues(T * H, 16);
    auto f = [&](const std::vector<double> &xs, const std::vector<double> &g,
                 const std::vector<double> &u, const std::vector<double> &dn) {
      std::vector<double> y(T * H, 0.0);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> h(I);
        for (int64_t i = 0; i < I; ++i) {
          double ga = 0, ua = 0;
          for (int64_t c = 0; c < H; ++c) {
            ga += xs[t * H + c] * g[i * H + c];
            ua += xs[t * H + c] * u[i * H + c];
          }
          h[i] = act(a, ga) * ua;
        }
        for (int64_t o = 0; o < H; ++o)
          for (int64_t i = 0; i < I; ++i)
            y[t * H + o] += h[i] * dn[o * I + i];
      }
      return dot(y, r);
    };
    std::vector<float> dx(T * H), dg(I * H), du(I * H), dd(H * I);
    cpu::mlpGrad(r.data(), x.data(), T, matrixOf(wg, I, H), matrixOf(wu, I, H),
                 matrixOf(wd, H, I), a, dx.data(), dg.data(), du.data(), dd.data());
    auto d64 = [](const std::vector<float> &v) { return std::vector<double>(v.begin(), v.end()); };
    expectClose(dx.data(),
                numericGradient(x, [&](const auto &v) { return f(v, d64(wg), d64(wu), d64(wd)); }),
                1e-5, "dx");
    expectClose(dg.data(),
                numericGradient(wg, [&](const auto &v) { return f(d64(x), v, d64(wu), d64(wd)); }),
                1e-5, "dgate");
    expectClose(du.data(),
                numericGradient(wu, [&](const auto &v) { return f(d64(x), d64(wg), v, d64(wd)); }),
                1e-5, "dup");
    expectClose(dd.data(),
                numericGradient(wd, [&](const auto &v) { return f(d64(x), d64(wg), d64(wu), v); }),
                1e-5, "ddown");
  }
}

TEST(GradientsTest, BiasAndSigmoidGate) {
  const int64_t T = 5, W = 6;
  std::vector<float> dy = randomValues(T * W, 30), x = randomValues(T * W, 31),
                     gate = randomValues(T, 32, 2.0f);
  std::vector<float> db(W);
  cpu::biasGrad(dy.data(), T, W, db.data());
  expectClose(db.data(), numericGradient(std::vector<float>(W, 0.1f), [&](const auto &b) {
                double s = 0;
                for (int64_t t = 0; t < T; ++t)
                  for (int64_t o = 0; o < W; ++o)
                    s += dy[t * W + o] * b[o];
                return s;
              }), 1e-6, "dbias");
  auto f = [&](const std::vector<double> &xs, const std::vector<double> &g) {
    double s = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < W; ++i)
        s += dy[t * W + i] * xs[t * W + i] / (1 + std::exp(-g[t]));
    return s;
  };
  std::vector<float> dx(T * W), dg(T);
  cpu::sigmoidGateGrad(dy.data(), x.data(), gate.data(), T, W, dx.data(), dg.data());
  std::vector<double> xd(x.begin(), x.end()), gd(gate.begin(), gate.end());
  expectClose(dx.data(), numericGradient(x, [&](const auto &v) { return f(v, gd); }), 1e-5, "dx");
  expectClose(dg.data(), numericGradient(gate, [&](const auto &v) { return f(xd, v); }), 1e-5,
              "dgate");
}

TEST(GradientsTest, LatentAttention) {
  // One sequence of 4 tokens, 2 heads, nope 3, rope 2 (interleaved), v 2.
  const int64_t T = 4, heads = 2, n = 3, r = 2, v = 2, qk = n + r;
  const std::vector<int32_t> slots(T, 0), positions = {0, 1, 2, 3};
  cpu::TokenLayout layout{slots.data(), positions.data(), T};
  cpu::RopeParams p;
  p.rotaryDim = r;
  p.interleaved = true;
  cpu::RopeTable table(p, 8);
  const double scale = 0.6;
  std::vector<float> q = randomValues(T * heads * qk, 33), kv = randomValues(T * heads * (n + v), 34),
                     kr = randomValues(T * r, 35), dout = randomValues(T * heads * v, 36);
  // The rotation by the table's cos/sin (pair (0, 1) of the rotary part).
  auto rotate = [&](double &a, double &b, int64_t pos) {
    const double c = table.cosines()[pos], s = table.sines()[pos], a0 = a, b0 = b;
    a = a0 * c - b0 * s;
    b = b0 * c + a0 * s;
  };
  auto f = [&](const std::vector<double> &qs, const std::vector<double> &kvs,
               const std::vector<double> &krs) {
    double loss = 0;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> qi(qs.begin() + (i * heads + h) * qk,
                               qs.begin() + (i * heads + h + 1) * qk);
        rotate(qi[n], qi[n + 1], positions[i]);
        std::vector<double> s(i + 1);
        double m = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double kj[2] = {krs[j * r], krs[j * r + 1]};
          rotate(kj[0], kj[1], positions[j]);
          double x = 0;
          for (int64_t c = 0; c < n; ++c)
            x += qi[c] * kvs[(j * heads + h) * (n + v) + c];
          x += qi[n] * kj[0] + qi[n + 1] * kj[1];
          m = std::max(m, s[j] = x * scale);
        }
        for (double &x : s)
          sum += (x = std::exp(x - m));
        for (int64_t c = 0; c < v; ++c) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j)
            o += s[j] / sum * kvs[(j * heads + h) * (n + v) + n + c];
          loss += o * dout[(i * heads + h) * v + c];
        }
      }
    return loss;
  };
  std::vector<float> dq(q.size()), dkv(kv.size()), dkr(kr.size());
  cpu::mlaAttentionGrad(dout.data(), q.data(), kv.data(), kr.data(), layout, heads, n, r, v, scale,
                        table, dq.data(), dkv.data(), dkr.data());
  auto d64 = [](const std::vector<float> &x) { return std::vector<double>(x.begin(), x.end()); };
  expectClose(dq.data(), numericGradient(q, [&](const auto &x) { return f(x, d64(kv), d64(kr)); }),
              1e-5, "dq");
  expectClose(dkv.data(), numericGradient(kv, [&](const auto &x) { return f(d64(q), x, d64(kr)); }),
              1e-5, "dkv");
  expectClose(dkr.data(), numericGradient(kr, [&](const auto &x) { return f(d64(q), d64(kv), x); }),
              1e-5, "dkey_rope");
}

TEST(GradientsTest, EmbeddingScattersRepeatedIds) {
  const int64_t T = 5, H = 3, V = 6;
  const std::vector<int32_t> ids = {2, 0, 2, 5, 2};
  std::vector<float> dy = randomValues(T * H, 17), out(V * H, 7.0f);
  cpu::embeddingGrad(dy.data(), ids.data(), T, H, V, out.data());
  for (int64_t v = 0; v < V; ++v)
    for (int64_t c = 0; c < H; ++c) {
      float expected = 0;
      for (int64_t t = 0; t < T; ++t)
        if (ids[t] == v)
          expected += dy[t * H + c];
      EXPECT_EQ(out[v * H + c], expected) << "row " << v;
    }
  const std::vector<int32_t> bad = {6};
  EXPECT_THROW(cpu::embeddingGrad(dy.data(), bad.data(), 1, H, V, out.data()), InputError);
}

TEST(GradientsTest, RopeTransposeIsTheAdjoint) {
  // <R x, y> = <x, R^T y> for the default (half-split) and interleaved
  // pairings, with a YaRN-style attention factor (a scaled rotation).
  for (bool interleaved : {false, true}) {
    cpu::RopeParams p;
    p.theta = 10000;
    p.rotaryDim = 4;
    p.interleaved = interleaved;
    p.attentionFactor = 1.25;
    cpu::RopeTable table(p, 16);
    const int64_t T = 3, width = 12, headDim = 6;
    const std::vector<int32_t> positions = {0, 5, 11};
    std::vector<float> x = randomValues(T * width, 18), y = randomValues(T * width, 19);
    std::vector<float> rx = x, ty = y;
    table.apply(rx.data(), T, width, headDim, positions.data());
    table.applyTransposed(ty.data(), T, width, headDim, positions.data());
    double left = 0, right = 0;
    for (int64_t i = 0; i < T * width; ++i) {
      left += static_cast<double>(rx[i]) * y[i];
      right += static_cast<double>(x[i]) * ty[i];
    }
    EXPECT_NEAR(left, right, 1e-5 * std::abs(left)) << (interleaved ? "interleaved" : "half");
  }
}

} // namespace
