// Units of the norm, rotary, attention, MLA and routing kernels: each against
// a naive double-precision reference written here, and the rotary tables
// against numbers produced by transformers 4.57 / torch 2.9 (pasted below as
// constants, so the test needs no Python).
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Isa.h"
#include "moert/cpu/Kernels.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

using namespace moert;
using namespace moert::cpu;

namespace {

std::vector<float> randomVector(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float &x : v)
    x = dist(rng);
  return v;
}

TensorView f32View(const std::vector<float> &v) {
  TensorView view;
  view.dtype = DType::F32;
  view.shape = {static_cast<int64_t>(v.size())};
  view.data = v.data();
  return view;
}

/// Runs a test body with `threads` pool threads, restoring the old count.
struct ThreadCount {
  int old;
  explicit ThreadCount(int threads) : old(numThreads()) { setNumThreads(threads); }
  ~ThreadCount() { setNumThreads(old); }
};

/// Runs `kernel` at every instruction-set level this CPU has (up to the one
/// active: ctest runs the suite once per level) and expects each level's
/// output bit for bit equal to the generic kernels' one.
template <class Kernel>
void expectEveryIsaLevelEqual(Kernel kernel, const std::string &what) {
  const Isa saved = activeIsa();
  setIsa(Isa::Generic);
  const std::vector<float> generic = kernel();
  for (Isa isa : supportedIsas()) {
    if (static_cast<int>(isa) > static_cast<int>(saved))
      continue;
    setIsa(isa);
    const std::vector<float> got = kernel();
    ASSERT_EQ(got.size(), generic.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], generic[i]) << what << " at " << isaName(isa) << ", value " << i;
  }
  setIsa(saved);
}

//===----------------------------------------------------------------------===//
// Norms
//===----------------------------------------------------------------------===//

/// Each group of w.size() values: g / sqrt(mean(g^2) + eps) * w.
std::vector<double> refRmsNorm(const std::vector<float> &x, const std::vector<float> &w, double eps) {
  const int64_t group = static_cast<int64_t>(w.size());
  std::vector<double> out(x.size());
  for (size_t g0 = 0; g0 < x.size(); g0 += group) {
    double sum = 0;
    for (int64_t i = 0; i < group; ++i)
      sum += double(x[g0 + i]) * x[g0 + i];
    const double r = 1.0 / std::sqrt(sum / group + eps);
    for (int64_t i = 0; i < group; ++i)
      out[g0 + i] = x[g0 + i] * r * w[i];
  }
  return out;
}

TEST(NormTest, RmsNormMatchesDoubleReference) {
  const int64_t tokens = 5, width = 48;
  auto x = randomVector(tokens * width, 1, -3, 3);
  auto w = randomVector(width, 2, 0.5, 1.5);
  std::vector<float> out(x.size());
  rmsNorm(x.data(), tokens, width, f32View(w), 1e-6, out.data());
  auto ref = refRmsNorm(x, w, 1e-6);
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_NEAR(out[i], ref[i], 2e-6 * std::abs(ref[i]) + 1e-7) << i;
  // In place gives the same values.
  std::vector<float> inPlace = x;
  rmsNorm(inPlace.data(), tokens, width, f32View(w), 1e-6, inPlace.data());
  EXPECT_EQ(inPlace, out);
}

TEST(NormTest, RmsNormPerHeadGroupsWithBf16Weight) {
  // Qwen3's q/k norm: a weight of head_dim values normalises every head.
  const int64_t tokens = 3, width = 32, headDim = 8;
  auto x = randomVector(tokens * width, 3, -2, 2);
  auto wf = randomVector(headDim, 4, 0.5, 1.5);
  std::vector<uint16_t> wbf(headDim);
  std::vector<float> widened(headDim);
  for (int64_t i = 0; i < headDim; ++i) {
    wbf[i] = floatToBf16(wf[i]);
    widened[i] = bf16ToFloat(wbf[i]);
  }
  TensorView weight;
  weight.dtype = DType::BF16;
  weight.shape = {headDim};
  weight.data = wbf.data();
  std::vector<float> out(x.size());
  rmsNorm(x.data(), tokens, width, weight, 1e-5, out.data());
  auto ref = refRmsNorm(x, widened, 1e-5);
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_NEAR(out[i], ref[i], 2e-6 * std::abs(ref[i]) + 1e-7) << i;
}

TEST(NormTest, EveryIsaLevelGivesTheSameBits) {
  // Widths around the vector lengths (tails of every size) and a long row;
  // values of very different magnitudes in one row.
  for (int64_t width : {1, 7, 8, 9, 15, 16, 17, 31, 40, 47, 64, 100, 4099}) {
    std::vector<float> x = randomVector(3 * width, static_cast<uint32_t>(width), -3, 3);
    for (size_t i = 0; i < x.size(); i += 5)
      x[i] *= 1e-3f;
    const std::vector<float> w = randomVector(width, 99, 0.5, 1.5);
    const std::vector<float> b = randomVector(width, 98);
    expectEveryIsaLevelEqual([&] {
      std::vector<float> out(x.size());
      rmsNorm(x.data(), 3, width, f32View(w), 1e-6, out.data());
      return out;
    }, "rms_norm width " + std::to_string(width));
    expectEveryIsaLevelEqual([&] {
      std::vector<float> out(x.size());
      const TensorView bias = f32View(b);
      layerNorm(x.data(), 3, width, f32View(w), &bias, 1e-5, out.data());
      return out;
    }, "layer_norm width " + std::to_string(width));
  }
}

TEST(NormTest, RmsNormRejectsWeightNotDividingWidth) {
  std::vector<float> x(10), w(4), out(10);
  EXPECT_THROW(rmsNorm(x.data(), 1, 10, f32View(w), 1e-6, out.data()), InputError);
}

