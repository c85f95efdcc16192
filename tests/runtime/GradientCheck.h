// Helpers of the training kernels' tests (TrainingKernelsTest.cpp,
// MoEGradientsTest.cpp): random data, f64 references and the central
// finite differences the backward kernels are checked against.
#pragma once

#include "moert/cpu/Kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace moert::gradcheck {

inline std::vector<float> randomValues(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float &x : v)
    x = d(rng);
  return v;
}

inline double lse(const float *x, int64_t n) {
  double m = x[0], s = 0;
  for (int64_t i = 1; i < n; ++i)
    m = std::max(m, double(x[i]));
  for (int64_t i = 0; i < n; ++i)
    s += std::exp(x[i] - m);
  return m + std::log(s);
}

inline cpu::Matrix matrixOf(const std::vector<float> &w, int64_t rows, int64_t cols) {
  cpu::Matrix m;
  m.dtype = DType::F32;
  m.data = w.data();
  m.rows = rows;
  m.cols = cols;
  m.rowStride = cols;
  return m;
}

/// The numerical gradient of f (an f64 function of `x`) at x.
inline std::vector<double> numericGradient(std::vector<float> x,
                                    const std::function<double(const std::vector<double> &)> &f) {
  std::vector<double> xd(x.begin(), x.end()), g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double h = 1e-5 * std::max(1.0, std::abs(xd[i])), keep = xd[i];
    xd[i] = keep + h;
    const double up = f(xd);
    xd[i] = keep - h;
    const double down = f(xd);
    xd[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

/// ||a - b|| / ||b|| <= tol.
inline void expectClose(const float *a, const std::vector<double> &b, double tol, const char *what) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  EXPECT_LE(std::sqrt(diff), tol * std::sqrt(norm)) << what << ": norm " << std::sqrt(norm);
  EXPECT_GT(norm, 0) << what;
}

inline double dot(const std::vector<double> &y, const std::vector<float> &r) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i)
    s += y[i] * r[i];
  return s;
}

} // namespace moert::gradcheck
