// The MoE layer's backward kernels (moert/cpu/Gradients.h): the routing's,
// the router statistics' (the balancing losses, DeepSeek-V3's
// sequence-wise one too) and the routed experts' (saved activations,
// capacity-limited), against central finite differences of f64
// implementations of the forward formulas. Run at every ISA level.
#include "GradientCheck.h"
#include "moert/Error.h"
#include "moert/cpu/Gradients.h"

#include <gtest/gtest.h>

using namespace moert;
using namespace moert::gradcheck;

namespace {

/// f64 routing weights at a fixed selection (#moe.routing steps 1, 5-7).
std::vector<double> routingWeights(const std::vector<double> &l, const std::vector<int32_t> &sel,
                                   int64_t T, int64_t E, int64_t k,
                                   const cpu::RoutingParams &p) {
  std::vector<double> w(T * k);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> s(E);
    if (p.sigmoid) {
      for (int64_t e = 0; e < E; ++e)
        s[e] = 1 / (1 + std::exp(-l[t * E + e]));
    } else {
      double sum = 0;
      for (int64_t e = 0; e < E; ++e)
        if (!p.topkOnLogits || std::count(&sel[t * k], &sel[t * k] + k, e))
          sum += (s[e] = std::exp(l[t * E + e]));
      for (double &x : s)
        x /= sum;
    }
    double total = 0;
    for (int64_t j = 0; j < k; ++j)
      total += s[sel[t * k + j]];
    for (int64_t j = 0; j < k; ++j)
      w[t * k + j] = s[sel[t * k + j]] / (p.normalize ? total + 1e-20 : 1.0) * p.scalingFactor;
  }
  return w;
}

TEST(GradientsTest, RouteAtAFixedSelection) {
  const int64_t T = 4, E = 6, k = 2;
  const std::vector<int32_t> sel = {1, 4, 0, 2, 5, 3, 2, 1};
  std::vector<float> logits = randomValues(T * E, 20, 2.0f), r = randomValues(T * k, 21);
  cpu::RoutingParams mixtral, qwen2, deepseek, onLogits;
  mixtral.topK = qwen2.topK = deepseek.topK = onLogits.topK = k;
  mixtral.normalize = deepseek.normalize = true;
  qwen2.scalingFactor = 1.5;
  deepseek.sigmoid = true;
  deepseek.scalingFactor = 2.5;
  onLogits.topkOnLogits = true;
  for (const cpu::RoutingParams &p : {mixtral, qwen2, deepseek, onLogits}) {
    std::vector<float> grad(T * E);
    cpu::routeGrad(r.data(), logits.data(), sel.data(), T, E, p, grad.data());
    expectClose(grad.data(),
                numericGradient(logits, [&](const std::vector<double> &l) {
                  return dot(routingWeights(l, sel, T, E, k, p), r);
                }),
                1e-5, "dlogits");
  }
}

TEST(GradientsTest, RouterStatsOfOneLayerAmongTwo) {
  const int64_t T = 5, E = 4, k = 2;
  std::vector<float> logits = randomValues(T * E, 22, 2.0f), other = randomValues(T * E, 23, 2.0f);
  std::vector<float> mine(3 * E), theirs(3 * E);
  cpu::routerStats(logits.data(), T, E, k, mine.data());
  cpu::routerStats(other.data(), T, E, k, theirs.data());
  const double auxCoef = 0.3, zCoef = 0.05;
  // The loss as a function of this layer's logits, the counts held fixed.
  auto loss = [&](const std::vector<double> &l) {
    double z = theirs[2 * E] / T, aux = 0;
    std::vector<double> P(E);
    for (int64_t e = 0; e < E; ++e)
      P[e] = theirs[e];
    for (int64_t t = 0; t < T; ++t) {
      double m = -1e300, s = 0;
      for (int64_t e = 0; e < E; ++e)
        m = std::max(m, l[t * E + e]);
      for (int64_t e = 0; e < E; ++e)
        s += std::exp(l[t * E + e] - m);
      const double lse = m + std::log(s);
      z += lse * lse / T;
      for (int64_t e = 0; e < E; ++e)
        P[e] += std::exp(l[t * E + e] - lse);
    }
    const double N = 2.0 * T;
    for (int64_t e = 0; e < E; ++e)
      aux += (double(mine[E + e]) + theirs[E + e]) / N * P[e] / N;
    return auxCoef * E * aux + zCoef * z;
  };
  const float *stats[2] = {mine.data(), theirs.data()};
  std::vector<float> grad(T * E);
  cpu::routerStatsGrad(logits.data(), T, E, stats, 2, auxCoef, zCoef, grad.data());
  expectClose(grad.data(), numericGradient(logits, loss), 1e-5, "dlogits");
}