TEST(NormTest, LayerNormMatchesDoubleReference) {
  const int64_t tokens = 4, width = 40;
  auto x = randomVector(tokens * width, 5, -2, 4);
  auto w = randomVector(width, 6, 0.5, 1.5);
  auto b = randomVector(width, 7);
  for (bool withBias : {false, true}) {
    std::vector<float> out(x.size());
    TensorView bias = f32View(b);
    layerNorm(x.data(), tokens, width, f32View(w), withBias ? &bias : nullptr, 1e-5, out.data());
    for (int64_t t = 0; t < tokens; ++t) {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < width; ++i)
        mean += x[t * width + i];
      mean /= width;
      for (int64_t i = 0; i < width; ++i)
        var += (x[t * width + i] - mean) * (x[t * width + i] - mean);
      var /= width; // biased, as torch's layer_norm
      for (int64_t i = 0; i < width; ++i) {
        double ref = (x[t * width + i] - mean) / std::sqrt(var + 1e-5) * w[i] + (withBias ? b[i] : 0.0);
        EXPECT_NEAR(out[t * width + i], ref, 2e-6 * std::abs(ref) + 1e-6);
      }
    }
  }
}

//===----------------------------------------------------------------------===//
// Rotary tables vs transformers
//===----------------------------------------------------------------------===//
//
// The expected numbers below were printed by this script, run with
// /work/venv-ref/bin/python (torch 2.9.1 CPU, transformers 4.57.6). For each
// config it prints `inv_freq` at some indices, then cos and sin (the first
// half of the rotary embedding's output, after attention scaling) at
// (position, index) from one forward call over positions 0..position (which
// for `dynamic` makes transformers use seq_len = position + 1):
//
//   import torch
//   from transformers import LlamaConfig, DeepseekV3Config
//   from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding as L
//   from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding as D
//   def run(name, cfg, cls, idx, pos):
//       e = cls(cfg); x = torch.zeros(1)
//       print(name, [f"{e.inv_freq[i].item():.9g}" for i in idx])
//       for p in pos:
//           c, s = e(x, torch.arange(p + 1)[None])
//           print([(p, i, f"{c[0,-1,i].item():.9g}", f"{s[0,-1,i].item():.9g}") for i in idx])
//   H = dict(hidden_size=512, num_attention_heads=8)  # head_dim 64
//   run("default", LlamaConfig(**H, rope_theta=10000.0), L, [0, 7, 16, 31], [0, 1, 1000])
//   run("linear", LlamaConfig(**H, rope_theta=10000.0,
//       rope_scaling={"rope_type": "linear", "factor": 4.0}), L, [0, 7, 16, 31], [1, 1000])
//   run("llama3", LlamaConfig(hidden_size=1024, num_attention_heads=8, rope_theta=500000.0,
//       max_position_embeddings=131072, rope_scaling={"rope_type": "llama3", "factor": 8.0,
//       "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
//       L, [0, 20, 32, 40, 50, 63], [1, 3000])
//   run("yarn", LlamaConfig(hidden_size=1024, num_attention_heads=8, rope_theta=1e6,
//       max_position_embeddings=131072, rope_scaling={"rope_type": "yarn", "factor": 4.0,
//       "original_max_position_embeddings": 32768}), L, [0, 10, 25, 40, 63], [0, 1, 2000])
//   run("yarn-dsv3", DeepseekV3Config(rope_theta=10000.0, qk_rope_head_dim=64,
//       max_position_embeddings=163840, rope_scaling={"type": "yarn", "factor": 40.0,
//       "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
//       "mscale_all_dim": 1.0}), D, [0, 5, 12, 20, 31], [1, 2000])
//   run("dynamic", LlamaConfig(hidden_size=256, num_attention_heads=8, rope_theta=10000.0,
//       max_position_embeddings=64, rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
//       L, [0, 3, 9, 15], [1, 63, 100, 300])
//
// torch evaluates pow and cos/sin with SLEEF (within 1 ulp, not correctly
// rounded) where the kernel rounds once from double, hence the ulp-level
// tolerances.

struct RopeSample {
  int pos, index;
  float cos, sin;
};

/// cos and sin of every pair at `pos`, read back by rotating (1, 0) pairs.
std::vector<float> ropeRow(const RopeTable &table, int32_t pos) {
  const int64_t r = table.params().rotaryDim;
  std::vector<float> x(r, 0.0f);
  std::fill(x.begin(), x.begin() + r / 2, 1.0f);
  EXPECT_FALSE(table.params().interleaved);
  table.apply(x.data(), 1, r, r, &pos);
  return x; // [cos(R/2), sin(R/2)]
}

void expectMatchesTransformers(const RopeParams &params, int64_t maxPositions,
                               const std::vector<int> &indices, const std::vector<float> &invFreq,
                               const std::vector<RopeSample> &samples) {
  RopeTable table(params, maxPositions);
  const int64_t half = params.rotaryDim / 2;
  // At position 1 the angle is inv_freq itself (the attention scaling of
  // yarn cancels in atan2).
  std::vector<float> one = ropeRow(table, 1);
  for (size_t j = 0; j < indices.size(); ++j) {
    const int i = indices[j];
    const double angle = std::atan2(double(one[half + i]), double(one[i]));
    EXPECT_NEAR(angle, invFreq[j], 1e-6 * invFreq[j]) << "inv_freq[" << i << "]";
  }
  for (const RopeSample &s : samples) {
    std::vector<float> row = ropeRow(table, s.pos);
    EXPECT_NEAR(row[s.index], s.cos, 3e-7) << "cos at " << s.pos << ", " << s.index;
    EXPECT_NEAR(row[half + s.index], s.sin, 3e-7) << "sin at " << s.pos << ", " << s.index;
  }
}

TEST(RopeTest, DefaultMatchesTransformers) {
  RopeParams p;
  p.theta = 10000.0;
  p.rotaryDim = 64;
  expectMatchesTransformers(
      p, 1024, {0, 7, 16, 31}, {1.0f, 0.133352146f, 0.00999999978f, 0.00013335215f},
      {{0, 0, 1.0f, 0.0f}, {0, 7, 1.0f, 0.0f}, {0, 16, 1.0f, 0.0f}, {0, 31, 1.0f, 0.0f},
       {1, 0, 0.540302336f, 0.841470957f}, {1, 7, 0.991121769f, 0.132957265f},
       {1, 16, 0.999949992f, 0.00999983307f}, {1, 31, 1.0f, 0.00013335215f},
       {1000, 0, 0.562379062f, 0.826879561f}, {1000, 7, 0.164790347f, 0.986328602f},
       {1000, 16, -0.839071512f, -0.54402113f}, {1000, 31, 0.991121769f, 0.132957265f}});
}

