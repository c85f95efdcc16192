// The optimizer's kernels (moert/cpu/Optimizer.h) against direct f64
// implementations of their formulas: the learning-rate schedules at the
// points transformers' schedules define, the clipping coefficient, the
// block-ordered sum of squares, the compensated gradient sums, and AdamW's update over several steps (with
// an all-zero gradient too: the parameter decays, the moments decay).
#include "moert/Parallel.h"
#include "moert/Tensor.h"
#include "moert/cpu/Isa.h"
#include "moert/cpu/Optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

using namespace moert;

namespace {

/// The hyper-parameters of the AdamW tests (torch's with beta2 0.95, wd 0.1).
cpu::AdamWStep testStep() {
  cpu::AdamWStep s;
  s.lr = 1e-2;
  s.beta1 = 0.9;
  s.beta2 = 0.95;
  s.eps = 1e-8;
  s.weightDecay = 0.1;
  return s;
}

TEST(OptimizerTest, ConstantScheduleWarmsUpLinearlyFromZero) {
  cpu::LrSchedule s{false, 1e-3, 0, 4, 0};
  EXPECT_EQ(cpu::scheduledLr(s, 1), 0.0);
  EXPECT_DOUBLE_EQ(cpu::scheduledLr(s, 2), 0.25e-3);
  EXPECT_DOUBLE_EQ(cpu::scheduledLr(s, 4), 0.75e-3);
  EXPECT_DOUBLE_EQ(cpu::scheduledLr(s, 5), 1e-3);
  EXPECT_DOUBLE_EQ(cpu::scheduledLr(s, 1000), 1e-3);
  cpu::LrSchedule none{false, 2e-3, 0, 0, 0};
  EXPECT_DOUBLE_EQ(cpu::scheduledLr(none, 1), 2e-3);
}

TEST(OptimizerTest, CosineDecaysToMinLrAndStaysThere) {
  const double lr = 1e-3, minLr = 1e-4;
  cpu::LrSchedule s{true, lr, minLr, 5, 20};
  EXPECT_DOUBLE_EQ(cpu::scheduledLr(s, 6), lr); // i = 5: progress 0
  for (int64_t step = 6; step <= 21; ++step) {
    const double p = static_cast<double>(step - 1 - 5) / 15.0;
    const double expected = lr * (minLr / lr + (1 - minLr / lr) * 0.5 * (1 + std::cos(M_PI * p)));
    EXPECT_NEAR(cpu::scheduledLr(s, step), expected, 1e-18) << "step " << step;
  }
  EXPECT_NEAR(cpu::scheduledLr(s, 21), minLr, 1e-18);
  EXPECT_NEAR(cpu::scheduledLr(s, 500), minLr, 1e-18); // held, not rising again
}

TEST(OptimizerTest, ClipCoefficientAsClipGradNorm) {
  EXPECT_DOUBLE_EQ(cpu::clipCoefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6));
  EXPECT_EQ(cpu::clipCoefficient(0.5, 1.0), 1.0);
  EXPECT_EQ(cpu::clipCoefficient(1e9, 0.0), 1.0); // 0: no clipping
}

TEST(OptimizerTest, SumOfSquaresIsTheSameForAnyThreadCount) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> x(300001);
  double exact = 0;
  for (float &v : x) {
    v = normal(rng);
    exact += static_cast<double>(v) * v;
  }
  setNumThreads(1);
  const double one = cpu::sumOfSquares(x.data(), static_cast<int64_t>(x.size()));
  setNumThreads(2);
  const double two = cpu::sumOfSquares(x.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(one, two);
  EXPECT_NEAR(one, exact, 1e-9 * exact);
}