// DeepSeek-V3's sequence-wise balancing loss (router_stats' sequences):
// the statistics and lm_loss against the formula, and the gradient through
// s / sum(s) (this layer's top-k counts fixed) against finite differences.
TEST(GradientsTest, SequenceWiseBalancingLoss) {
  const int64_t B = 2, L = 3, T = B * L, E = 4, k = 2;
  std::vector<float> logits = randomValues(T * E, 31, 2.0f), other = randomValues(T * E, 32, 2.0f);
  std::vector<float> mine((3 + 2 * B) * E), theirs((3 + 2 * B) * E);
  cpu::routerStats(logits.data(), T, E, k, mine.data(), B);
  cpu::routerStats(other.data(), T, E, k, theirs.data(), B);
  EXPECT_EQ(mine[2 * E + 2], float(k));
  // The per-sequence loss of one layer's logits, given its top-k counts.
  auto layerLoss = [&](const std::vector<double> &l, const std::vector<double> &counts) {
    double loss = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t e = 0; e < E; ++e) {
        double p = 0;
        for (int64_t t = b * L; t < (b + 1) * L; ++t) {
          double total = 0;
          for (int64_t j = 0; j < E; ++j)
            total += 1 / (1 + std::exp(-l[t * E + j]));
          p += 1 / (1 + std::exp(-l[t * E + e])) / total / L;
        }
        loss += counts[b * E + e] * E / double(L * k) * p / B;
      }
    return loss;
  };
  const std::vector<double> myCounts = cpu::sequenceTopKCounts(logits.data(), T, E, k, B),
                            theirCounts = cpu::sequenceTopKCounts(other.data(), T, E, k, B);
  for (int64_t i = 0; i < B * E; ++i)
    EXPECT_EQ(mine[(3 + B) * E + i], float(myCounts[i]));
  const double auxCoef = 0.3;
  float out[4];
  float ce[2] = {6.0f, 3.0f};
  const float *stats[2] = {mine.data(), theirs.data()};
  cpu::lmLoss(ce, stats, 2, E, auxCoef, 0.0, out, B);
  auto d64 = [](const std::vector<float> &v) { return std::vector<double>(v.begin(), v.end()); };
  const double aux = layerLoss(d64(logits), myCounts) + layerLoss(d64(other), theirCounts);
  EXPECT_NEAR(out[2], aux, 1e-6 * aux);
  EXPECT_NEAR(out[0], 2.0 + auxCoef * aux, 1e-6);
  std::vector<float> grad(T * E);
  cpu::routerStatsGrad(logits.data(), T, E, stats, 2, auxCoef, 0.0, grad.data(), B);
  expectClose(grad.data(), numericGradient(logits, [&](const std::vector<double> &l) {
                return auxCoef * layerLoss(l, myCounts);
              }), 1e-5, "dlogits");
}