TEST(RopeTest, LinearMatchesTransformers) {
  RopeParams p;
  p.kind = RopeParams::Kind::Linear;
  p.theta = 10000.0;
  p.rotaryDim = 64;
  p.factor = 4.0;
  expectMatchesTransformers(
      p, 1024, {0, 7, 16, 31}, {0.25f, 0.0333380364f, 0.00249999994f, 3.33380376e-05f},
      {{1, 0, 0.968912423f, 0.247403964f}, {1, 7, 0.999444366f, 0.0333318599f},
       {1, 16, 0.999996901f, 0.00249999738f}, {1, 31, 1.0f, 3.33380376e-05f},
       {1000, 0, 0.240988299f, -0.970528007f}, {1000, 7, -0.344130635f, 0.93892175f},
       {1000, 16, -0.801143587f, 0.598472118f}, {1000, 31, 0.999444366f, 0.0333318599f}});
}

TEST(RopeTest, Llama3MatchesTransformers) {
  RopeParams p;
  p.kind = RopeParams::Kind::Llama3;
  p.theta = 500000.0;
  p.rotaryDim = 128;
  p.factor = 8.0;
  p.lowFreqFactor = 1.0;
  p.highFreqFactor = 4.0;
  p.originalMaxPosition = 8192;
  // Indices 0 and 20 keep their frequency, 32 is smoothed, 40+ are divided
  // by the factor.
  expectMatchesTransformers(
      p, 4096, {0, 20, 32, 40, 50, 63},
      {1.0f, 0.0165604409f, 0.000524846022f, 3.42810235e-05f, 4.41153452e-06f, 3.06892588e-07f},
      {{1, 0, 0.540302336f, 0.841470957f}, {1, 20, 0.99986285f, 0.0165596846f},
       {1, 32, 0.999999881f, 0.000524846022f}, {1, 40, 1.0f, 3.42810235e-05f},
       {1, 50, 1.0f, 4.41153452e-06f}, {1, 63, 1.0f, 3.06892588e-07f},
       {3000, 0, -0.975682199f, 0.219189972f}, {3000, 20, 0.834176481f, -0.551497579f},
       {3000, 32, -0.00374177611f, 0.999993026f}, {3000, 40, 0.994716287f, 0.102661878f},
       {3000, 50, 0.999912441f, 0.0132342167f}, {3000, 63, 0.999999583f, 0.000920677674f}});
}

TEST(RopeTest, YarnMatchesTransformersWithAttentionFactor) {
  // Qwen-style yarn without mscale: cos/sin carry 0.1 * ln(4) + 1.
  RopeParams p;
  p.kind = RopeParams::Kind::Yarn;
  p.theta = 1e6;
  p.rotaryDim = 128;
  p.factor = 4.0;
  p.originalMaxPosition = 32768;
  p.attentionFactor = 0.1 * std::log(4.0) + 1.0; // what moec derives
  expectMatchesTransformers(
      p, 2048, {0, 10, 25, 40, 63},
      {1.0f, 0.115478203f, 0.0041317381f, 4.44569851e-05f, 3.10234441e-07f},
      {{0, 0, 1.13862944f, 0.0f}, {0, 63, 1.13862944f, 0.0f},
       {1, 0, 0.615204155f, 0.958123624f}, {1, 10, 1.13104594f, 0.131194845f},
       {1, 25, 1.13861978f, 0.00470450521f}, {1, 40, 1.13862944f, 5.06200304e-05f},
       {1, 63, 1.13862944f, 3.53242058e-07f}, {2000, 0, -0.418400288f, 1.05897033f},
       {2000, 10, 0.0561635531f, -1.13724339f}, {2000, 25, -0.45334062f, 1.04448998f},
       {2000, 40, 1.13413155f, 0.101106718f}, {2000, 63, 1.1386292f, 0.000706484076f}});
}

TEST(RopeTest, YarnDeepSeekV3MatchesTransformers) {
  // mscale == mscale_all_dim: the attention factor is exactly 1.
  RopeParams p;
  p.kind = RopeParams::Kind::Yarn;
  p.theta = 10000.0;
  p.rotaryDim = 64;
  p.factor = 40.0;
  p.originalMaxPosition = 4096;
  p.betaFast = 32;
  p.betaSlow = 1;
  p.attentionFactor = 1.0; // mscale / mscale_all_dim, as moec derives it
  expectMatchesTransformers(
      p, 2048, {0, 5, 12, 20, 31},
      {1.0f, 0.237137362f, 0.0268793609f, 0.000790569407f, 3.33380353e-06f},
      {{1, 0, 0.540302336f, 0.841470957f}, {1, 5, 0.972014427f, 0.234921068f},
       {1, 12, 0.999638796f, 0.0268761236f}, {1, 20, 0.999999702f, 0.000790569349f},
       {1, 31, 1.0f, 3.33380353e-06f}, {2000, 0, -0.367459565f, 0.930039525f},
       {2000, 5, -0.994411409f, 0.10557434f}, {2000, 12, -0.938807309f, -0.344442874f},
       {2000, 20, -0.0103423381f, 0.999946535f}, {2000, 31, 0.999977767f, 0.00666755764f}});
}

TEST(RopeTest, DynamicMatchesTransformersPerSequenceLength) {
  // Within max_position_embeddings (64) the default frequencies; beyond it
  // position p uses the base grown for seq_len = p + 1, which is what
  // transformers uses in a forward call whose last position is p.
  RopeParams p;
  p.kind = RopeParams::Kind::Dynamic;
  p.theta = 10000.0;
  p.rotaryDim = 32;
  p.factor = 2.0;
  p.originalMaxPosition = 64;
  expectMatchesTransformers(
      p, 512, {0, 3, 9, 15}, {1.0f, 0.177827939f, 0.00562341325f, 0.00017782794f},
      {{1, 0, 0.540302336f, 0.841470957f}, {1, 3, 0.98423022f, 0.176892191f},
       {1, 9, 0.999984205f, 0.00562338345f}, {1, 15, 1.0f, 0.00017782794f},
       {63, 0, 0.985896587f, 0.167355701f}, {63, 3, 0.206098333f, -0.978531301f},
       {63, 9, 0.937898219f, 0.346910536f}, {63, 15, 0.999937236f, 0.0112029258f},
       {100, 0, 0.862318873f, -0.506365657f}, {100, 3, -0.89680469f, 0.442426682f},
       {100, 9, 0.937773585f, 0.347247332f}, {100, 15, 0.999966025f, 0.00824700017f},
       {300, 0, -0.022096619f, -0.999755859f}, {300, 3, -0.957578182f, -0.288173676f},
       {300, 9, 0.891439795f, 0.453139156f}, {300, 15, 0.999979854f, 0.00634623319f}});
}

