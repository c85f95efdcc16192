// RMSNorm and LayerNorm, in f32 as transformers computes them.
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Kernels.h"

#include <cmath>

namespace moert::cpu {
namespace {

/// A norm weight (or bias) widened to f32 once per call.
std::vector<float> widen(const TensorView &v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i)
    out[i] = v.at(i);
  return out;
}

} // namespace

void rmsNorm(const float *x, int64_t tokens, int64_t width, const TensorView &weight,
             double eps, float *out) {
  const int64_t group = weight.numel();
  if (group <= 0 || width % group != 0)
    inputError("rms_norm: weight of {} values does not divide the row width {}", group, width);
  const std::vector<float> w = widen(weight);
  const float epsF = static_cast<float>(eps);
  parallelFor(tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t g0 = 0; g0 < width; g0 += group) {
        const float *row = x + t * width + g0;
        float *dst = out + t * width + g0;
        // transformers: x.pow(2).mean(-1) in f32 (each square rounded to f32;
        // the sum accumulated in double here, torch's f32 cascade sum is as
        // close to exact), then `/ N`, `+ eps`, rsqrt as 1 / sqrt, each f32.
        double sum = 0;
        for (int64_t i = 0; i < group; ++i) {
          const float sq = row[i] * row[i];
          sum += sq;
        }
        const float mean = static_cast<float>(sum) / static_cast<float>(group);
        const float rstd = 1.0f / std::sqrt(mean + epsF);
        // (x * rstd) then * weight: two f32 roundings, in that order.
        for (int64_t i = 0; i < group; ++i)
          dst[i] = w[i] * (row[i] * rstd);
      }
    }
  }, 16);
}

void layerNorm(const float *x, int64_t tokens, int64_t width, const TensorView &weight,
               const TensorView *bias, double eps, float *out) {
  if (weight.numel() != width)
    inputError("layer_norm: weight has {} values, rows have {}", weight.numel(), width);
  if (bias && bias->numel() != width)
    inputError("layer_norm: bias has {} values, rows have {}", bias->numel(), width);
  if (width <= 0)
    return;
  const std::vector<float> w = widen(weight);
  const std::vector<float> b = bias ? widen(*bias) : std::vector<float>(width, 0.0f);
  parallelFor(tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *row = x + t * width;
      float *dst = out + t * width;
      // Mean and biased variance in double (two passes), then the f32
      // normalisation torch's layer_norm applies.
      double sum = 0;
      for (int64_t i = 0; i < width; ++i)
        sum += row[i];
      const double mean = sum / static_cast<double>(width);
      double squares = 0;
      for (int64_t i = 0; i < width; ++i) {
        const double d = row[i] - mean;
        squares += d * d;
      }
      const double var = squares / static_cast<double>(width);
      const float rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
      const float meanF = static_cast<float>(mean);
      for (int64_t i = 0; i < width; ++i)
        dst[i] = (row[i] - meanF) * rstd * w[i] + b[i];
    }
  }, 16);
}

} // namespace moert::cpu