TEST(GradientsTest, ExpertsWithAnIdleOne) {
  const int64_t T = 4, H = 5, I = 3, E = 3, k = 2;
  const std::vector<int32_t> sel = {0, 1, 1, 0, 0, 1, 1, 0}; // expert 2: no token
  std::vector<float> x = randomValues(T * H, 24), w = randomValues(T * k, 25),
                     r = randomValues(T * H, 26);
  std::vector<float> g = randomValues(E * I * H, 27), u = randomValues(E * I * H, 28),
                     d = randomValues(E * H * I, 29);
  auto stack = [](const std::vector<float> &s, int64_t rows, int64_t cols) {
    std::vector<cpu::Matrix> out;
    for (int64_t e = 0; e < E; ++e)
      out.push_back(matrixOf(std::vector<float>(), rows, cols));
    for (int64_t e = 0; e < E; ++e)
      out[e].data = s.data() + e * rows * cols;
    return out;
  };
  auto f = [&](const std::vector<double> &xs, const std::vector<double> &ws,
               const std::vector<double> &gs, const std::vector<double> &us,
               const std::vector<double> &ds) {
    std::vector<double> y(T * H, 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = sel[t * k + j];
        std::vector<double> h(I);
        for (int64_t i = 0; i < I; ++i) {
          double a = 0, b = 0;
          for (int64_t c = 0; c < H; ++c) {
            a += xs[t * H + c] * gs[(e * I + i) * H + c];
            b += xs[t * H + c] * us[(e * I + i) * H + c];
          }
          h[i] = a / (1 + std::exp(-a)) * b;
        }
        for (int64_t o = 0; o < H; ++o)
          for (int64_t i = 0; i < I; ++i)
            y[t * H + o] += ws[t * k + j] * h[i] * ds[(e * H + o) * I + i];
      }
    return dot(y, r);
  };
  std::vector<float> dx(T * H), dw(T * k), dg(E * I * H, 9.0f), du(E * I * H, 9.0f),
      dd(E * H * I, 9.0f);
  cpu::expertsGrad(r.data(), x.data(), T, H, w.data(), sel.data(), k, stack(g, I, H),
                   stack(u, I, H), stack(d, H, I), cpu::Activation::Silu, dx.data(), dw.data(),
                   dg.data(), du.data(), dd.data());
  auto d64 = [](const std::vector<float> &v) { return std::vector<double>(v.begin(), v.end()); };
  expectClose(dx.data(), numericGradient(x, [&](const auto &v) {
                return f(v, d64(w), d64(g), d64(u), d64(d));
              }), 1e-5, "dx");
  expectClose(dw.data(), numericGradient(w, [&](const auto &v) {
                return f(d64(x), v, d64(g), d64(u), d64(d));
              }), 1e-5, "dweights");
  // The used experts' slices against the numerical gradient; the idle
  // expert's exactly 0.
  const std::vector<double> ng = numericGradient(g, [&](const auto &v) {
    return f(d64(x), d64(w), v, d64(u), d64(d));
  });
  expectClose(dg.data(), std::vector<double>(ng.begin(), ng.begin() + 2 * I * H), 1e-5, "dgate");
  for (int64_t i = 2 * I * H; i < E * I * H; ++i) {
    EXPECT_EQ(dg[i], 0.0f);
    EXPECT_EQ(du[i], 0.0f);
    EXPECT_EQ(dd[i], 0.0f);
  }
  const std::vector<double> nd = numericGradient(d, [&](const auto &v) {
    return f(d64(x), d64(w), d64(g), d64(u), v);
  });
  expectClose(dd.data(), std::vector<double>(nd.begin(), nd.begin() + 2 * H * I), 1e-5, "ddown");

  // moe.experts_saved: the forward's result as moe.experts', the saved
  // gate/up products and outputs per (token, slot), and the gradients read
  // from them as the recomputed ones.
  std::vector<float> y(T * H), ySaved(T * H), sg(T * k * I), su(T * k * I), so(T * k * H);
  cpu::experts(x.data(), T, H, w.data(), sel.data(), k, stack(g, I, H), stack(u, I, H),
               stack(d, H, I), cpu::Activation::Silu, y.data());
  const cpu::ExpertsSaved saved{sg.data(), su.data(), so.data()};
  cpu::experts(x.data(), T, H, w.data(), sel.data(), k, stack(g, I, H), stack(u, I, H),
               stack(d, H, I), cpu::Activation::Silu, ySaved.data(), &saved);
  for (int64_t i = 0; i < T * H; ++i)
    EXPECT_NEAR(ySaved[i], y[i], 1e-5 * (1 + std::fabs(y[i]))) << i;
  for (int64_t p = 0; p < T * k; ++p) {
    const int64_t t = p / k, e = sel[p];
    for (int64_t i = 0; i < I; ++i) {
      double a = 0;
      for (int64_t c = 0; c < H; ++c)
        a += double(x[t * H + c]) * g[(e * I + i) * H + c];
      EXPECT_NEAR(sg[p * I + i], a, 1e-5) << "saved gate of pair " << p;
    }
  }
  std::vector<float> sx(T * H), sw(T * k), sgd(E * I * H, 9.0f), sud(E * I * H, 9.0f),
      sdd(E * H * I, 9.0f);
  cpu::expertsGrad(r.data(), x.data(), T, H, w.data(), sel.data(), k, stack(g, I, H),
                   stack(u, I, H), stack(d, H, I), cpu::Activation::Silu, sx.data(), sw.data(),
                   sgd.data(), sud.data(), sdd.data(), sg.data(), su.data(), so.data());
  auto near = [](const std::vector<float> &a, const std::vector<float> &b, const char *what) {
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_NEAR(a[i], b[i], 1e-5 * (1 + std::fabs(b[i]))) << what << " " << i;
  };
  near(sx, dx, "dx");
  near(sw, dw, "dweights");
  near(sgd, dg, "dgate");
  near(sud, du, "dup");
  near(sdd, dd, "ddown");

  // A capacity factor: c = ceil(0.5 * 4 * 2 / 3) = 2 assignments per expert
  // in (t, j) order, so pairs 4, 7 (expert 0) and 5, 6 (expert 1) drop.
  // The result is the dropless one with those pairs' weights at 0; so are
  // the gradients but for dweights, which is 0 at the dropped pairs.
  std::vector<float> wKept = w;
  for (int p : {4, 5, 6, 7})
    wKept[p] = 0.0f;
  std::vector<float> yCap(T * H), yKept(T * H), cg(T * k * I), cu(T * k * I), co(T * k * H);
  const cpu::ExpertsSaved capSaved{cg.data(), cu.data(), co.data()};
  cpu::experts(x.data(), T, H, w.data(), sel.data(), k, stack(g, I, H), stack(u, I, H),
               stack(d, H, I), cpu::Activation::Silu, yCap.data(), &capSaved, 0.5);
  cpu::experts(x.data(), T, H, wKept.data(), sel.data(), k, stack(g, I, H), stack(u, I, H),
               stack(d, H, I), cpu::Activation::Silu, yKept.data());
  near(yCap, yKept, "capacity-limited y");
  for (int p : {4, 5, 6, 7})
    for (int64_t i = 0; i < I; ++i)
      EXPECT_EQ(cg[p * I + i], 0.0f) << "saved gate of dropped pair " << p;
  std::vector<float> cx(T * H), cw(T * k), cgd(E * I * H), cud(E * I * H), cdd(E * H * I);
  cpu::expertsGrad(r.data(), x.data(), T, H, w.data(), sel.data(), k, stack(g, I, H),
                   stack(u, I, H), stack(d, H, I), cpu::Activation::Silu, cx.data(), cw.data(),
                   cgd.data(), cud.data(), cdd.data(), cg.data(), cu.data(), co.data(), 0.5);
  std::vector<float> kx(T * H), kw(T * k), kgd(E * I * H), kud(E * I * H), kdd(E * H * I);
  cpu::expertsGrad(r.data(), x.data(), T, H, wKept.data(), sel.data(), k, stack(g, I, H),
                   stack(u, I, H), stack(d, H, I), cpu::Activation::Silu, kx.data(), kw.data(),
                   kgd.data(), kud.data(), kdd.data());
  near(cx, kx, "capacity dx");
  near(cgd, kgd, "capacity dgate");
  near(cud, kud, "capacity dup");
  near(cdd, kdd, "capacity ddown");
  for (int p = 0; p < T * k; ++p)
    if (p >= 4)
      EXPECT_EQ(cw[p], 0.0f) << "dweights of dropped pair " << p;
    else
      EXPECT_NEAR(cw[p], kw[p], 1e-5 * (1 + std::fabs(kw[p]))) << p;
}

} // namespace