TEST(RopeTest, HalfAndInterleavedRotationOfPartialHeads) {
  // Two heads of 10 values, 6 rotated: rotate_half pairs (i, i + 3),
  // interleaved pairs (2i, 2i + 1); values 6..9 pass unchanged.
  const int64_t heads = 2, headDim = 10, rotary = 6, tokens = 3, ld = 24;
  const std::vector<int32_t> positions = {0, 3, 17};
  const std::vector<float> x = randomVector(tokens * ld, 11);
  for (bool interleaved : {false, true}) {
    RopeParams p;
    p.theta = 100.0;
    p.rotaryDim = rotary;
    p.interleaved = interleaved;
    RopeTable table(p, 32);
    std::vector<float> y = x;
    // Rows of 24 values of which the first 20 are the heads (ldx != width).
    table.apply(y.data(), tokens, heads * headDim, headDim, positions.data(), ld);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const float *in = x.data() + t * ld + h * headDim;
        const float *out = y.data() + t * ld + h * headDim;
        for (int64_t i = 0; i < rotary / 2; ++i) {
          const double angle = positions[t] * std::pow(100.0, -2.0 * i / rotary);
          const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + rotary / 2;
          EXPECT_NEAR(out[a], in[a] * std::cos(angle) - in[b] * std::sin(angle), 1e-5);
          EXPECT_NEAR(out[b], in[b] * std::cos(angle) + in[a] * std::sin(angle), 1e-5);
        }
        for (int64_t i = rotary; i < headDim; ++i)
          EXPECT_EQ(out[i], in[i]);
      }
      for (int64_t i = heads * headDim; i < ld; ++i)
        EXPECT_EQ(y[t * ld + i], x[t * ld + i]); // beyond the width: untouched
    }
  }
}

TEST(RopeTest, EveryIsaLevelGivesTheSameBits) {
  // Rotary widths with every tail of the 8- and 16-lane loops, partial
  // heads, rows wider than the heads.
  for (int64_t rotary : {2, 6, 14, 16, 18, 30, 32, 34, 64, 128}) {
    for (bool interleaved : {false, true}) {
      RopeParams p;
      p.theta = 10000.0;
      p.rotaryDim = rotary;
      p.interleaved = interleaved;
      RopeTable table(p, 64);
      const int64_t headDim = rotary + 6, heads = 3, tokens = 5, ld = heads * headDim + 3;
      const std::vector<int32_t> positions = {0, 1, 17, 40, 63};
      const std::vector<float> x = randomVector(tokens * ld, static_cast<uint32_t>(rotary), -2, 2);
      expectEveryIsaLevelEqual([&] {
        std::vector<float> y = x;
        table.apply(y.data(), tokens, heads * headDim, headDim, positions.data(), ld);
        return y;
      }, "rope " + std::to_string(rotary) + (interleaved ? " interleaved" : " half"));
    }
  }
}

TEST(RopeTest, RejectsPositionOutsideTable) {
  RopeParams p;
  p.rotaryDim = 4;
  RopeTable table(p, 8);
  std::vector<float> x(4);
  int32_t pos = 8;
  EXPECT_THROW(table.apply(x.data(), 1, 4, 4, &pos), InputError);
  p.rotaryDim = 5;
  EXPECT_THROW(RopeTable(p, 8), InputError);
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

/// One sequence's history for the reference: rows by position.
struct History {
  std::vector<std::vector<float>> keys, values;
};

/// softmax(q_h K^T * scale) V for one query head over positions
/// (pos - window, pos] of a history, in double.
std::vector<double> refAttendHead(const float *q, const History &hist, int64_t pos, int64_t kvOffsetK,
                                  int64_t kvOffsetV, int64_t dq, int64_t dv, double scale,
                                  int64_t window) {
  const int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
  std::vector<double> scores;
  for (int64_t j = first; j <= pos; ++j) {
    double s = 0;
    for (int64_t d = 0; d < dq; ++d)
      s += double(q[d]) * hist.keys[j][kvOffsetK + d];
    scores.push_back(s * scale);
  }
  const double max = *std::max_element(scores.begin(), scores.end());
  double sum = 0;
  for (double &s : scores)
    sum += (s = std::exp(s - max));
  std::vector<double> out(dv, 0.0);
  for (int64_t j = first; j <= pos; ++j)
    for (int64_t d = 0; d < dv; ++d)
      out[d] += scores[j - first] / sum * hist.values[j][kvOffsetV + d];
  return out;
}

/// Tokens of a batch: (slot, position) and their q/k/v rows.
struct Batch {
  std::vector<int32_t> seq, pos;
  std::vector<float> q, k, v;
  TokenLayout layout() const { return {seq.data(), pos.data(), static_cast<int64_t>(seq.size())}; }
};

class AttentionTest : public ::testing::Test {
protected:
  static constexpr int64_t heads = 4, kvHeads = 2, dq = 8, dv = 6;
  static constexpr double scale = 0.35;
  // Every token of two sequences: slot 2 has 6 tokens, slot 0 has 4.
  std::vector<float> q = randomVector(10 * heads * dq, 21);
  std::vector<float> k = randomVector(10 * kvHeads * dq, 22);
  std::vector<float> v = randomVector(10 * kvHeads * dv, 23);
  /// Token `i` of the 10: slot 2 positions 0..5 are tokens 0..5, slot 0
  /// positions 0..3 are tokens 6..9.
  static int token(int32_t slot, int32_t pos) { return slot == 2 ? pos : 6 + pos; }

  Batch batch(const std::vector<std::pair<int32_t, int32_t>> &tokens) const {
    Batch b;
    for (auto [slot, pos] : tokens) {
      const int i = token(slot, pos);
      b.seq.push_back(slot);
      b.pos.push_back(pos);
      b.q.insert(b.q.end(), q.begin() + i * heads * dq, q.begin() + (i + 1) * heads * dq);
      b.k.insert(b.k.end(), k.begin() + i * kvHeads * dq, k.begin() + (i + 1) * kvHeads * dq);
      b.v.insert(b.v.end(), v.begin() + i * kvHeads * dv, v.begin() + (i + 1) * kvHeads * dv);
    }
    return b;
  }

  std::vector<float> run(const Batch &b, KVCache &cache, int64_t window = 0) const {
    std::vector<float> out(b.seq.size() * heads * dv);
    attention(b.q.data(), b.k.data(), b.v.data(), b.layout(), heads, kvHeads, dq, dv, scale,
              window, cache, out.data());
    return out;
  }

  void expectMatchesReference(const Batch &b, const std::vector<float> &out, int64_t window = 0) const {
    for (size_t t = 0; t < b.seq.size(); ++t) {
      History hist;
      for (int32_t p = 0; p <= b.pos[t]; ++p) {
        const int i = token(b.seq[t], p);
        hist.keys.emplace_back(k.begin() + i * kvHeads * dq, k.begin() + (i + 1) * kvHeads * dq);
        hist.values.emplace_back(v.begin() + i * kvHeads * dv, v.begin() + (i + 1) * kvHeads * dv);
      }
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t g = h / (heads / kvHeads); // GQA: query head h reads kv head g
        auto ref = refAttendHead(b.q.data() + (t * heads + h) * dq, hist, b.pos[t], g * dq, g * dv, dq,
                                 dv, scale, window);
        for (int64_t d = 0; d < dv; ++d)
          EXPECT_NEAR(out[(t * heads + h) * dv + d], ref[d], 2e-6)
              << "token " << t << " head " << h << " dim " << d;
      }
    }
  }
};