/// Compensated gradient sums: 8 gradients of widely spread magnitudes,
/// added in one rank's order (accumulate, then addCompensation) and as 2 or
/// 4 replicas would add them (each its share, then combineCompensated in
/// replica order), give the correctly rounded sum (the f64 sum of the f32
/// values, rounded once) in every element, where the plain f32 sum does
/// not.
TEST(OptimizerTest, CompensatedSumsAreTheRoundedSumInAnyGrouping) {
  const int64_t n = 20000, count = 8;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> g(count, std::vector<float>(n));
  for (auto &v : g)
    for (float &x : v)
      x = normal(rng) * std::exp(2.0f * normal(rng));
  auto replicaSums = [&](int64_t replicas) {
    const int64_t share = count / replicas;
    std::vector<float> all(static_cast<size_t>(2 * n * replicas), 0.0f);
    for (int64_t r = 0; r < replicas; ++r)
      for (int64_t m = 0; m < share; ++m)
        cpu::accumulate(g[r * share + m].data(), all.data() + 2 * n * r,
                        all.data() + 2 * n * r + n, n);
    std::vector<float> sum(n), err(n);
    cpu::combineCompensated(all.data(), replicas, n, sum.data(), err.data());
    cpu::addCompensation(sum.data(), err.data(), n);
    for (float e : err)
      EXPECT_EQ(e, 0.0f);
    return sum;
  };
  std::vector<float> plain(n, 0.0f);
  for (auto &v : g)
    cpu::accumulate(v.data(), plain.data(), nullptr, n);
  int64_t plainOff = 0;
  const std::vector<float> one = replicaSums(1), two = replicaSums(2), four = replicaSums(4);
  for (int64_t i = 0; i < n; ++i) {
    double exact = 0;
    for (auto &v : g)
      exact += v[i];
    const float rounded = static_cast<float>(exact);
    ASSERT_EQ(one[i], rounded) << i;
    ASSERT_EQ(two[i], rounded) << i;
    ASSERT_EQ(four[i], rounded) << i;
    plainOff += plain[i] != rounded;
  }
  EXPECT_GT(plainOff, n / 10); // (the test would not tell them apart otherwise)
}

/// A table tied over the first and last of more than two pipeline stages:
/// combineStages gives both stages the bits the all_reduce of two stages
/// (combineCompensated over 2 members) gives, written over either's own.
TEST(OptimizerTest, CombineStagesIsTheAllReduceOfTwoStages) {
  const int64_t n = 1000;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> all(4 * n);
  for (float &x : all)
    x = u(rng);
  for (int64_t i = 0; i < n; ++i) { // (errors far below their sums)
    all[n + i] *= 1e-8f;
    all[3 * n + i] *= 1e-8f;
  }
  std::vector<float> sum(n), err(n);
  cpu::combineCompensated(all.data(), 2, n, sum.data(), err.data());
  // The first stage: its own pair first, written over it.
  std::vector<float> first(all.begin(), all.begin() + 2 * n);
  cpu::combineStages(first.data(), first.data() + n, all.data() + 2 * n, all.data() + 3 * n,
                     first.data(), first.data() + n, n);
  // The last: the first's pair first, written over its own.
  std::vector<float> last(all.begin() + 2 * n, all.end());
  cpu::combineStages(all.data(), all.data() + n, last.data(), last.data() + n, last.data(),
                     last.data() + n, n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(first[i], sum[i]) << i;
    ASSERT_EQ(first[n + i], err[i]) << i;
    ASSERT_EQ(last[i], sum[i]) << i;
    ASSERT_EQ(last[n + i], err[i]) << i;
  }
}

/// ZeRO-2's order (moert's reduce_scatter): in each round every replica's
/// next micro-batch, in replica order, added with TwoSum into one (sum,
/// error) pair; the error added back once. The same rounded sum as one rank
/// adding the micro-batches in order.
TEST(OptimizerTest, ReduceScatterRoundsGiveTheRoundedSum) {
  const int64_t n = 20000, count = 12;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> g(count, std::vector<float>(n));
  for (auto &v : g)
    for (float &x : v)
      x = normal(rng) * std::exp(2.0f * normal(rng));
  for (int64_t replicas : {2, 3, 4, 6}) {
    const int64_t share = count / replicas;
    std::vector<float> sum(n, 0.0f), err(n, 0.0f);
    for (int64_t round = 0; round < share; ++round)
      for (int64_t r = 0; r < replicas; ++r) // replica r's micro-batch `round`
        cpu::accumulate(g[r * share + round].data(), sum.data(), err.data(), n);
    cpu::addCompensation(sum.data(), err.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      double exact = 0;
      for (auto &v : g)
        exact += v[i];
      ASSERT_EQ(sum[i], static_cast<float>(exact)) << replicas << " replicas, element " << i;
    }
  }
}

