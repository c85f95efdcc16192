// The training loss's CPU kernels (cpu::crossEntropy, routerStats, lmLoss)
// against direct f64 implementations of MoETrainingOps.td's formulas, and
// the token data readers (moert/TokenData.h).
#include "moert/Error.h"
#include "moert/Npy.h"
#include "moert/TokenData.h"
#include "moert/cpu/Kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

using namespace moert;

namespace {

std::vector<float> randomValues(size_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float &x : v)
    x = d(rng);
  return v;
}

double lse(const float *x, int64_t n) {
  double m = x[0], s = 0;
  for (int64_t i = 1; i < n; ++i)
    m = std::max(m, double(x[i]));
  for (int64_t i = 0; i < n; ++i)
    s += std::exp(x[i] - m);
  return m + std::log(s);
}

TEST(LossTest, CrossEntropySkipsIgnoredRowsAndPadding) {
  const int64_t T = 37, width = 20, vocab = 17;
  std::vector<float> logits = randomValues(T * width, 1);
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
    std::vector<float> logits = randomValues(T * E, 10 + l);
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

std::string tempPath(const char *name) {
  return ::testing::TempDir() + "/loss_test_" + name;
}

TEST(TokenDataTest, NpyOfEveryIntegerWidth) {
  const std::string path = tempPath("ids.npy");
  writeNpy(path, {5}, std::vector<int64_t>{0, 7, 250, 3, 1});
  EXPECT_EQ(readTokenData(path, 251), (std::vector<int32_t>{0, 7, 250, 3, 1}));
  writeNpy(path, {3}, std::vector<int32_t>{4, 5, 6});
  EXPECT_EQ(readTokenData(path, 7), (std::vector<int32_t>{4, 5, 6}));
  try {
    readTokenData(path, 6);
    FAIL() << "an id outside the vocabulary was accepted";
  } catch (const InputError &e) {
    EXPECT_NE(std::string(e.what()).find("token 2 is id 6, outside the model's vocabulary [0, 6)"),
              std::string::npos)
        << e.what();
  }
  writeNpy(path, {2}, std::vector<int32_t>{-1, 2});
  EXPECT_THROW(readTokenData(path, 10), InputError);
  writeNpy(path, {1, 2}, std::vector<float>{1, 2});
  EXPECT_THROW(readTokenData(path, 10), InputError);
  std::remove(path.c_str());
}

TEST(TokenDataTest, WindowsShareOneToken) {
  EXPECT_EQ(windowCount(0, 4), 0);
  EXPECT_EQ(windowCount(1, 4), 0);
  EXPECT_EQ(windowCount(4, 4), 0);
  EXPECT_EQ(windowCount(5, 4), 1);
  EXPECT_EQ(windowCount(9, 4), 2);
  EXPECT_EQ(windowCount(12, 4), 2);
}

} // namespace