TEST_F(AttentionTest, GqaTwoSequencesThenDecodeEqualsRecomputation) {
  ThreadCount threads(3);
  KVCache cache;
  cache.allocate(3, 16, kvHeads * dq, kvHeads * dv);
  // Prefill: slot 2 with 5 tokens and slot 0 with 3, in one batch.
  Batch prefill = batch({{2, 0}, {2, 1}, {2, 2}, {2, 3}, {2, 4}, {0, 0}, {0, 1}, {0, 2}});
  expectMatchesReference(prefill, run(prefill, cache));
  // Decode: one more token each (slot 0 first this time), from the cache.
  Batch decode = batch({{0, 3}, {2, 5}});
  std::vector<float> stepped = run(decode, cache);
  expectMatchesReference(decode, stepped);
  // Recomputing both sequences at once in a fresh cache gives the same bits
  // for those two tokens.
  KVCache fresh;
  fresh.allocate(3, 16, kvHeads * dq, kvHeads * dv);
  Batch full = batch({{0, 0}, {0, 1}, {0, 2}, {0, 3}, {2, 0}, {2, 1}, {2, 2}, {2, 3}, {2, 4}, {2, 5}});
  std::vector<float> all = run(full, fresh);
  for (int64_t i = 0; i < heads * dv; ++i) {
    EXPECT_EQ(stepped[i], all[3 * heads * dv + i]);
    EXPECT_EQ(stepped[heads * dv + i], all[9 * heads * dv + i]);
  }
}

TEST_F(AttentionTest, SlidingWindowAttendsToTheLastWTokens) {
  ThreadCount threads(2);
  KVCache cache;
  cache.allocate(3, 16, kvHeads * dq, kvHeads * dv);
  Batch prefill = batch({{2, 0}, {2, 1}, {2, 2}, {2, 3}, {2, 4}});
  expectMatchesReference(prefill, run(prefill, cache, 3), 3);
  Batch decode = batch({{2, 5}});
  expectMatchesReference(decode, run(decode, cache, 3), 3);
  // A window longer than the sequence is plain causal attention.
  KVCache other;
  other.allocate(3, 16, kvHeads * dq, kvHeads * dv);
  EXPECT_EQ(run(prefill, other, 100), run(prefill, cache, 0));
}

// A long prefill: tiles of many tokens (more than 16 query rows per kv head),
// key counts that are not a multiple of 8, head dims that are not a multiple
// of 16 and a value width over 64, with and without a sliding window. Every
// token matches the reference, and a decode step gives the same bits as the
// same token recomputed inside the prefill.
TEST(AttentionTiles, LongPrefillMatchesReferenceAndDecodeBits) {
  constexpr int64_t heads = 6, kvHeads = 2, dq = 37, dv = 70, T = 45;
  constexpr double scale = 0.2;
  for (int threads : {1, 3})
    for (int64_t window : {int64_t(0), int64_t(11)}) {
      ThreadCount tc(threads);
      auto q = randomVector(T * heads * dq, 31, -2, 2);
      auto k = randomVector(T * kvHeads * dq, 32, -2, 2);
      auto v = randomVector(T * kvHeads * dv, 33);
      History hist;
      for (int64_t t = 0; t < T; ++t) {
        hist.keys.emplace_back(k.begin() + t * kvHeads * dq, k.begin() + (t + 1) * kvHeads * dq);
        hist.values.emplace_back(v.begin() + t * kvHeads * dv, v.begin() + (t + 1) * kvHeads * dv);
      }
      std::vector<int32_t> seq(T, 1), pos(T);
      for (int64_t t = 0; t < T; ++t)
        pos[t] = static_cast<int32_t>(t);
      KVCache full;
      full.allocate(2, 64, kvHeads * dq, kvHeads * dv);
      std::vector<float> all(T * heads * dv);
      attention(q.data(), k.data(), v.data(), {seq.data(), pos.data(), T}, heads, kvHeads, dq, dv,
                scale, window, full, all.data());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t g = h / (heads / kvHeads);
          auto ref = refAttendHead(q.data() + (t * heads + h) * dq, hist, t, g * dq, g * dv, dq, dv,
                                   scale, window);
          for (int64_t d = 0; d < dv; ++d)
            ASSERT_NEAR(all[(t * heads + h) * dv + d], ref[d], 2e-6)
                << "window " << window << " token " << t << " head " << h << " dim " << d;
        }
      // Prefill T-1 tokens, then decode the last one.
      KVCache stepCache;
      stepCache.allocate(2, 64, kvHeads * dq, kvHeads * dv);
      std::vector<float> part((T - 1) * heads * dv), last(heads * dv);
      attention(q.data(), k.data(), v.data(), {seq.data(), pos.data(), T - 1}, heads, kvHeads, dq,
                dv, scale, window, stepCache, part.data());
      attention(q.data() + (T - 1) * heads * dq, k.data() + (T - 1) * kvHeads * dq,
                v.data() + (T - 1) * kvHeads * dv, {seq.data() + T - 1, pos.data() + T - 1, 1},
                heads, kvHeads, dq, dv, scale, window, stepCache, last.data());
      for (int64_t i = 0; i < heads * dv; ++i)
        ASSERT_EQ(last[i], all[(T - 1) * heads * dv + i]) << "window " << window << " value " << i;
      for (int64_t i = 0; i < (T - 1) * heads * dv; ++i)
        ASSERT_EQ(part[i], all[i]) << "window " << window << " value " << i;
    }
}