TEST(OptimizerTest, AdamWFollowsTorchsFormula) {
  const int64_t n = 70000; // more than one block
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> p(n), m(n, 0), v(n, 0), sum(n);
  std::vector<double> pd(n), md(n, 0), vd(n, 0);
  for (int64_t i = 0; i < n; ++i)
    pd[i] = p[i] = normal(rng);
  cpu::AdamWStep s = testStep();
  for (int64_t t = 1; t <= 5; ++t) {
    s.step = t;
    s.gradScale = t == 3 ? 0.0 : 0.5; // update 3: an all-zero gradient
    std::vector<double> g(n);
    for (int64_t i = 0; i < n; ++i) {
      sum[i] = normal(rng);
      g[i] = static_cast<double>(sum[i]) * s.gradScale;
    }
    cpu::adamw(p.data(), m.data(), v.data(), sum.data(), n, s);
    for (int64_t i = 0; i < n; ++i) {
      pd[i] *= 1 - s.lr * s.weightDecay;
      md[i] = s.beta1 * md[i] + (1 - s.beta1) * g[i];
      vd[i] = s.beta2 * vd[i] + (1 - s.beta2) * g[i] * g[i];
      const double denom =
          std::sqrt(vd[i]) / std::sqrt(1 - std::pow(s.beta2, t)) + s.eps;
      pd[i] -= s.lr / (1 - std::pow(s.beta1, t)) * md[i] / denom;
    }
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(sum[i], 0.0f) << "the gradient sum is reset";
  }
  double err = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(p[i] - pd[i]));
    norm = std::max(norm, std::abs(pd[i]));
    ASSERT_NEAR(m[i], md[i], 1e-6) << i;
    ASSERT_NEAR(v[i], vd[i], 1e-6) << i;
  }
  EXPECT_LT(err, 1e-5 * norm);
}