TEST_F(AttentionTest, RejectsTokensOutsideTheCache) {
  KVCache cache;
  cache.allocate(1, 4, kvHeads * dq, kvHeads * dv);
  Batch badSlot = batch({{2, 0}});
  EXPECT_THROW(run(badSlot, cache), InputError);
  Batch badPos = batch({{0, 0}});
  badPos.pos[0] = 4;
  EXPECT_THROW(run(badPos, cache), InputError);
  KVCache wrongWidth;
  wrongWidth.allocate(3, 4, dq, dv);
  EXPECT_THROW(run(batch({{0, 0}}), wrongWidth), InputError);
}

//===----------------------------------------------------------------------===//
// MLA
//===----------------------------------------------------------------------===//

TEST(MlaTest, MatchesTransformersStyleReferenceAcrossDecode) {
  ThreadCount threads(2);
  const int64_t heads = 3, nope = 4, rope = 4, vdim = 5, qk = nope + rope;
  const double scale = 0.3;
  RopeParams p;
  p.theta = 10.0; // small base: large angles even at small positions
  p.rotaryDim = rope;
  p.interleaved = true;
  RopeTable table(p, 32);
  // Two sequences: slot 1 with 4 tokens, slot 0 with 3; all tokens' inputs.
  const int total = 7;
  auto q = randomVector(total * heads * qk, 31);
  auto kv = randomVector(total * heads * (nope + vdim), 32);
  auto keyRope = randomVector(total * rope, 33);
  const std::vector<int32_t> seqOf = {1, 1, 1, 1, 0, 0, 0}, posOf = {0, 1, 2, 3, 0, 1, 2};

  // transformers' DeepSeek-V3 in double: apply_rotary_pos_emb_interleave
  // de-interleaves the rotary part to (evens, odds) and rotates halves.
  auto rotateHf = [&](const float *x, int32_t pos) {
    std::vector<double> perm(rope), out(rope);
    for (int64_t i = 0; i < rope / 2; ++i) {
      perm[i] = x[2 * i];
      perm[i + rope / 2] = x[2 * i + 1];
    }
    for (int64_t i = 0; i < rope / 2; ++i) {
      const double angle = pos * std::pow(10.0, -2.0 * i / rope);
      out[i] = perm[i] * std::cos(angle) - perm[i + rope / 2] * std::sin(angle);
      out[i + rope / 2] = perm[i + rope / 2] * std::cos(angle) + perm[i] * std::sin(angle);
    }
    return out;
  };
  auto reference = [&](int token, int64_t h) {
    std::vector<double> qh(q.begin() + (token * heads + h) * qk, q.begin() + (token * heads + h) * qk + nope);
    auto qr = rotateHf(q.data() + (token * heads + h) * qk + nope, posOf[token]);
    qh.insert(qh.end(), qr.begin(), qr.end());
    std::vector<double> scores, out(vdim, 0.0);
    std::vector<int> keys;
    for (int j = 0; j < total; ++j) {
      if (seqOf[j] != seqOf[token] || posOf[j] > posOf[token])
        continue;
      const float *kvh = kv.data() + (j * heads + h) * (nope + vdim);
      auto kr = rotateHf(keyRope.data() + j * rope, posOf[j]);
      double s = 0;
      for (int64_t d = 0; d < nope; ++d)
        s += qh[d] * kvh[d];
      for (int64_t d = 0; d < rope; ++d)
        s += qh[nope + d] * kr[d];
      scores.push_back(s * scale);
      keys.push_back(j);
    }
    const double max = *std::max_element(scores.begin(), scores.end());
    double sum = 0;
    for (double &s : scores)
      sum += (s = std::exp(s - max));
    for (size_t j = 0; j < keys.size(); ++j)
      for (int64_t d = 0; d < vdim; ++d)
        out[d] += scores[j] / sum * kv[(keys[j] * heads + h) * (nope + vdim) + nope + d];
    return out;
  };

  KVCache cache;
  cache.allocate(2, 8, heads * qk, heads * vdim);
  auto runTokens = [&](const std::vector<int> &tokens) {
    std::vector<int32_t> seq, pos;
    std::vector<float> bq, bkv, bkr;
    for (int i : tokens) {
      seq.push_back(seqOf[i]);
      pos.push_back(posOf[i]);
      bq.insert(bq.end(), q.begin() + i * heads * qk, q.begin() + (i + 1) * heads * qk);
      bkv.insert(bkv.end(), kv.begin() + i * heads * (nope + vdim), kv.begin() + (i + 1) * heads * (nope + vdim));
      bkr.insert(bkr.end(), keyRope.begin() + i * rope, keyRope.begin() + (i + 1) * rope);
    }
    TokenLayout layout{seq.data(), pos.data(), static_cast<int64_t>(tokens.size())};
    std::vector<float> out(tokens.size() * heads * vdim);
    mlaAttention(bq.data(), bkv.data(), bkr.data(), layout, heads, nope, rope, vdim, scale, table,
                 cache, out.data());
    for (size_t t = 0; t < tokens.size(); ++t)
      for (int64_t h = 0; h < heads; ++h) {
        auto ref = reference(tokens[t], h);
        for (int64_t d = 0; d < vdim; ++d)
          EXPECT_NEAR(out[(t * heads + h) * vdim + d], ref[d], 2e-6) << "token " << tokens[t] << " head " << h;
      }
  };
  runTokens({0, 1, 2, 4, 5}); // prefill: slot 1 positions 0..2, slot 0 positions 0..1
  runTokens({6, 3});          // decode: one token each, from the cache
}

//===----------------------------------------------------------------------===//
// Routing
//===----------------------------------------------------------------------===//

struct Routed {
  std::vector<int32_t> experts;
  std::vector<double> weights;
};

/// #moe.routing step by step in double, for one token.
Routed refRoute(const std::vector<float> &logitsIn, const std::vector<float> *bias, const RoutingParams &p) {
  const int64_t E = static_cast<int64_t>(logitsIn.size());
  std::vector<double> l(E), s(E), key(E);
  for (int64_t e = 0; e < E; ++e)
    l[e] = p.computeBf16 ? roundBf16(logitsIn[e]) : logitsIn[e];
  const double max = *std::max_element(l.begin(), l.end());
  double sum = 0;
  for (int64_t e = 0; e < E; ++e)
    sum += std::exp(l[e] - max);
  for (int64_t e = 0; e < E; ++e)
    s[e] = p.sigmoid ? 1 / (1 + std::exp(-l[e])) : std::exp(l[e] - max) / sum;
  for (int64_t e = 0; e < E; ++e)
    key[e] = (p.topkOnLogits ? l[e] : s[e]) + (bias ? (*bias)[e] : 0.0);
  auto byKey = [](const std::vector<double> &k) {
    std::vector<int32_t> order(k.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return k[a] > k[b]; });
    return order;
  };
  if (p.numGroups > 1) {
    const int64_t size = E / p.numGroups;
    std::vector<double> groupScore(p.numGroups);
    for (int64_t g = 0; g < p.numGroups; ++g) {
      std::vector<double> members(key.begin() + g * size, key.begin() + (g + 1) * size);
      std::sort(members.rbegin(), members.rend());
      groupScore[g] = p.groupScoreMax ? members[0] : members[0] + members[1];
    }
    auto groups = byKey(groupScore);
    for (int64_t i = p.topkGroups; i < p.numGroups; ++i)
      std::fill(key.begin() + groups[i] * size, key.begin() + (groups[i] + 1) * size,
                -std::numeric_limits<double>::infinity());
  }
  Routed r;
  auto order = byKey(key);
  r.experts.assign(order.begin(), order.begin() + p.topK);
  double chosenSum = 0;
  for (int32_t e : r.experts)
    chosenSum += std::exp(l[e] - l[r.experts[0]]);
  for (int32_t e : r.experts)
    r.weights.push_back(p.topkOnLogits && !p.sigmoid ? std::exp(l[e] - l[r.experts[0]]) / chosenSum : s[e]);
  if (p.normalize) {
    const double total = std::accumulate(r.weights.begin(), r.weights.end(), 0.0);
    for (double &w : r.weights)
      w /= total + 1e-20;
  }
  for (double &w : r.weights)
    w *= p.scalingFactor;
  return r;
}

Routed runRoute(const std::vector<float> &logits, const std::vector<float> *bias, const RoutingParams &p) {
  std::vector<float> w(p.topK);
  std::vector<int32_t> e(p.topK);
  TensorView biasView;
  if (bias)
    biasView = f32View(*bias);
  route(logits.data(), 1, static_cast<int64_t>(logits.size()), bias ? &biasView : nullptr, p, w.data(),
        e.data());
  return {e, std::vector<double>(w.begin(), w.end())};
}

TEST(RouteTest, EveryVariantMatchesDoubleReference) {
  ThreadCount threads(2);
  const int64_t E = 16, T = 24;
  const auto logits = randomVector(E * T, 41, -3, 3);
  const auto bias = randomVector(E, 42, -0.5, 0.5);
  int cases = 0;
  for (bool sigmoid : {false, true})
    for (bool onLogits : {false, true})
      for (bool normalize : {false, true})
        for (int grouping : {0, 1, 2}) // none, top-2 sum, max
          for (bool withBias : {false, true})
            for (bool bf16 : {false, true}) {
              RoutingParams p;
              p.sigmoid = sigmoid;
              p.topK = 4;
              p.topkOnLogits = onLogits;
              p.normalize = normalize;
              p.scalingFactor = normalize ? 2.5 : 1.0;
              p.numGroups = grouping ? 4 : 1;
              p.topkGroups = grouping ? 2 : 1;
              p.groupScoreMax = grouping == 2;
              p.computeBf16 = bf16;
              TensorView biasView = f32View(bias);
              std::vector<float> w(T * p.topK);
              std::vector<int32_t> experts(T * p.topK);
              route(logits.data(), T, E, withBias ? &biasView : nullptr, p, w.data(), experts.data());
              for (int64_t t = 0; t < T; ++t) {
                std::vector<float> row(logits.begin() + t * E, logits.begin() + (t + 1) * E);
                Routed ref = refRoute(row, withBias ? &bias : nullptr, p);
                for (int64_t j = 0; j < p.topK; ++j) {
                  SCOPED_TRACE(testing::Message() << "case " << cases << " token " << t << " slot " << j);
                  EXPECT_EQ(experts[t * p.topK + j], ref.experts[j]);
                  // bf16 weights are within one bf16 rounding of the exact value.
                  const double tol = bf16 ? 4e-3 * std::abs(ref.weights[j]) : 2e-6 * std::abs(ref.weights[j]) + 1e-9;
                  EXPECT_NEAR(w[t * p.topK + j], ref.weights[j], tol);
                  if (bf16)
                    EXPECT_EQ(w[t * p.topK + j], roundBf16(w[t * p.topK + j]));
                }
              }
              ++cases;
            }
}