// The kernel vectorizes the update at each level (generic, AVX2, AVX-512);
// every width must give the bits of the formula computed one float
// operation at a time, as torch's elementwise ops round it. keepSum leaves
// the gradient sum as it was and changes nothing else.
TEST(OptimizerTest, AdamWBitsAtEveryLevelAndKeptSums) {
  const int64_t n = 70001; // more than one block, and a ragged tail
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<float> p(n), m(n), v(n), sum(n), master(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = normal(rng);
    m[i] = 0.1f * normal(rng);
    v[i] = std::abs(0.01f * normal(rng));
    sum[i] = normal(rng) * std::exp(normal(rng));
  }
  cpu::AdamWStep s = testStep();
  s.step = 7;
  s.gradScale = 0.37;
  // The formula, one rounding per operation (the scalars as the kernel
  // rounds them).
  const float decay = static_cast<float>(1.0 - s.lr * s.weightDecay),
              scale = static_cast<float>(s.gradScale), w1 = static_cast<float>(1.0 - s.beta1),
              beta2 = static_cast<float>(s.beta2), w2 = static_cast<float>(1.0 - s.beta2),
              stepSize = static_cast<float>(-(s.lr / (1.0 - std::pow(s.beta1, 7.0)))),
              correction2 = static_cast<float>(std::sqrt(1.0 - std::pow(s.beta2, 7.0))),
              eps = static_cast<float>(s.eps);
  std::vector<float> pe(n), me(n), ve(n);
  for (int64_t i = 0; i < n; ++i) {
    volatile float g = sum[i] * scale, pd = p[i] * decay, diff = g - m[i], step = w1 * diff;
    volatile float mi = m[i] + step, sq = g * g, vb = v[i] * beta2, vw = w2 * sq;
    volatile float vi = vb + vw, root = std::sqrt(vi), q = root / correction2, denom = q + eps;
    volatile float ratio = mi / denom, move = stepSize * ratio;
    pe[i] = pd + move;
    me[i] = mi;
    ve[i] = vi;
  }
  for (bool keep : {false, true}) {
    SCOPED_TRACE(keep ? "keepSum" : "sum cleared");
    std::vector<float> pp = p, mm = m, vv = v, ss = sum, pm = p, mb = m, vb = v, sb = sum;
    std::vector<uint16_t> w(n);
    s.keepSum = keep;
    cpu::adamw(pp.data(), mm.data(), vv.data(), ss.data(), n, s);
    cpu::adamwBf16(w.data(), pm.data(), mb.data(), vb.data(), sb.data(), n, s);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(pp[i], pe[i]) << "element " << i << " at " << cpu::isaName(cpu::activeIsa());
      ASSERT_EQ(mm[i], me[i]) << i;
      ASSERT_EQ(vv[i], ve[i]) << i;
      ASSERT_EQ(pm[i], pe[i]) << i;
      ASSERT_EQ(w[i], floatToBf16(pe[i])) << i;
      ASSERT_EQ(ss[i], keep ? sum[i] : 0.0f) << i;
      ASSERT_EQ(sb[i], keep ? sum[i] : 0.0f) << i;
    }
  }
}

TEST(OptimizerTest, Bf16WeightsFollowTheirF32Master) {
  const int64_t n = 1000;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> w(n);
  // The master starts as the checkpoint's f32 values, the weight as their
  // rounding (moec compile --param-dtype bf16 of an f32 checkpoint).
  std::vector<float> p(n), master(n), m(n, 0), v(n, 0), sum(n), m2(n, 0), v2(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = master[i] = normal(rng);
    w[i] = floatToBf16(p[i]);
  }
  cpu::AdamWStep s = testStep();
  for (int64_t t = 1; t <= 3; ++t) {
    s.step = t;
    std::vector<float> g(n);
    for (int64_t i = 0; i < n; ++i)
      g[i] = sum[i] = normal(rng);
    cpu::adamwBf16(w.data(), master.data(), m.data(), v.data(), sum.data(), n, s);
    cpu::adamw(p.data(), m2.data(), v2.data(), g.data(), n, s); // the f32 path
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(master[i], p[i]) << "step " << t << ": the master follows the f32 update";
      ASSERT_EQ(w[i], floatToBf16(master[i])) << "the weight is the master's rounding";
    }
  }
}

TEST(OptimizerTest, ExpertBiasMovesTowardsTheMeanLoad) {
  // 4 experts, 6 tokens x top-2: loads 5, 3, 3, 1 (mean 3).
  const std::vector<int32_t> ids = {0, 1, 0, 2, 0, 3, 0, 1, 0, 2, 1, 2};
  std::vector<float> load(4, 0), bias = {0.5f, -0.25f, 0.1f, 0.0f};
  ASSERT_TRUE(cpu::countExperts(ids.data(), static_cast<int64_t>(ids.size()), load.data(), 4));
  EXPECT_EQ(load, (std::vector<float>{5, 3, 3, 1}));
  const float rate = static_cast<float>(1e-3);
  const std::vector<float> expected = {0.5f - rate, -0.25f, 0.1f, 0.0f + rate};
  cpu::expertBiasUpdate(bias.data(), load.data(), 4, 1e-3);
  EXPECT_EQ(bias, expected); // bit for bit; at the mean: unchanged
  EXPECT_EQ(load, (std::vector<float>(4, 0.0f)));
  const int32_t bad[] = {0, 4};
  EXPECT_FALSE(cpu::countExperts(bad, 2, load.data(), 4));
}

} // namespace