TEST(RouteTest, TiesPickTheLowerIndexFirst) {
  RoutingParams p;
  p.topK = 2;
  Routed r = runRoute({0.5f, 2.0f, 2.0f, -1.0f, 2.0f}, nullptr, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(r.weights[0], r.weights[1]);
  // Tied groups: the lower group index is kept.
  p.sigmoid = true;
  p.numGroups = 2;
  p.topkGroups = 1;
  p.topK = 1;
  r = runRoute({1.0f, 0.0f, 0.0f, 1.0f}, nullptr, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{0}));
}

TEST(RouteTest, MixtralRenormalisesTheTopKOfTheFullSoftmax) {
  RoutingParams p;
  p.topK = 2;
  p.normalize = true;
  Routed r = runRoute({1.0f, 2.0f, 3.0f, 4.0f}, nullptr, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{3, 2}));
  EXPECT_NEAR(r.weights[0], 1 / (1 + std::exp(-1.0)), 3e-7);
  EXPECT_NEAR(r.weights[1], 1 / (1 + std::exp(1.0)), 3e-7);
  // Qwen2-MoE / OLMoE without norm_topk_prob: the full-softmax probabilities.
  p.normalize = false;
  r = runRoute({1.0f, 2.0f, 3.0f, 4.0f}, nullptr, p);
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(4.0);
  EXPECT_NEAR(r.weights[0], std::exp(4.0) / z, 3e-7);
  EXPECT_NEAR(r.weights[1], std::exp(3.0) / z, 3e-7);
  // Pre-softmax top-k: the softmax of the chosen logits, same experts.
  p.topkOnLogits = true;
  r = runRoute({1.0f, 2.0f, 3.0f, 4.0f}, nullptr, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{3, 2}));
  EXPECT_NEAR(r.weights[0], 1 / (1 + std::exp(-1.0)), 3e-7);
}

TEST(RouteTest, BiasSelectsButDoesNotWeigh) {
  RoutingParams p;
  p.sigmoid = true;
  p.topK = 2;
  const std::vector<float> bias = {5.0f, 0.0f, 0.0f, 0.0f};
  Routed r = runRoute({0.0f, 1.0f, 2.0f, 3.0f}, &bias, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{0, 3}));
  EXPECT_FLOAT_EQ(r.weights[0], 0.5f); // sigmoid(0), not sigmoid(0) + 5
  EXPECT_NEAR(r.weights[1], 1 / (1 + std::exp(-3.0)), 3e-7);
  // DeepSeek-V3: normalise (+1e-20) then scale by routed_scaling_factor.
  p.normalize = true;
  p.scalingFactor = 2.5;
  r = runRoute({0.0f, 1.0f, 2.0f, 3.0f}, &bias, p);
  const double s3 = 1 / (1 + std::exp(-3.0));
  EXPECT_NEAR(r.weights[0], 2.5 * 0.5 / (0.5 + s3), 1e-6);
  EXPECT_NEAR(r.weights[1], 2.5 * s3 / (0.5 + s3), 1e-6);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 2.5, 1e-6);
}

TEST(RouteTest, GroupScoreTop2SumAndMaxChooseDifferentGroups) {
  // Group 0 has one strong expert, group 1 two good ones, groups 2-3 weak.
  const std::vector<float> logits = {3.0f, -3.0f, 2.0f, 2.0f, -5.0f, -5.0f, -5.0f, -5.0f};
  RoutingParams p;
  p.sigmoid = true;
  p.topK = 2;
  p.numGroups = 4;
  p.topkGroups = 1;
  // top-2 sum: 0.953 + 0.047 = 1.0 < 0.881 + 0.881: group 1 (DeepSeek-V3).
  EXPECT_EQ(runRoute(logits, nullptr, p).experts, (std::vector<int32_t>{2, 3}));
  // max: 0.953 > 0.881: group 0 (DeepSeek-V2's group_limited_greedy).
  p.groupScoreMax = true;
  EXPECT_EQ(runRoute(logits, nullptr, p).experts, (std::vector<int32_t>{0, 1}));
}

TEST(RouteTest, MaskedExpertsAreNeverChosen) {
  // Kept group 0 has negative keys (score 0.5 + bias -1); the dropped
  // group's keys are -inf, so its experts never win (DeepSeek's inference
  // code, transformers 5.x); 4.57's masked_fill(0.0) would pick 2 and 3.
  RoutingParams p;
  p.sigmoid = true;
  p.topK = 2;
  p.numGroups = 2;
  p.topkGroups = 1;
  const std::vector<float> bias = {-1.0f, -1.0f, -2.0f, -2.0f};
  Routed r = runRoute({0.0f, 0.0f, 0.0f, 0.0f}, &bias, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{0, 1}));
  for (double w : r.weights)
    EXPECT_EQ(w, 0.5);
}

TEST(RouteTest, ComputeBf16RoundsLogitsAndWeights) {
  // 1 + 2^-10 is 1.0 in bf16: the two logits tie and expert 0 wins.
  const std::vector<float> logits = {1.0f, 1.0f + 0.0009765625f, 0.3f};
  RoutingParams p;
  p.topK = 1;
  EXPECT_EQ(runRoute(logits, nullptr, p).experts, (std::vector<int32_t>{1}));
  p.computeBf16 = true;
  Routed r = runRoute(logits, nullptr, p);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{0}));
  const double z = 2 * std::exp(1.0) + std::exp(double(roundBf16(0.3f)));
  EXPECT_EQ(r.weights[0], roundBf16(static_cast<float>(std::exp(1.0) / z)));
}

TEST(RouteTest, RejectsInconsistentParams) {
  RoutingParams p;
  p.topK = 5;
  std::vector<float> logits(4), w(5);
  std::vector<int32_t> e(5);
  EXPECT_THROW(route(logits.data(), 1, 4, nullptr, p, w.data(), e.data()), InputError);
  p.topK = 1;
  p.numGroups = 3;
  EXPECT_THROW(route(logits.data(), 1, 4, nullptr, p, w.data(), e.data()), InputError);
  p.numGroups = 2;
  p.topkGroups = 3;
  EXPECT_THROW(route(logits.data(), 1, 4, nullptr, p, w.data(), e.data()), InputError);
}

} // namespace
