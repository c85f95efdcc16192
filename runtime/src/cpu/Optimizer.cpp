// The optimizer's CPU kernels (moert/cpu/Optimizer.h). Built with
// -ffp-contract=off: each product and sum is rounded as torch's separate
// elementwise ops round it; and -fno-math-errno, so that the update's
// square roots vectorize (its arguments are never negative).
#include "moert/cpu/Optimizer.h"
#include "IsaTarget.h"
#include "moert/Parallel.h"
#include "moert/Tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace moert::cpu {
namespace {
constexpr int64_t kBlock = 1 << 16;
constexpr double kPi = 3.14159265358979323846;

/// body(begin, end) over [0, n) in blocks of kBlock, on all threads.
template <typename Body> void blocks(int64_t n, Body body) {
  const int64_t count = (n + kBlock - 1) / kBlock;
  parallelFor(count, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      body(b, b * kBlock, std::min(n, (b + 1) * kBlock));
  });
}
} // namespace

namespace {
/// a + b = s + e exactly, s the rounded sum (Knuth's TwoSum: no branch, any
/// magnitudes).
inline void twoSum(float a, float b, float &s, float &e) {
  s = a + b;
  const float bv = s - a, av = s - bv;
  e = (a - av) + (b - bv);
}
} // namespace

void accumulate(const float *g, float *sum, float *err, int64_t n) {
  blocks(n, [&](int64_t, int64_t begin, int64_t end) {
    if (!err) {
      for (int64_t i = begin; i < end; ++i)
        sum[i] += g[i];
      return;
    }
    for (int64_t i = begin; i < end; ++i) {
      float s, e;
      twoSum(sum[i], g[i], s, e);
      sum[i] = s;
      err[i] += e;
    }
  });
}

void addCompensation(float *sum, float *err, int64_t n) {
  blocks(n, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      sum[i] += err[i];
      err[i] = 0;
    }
  });
}

void combineCompensated(const float *all, int64_t members, int64_t n, float *sum, float *err) {
  blocks(n, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float s = all[i], lost = all[n + i];
      for (int64_t q = 1; q < members; ++q) {
        float e;
        twoSum(s, all[2 * n * q + i], s, e);
        lost += all[2 * n * q + n + i] + e;
      }
      sum[i] = s;
      err[i] = lost;
    }
  });
}

void combineStages(const float *firstSum, const float *firstErr, const float *lastSum,
                   const float *lastErr, float *sum, float *err, int64_t n) {
  blocks(n, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (!err) {
        sum[i] = firstSum[i] + lastSum[i];
        continue;
      }
      float s, e;
      twoSum(firstSum[i], lastSum[i], s, e);
      const float lost = firstErr[i] + (lastErr[i] + e);
      sum[i] = s;
      err[i] = lost;
    }
  });
}

double sumOfSquares(const float *x, int64_t n) {
  std::vector<double> partial(static_cast<size_t>((n + kBlock - 1) / kBlock), 0.0);
  blocks(n, [&partial, x](int64_t b, int64_t begin, int64_t end) {
    // Eight running sums (element i into sum i mod 8), added at the end:
    // a fixed order that vectorizes.
    double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = begin;
    for (; i + 8 <= end; i += 8)
      for (int k = 0; k < 8; ++k)
        lanes[k] += static_cast<double>(x[i + k]) * x[i + k];
    for (; i < end; ++i)
      lanes[0] += static_cast<double>(x[i]) * x[i];
    double s = 0;
    for (double lane : lanes)
      s += lane;
    partial[static_cast<size_t>(b)] = s;
  });
  double total = 0;
  for (double p : partial)
    total += p;
  return total;
}

double scheduledLr(const LrSchedule &s, int64_t step) {
  const int64_t i = step - 1;
  if (i < s.warmupSteps)
    return s.lr * static_cast<double>(i) / static_cast<double>(std::max<int64_t>(1, s.warmupSteps));
  if (!s.cosine)
    return s.lr;
  const double progress =
      std::min(1.0, static_cast<double>(i - s.warmupSteps) /
                        static_cast<double>(std::max<int64_t>(1, s.decaySteps - s.warmupSteps)));
  const double minRate = s.minLr / s.lr;
  const double factor = 0.5 * (1.0 + std::cos(kPi * progress));
  return s.lr * std::max(0.0, factor * (1.0 - minRate) + minRate);
}

double clipCoefficient(double norm, double maxNorm) {
  return maxNorm > 0 ? std::min(1.0, maxNorm / (norm + 1e-6)) : 1.0;
}

namespace {
/// floatToBf16 (nearest even, NaN kept quiet) without a branch, so that
/// the loop around it vectorizes.
inline uint16_t roundToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quietNan = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quietNan : rounded);
}

/// The update's scalars, rounded to float once (as the loop uses them).
struct AdamWConstants {
  float decay, scale, w1, beta2, w2, stepSize, correction2, eps;
  explicit AdamWConstants(const AdamWStep &s) {
    const auto t = static_cast<double>(s.step);
    decay = static_cast<float>(1.0 - s.lr * s.weightDecay);
    scale = static_cast<float>(s.gradScale);
    w1 = static_cast<float>(1.0 - s.beta1);
    beta2 = static_cast<float>(s.beta2);
    w2 = static_cast<float>(1.0 - s.beta2);
    stepSize = static_cast<float>(-(s.lr / (1.0 - std::pow(s.beta1, t))));
    correction2 = static_cast<float>(std::sqrt(1.0 - std::pow(s.beta2, t)));
    eps = static_cast<float>(s.eps);
  }
};

/// AdamW over `count` parameters of one block; with `wr`, pr is a bf16
/// weight's master (which starts as the checkpoint's values: RankExecutor),
/// rounded into the weight after the update. Each operation rounds as
/// torch's elementwise ops do (no contraction: -ffp-contract=off; IEEE
/// square roots and quotients), so every vector width gives the same bits.
template <bool Bf16, bool Clear>
inline __attribute__((always_inline)) void adamwBlock(float *__restrict pr, float *__restrict mr,
                                                      float *__restrict vr, float *__restrict sr,
                                                      uint16_t *__restrict wr, int64_t count,
                                                      const AdamWConstants k) {
  for (int64_t i = 0; i < count; ++i) {
    const float g = sr[i] * k.scale;
    const float p = pr[i] * k.decay;
    // torch's lerp with a weight below 0.5: m + w (g - m).
    const float mi = mr[i] + k.w1 * (g - mr[i]);
    const float vi = vr[i] * k.beta2 + k.w2 * (g * g);
    const float denom = std::sqrt(vi) / k.correction2 + k.eps;
    const float updated = p + k.stepSize * (mi / denom);
    pr[i] = updated;
    mr[i] = mi;
    vr[i] = vi;
    if constexpr (Clear)
      sr[i] = 0;
  }
  // The bf16 weight from its master, while the block is in cache (a loop
  // of its own: mixed with the update, neither vectorizes).
  if constexpr (Bf16)
    for (int64_t i = 0; i < count; ++i)
      wr[i] = roundToBf16(pr[i]);
}

using AdamWBlock = void (*)(float *, float *, float *, float *, uint16_t *, int64_t,
                            AdamWConstants);

template <bool Bf16, bool Clear>
void adamwGeneric(float *pr, float *mr, float *vr, float *sr, uint16_t *wr, int64_t count,
                  AdamWConstants k) {
  adamwBlock<Bf16, Clear>(pr, mr, vr, sr, wr, count, k);
}

#ifdef MOERT_X86
// The same loops vectorized at the wider levels: the square roots and
// quotients bound the x86-64 baseline's 4-lane version (one 96M-parameter
// pass on 2 threads of an AMD EPYC Zen 4: 0.21 s; 8 lanes 1.5x faster, 16
// lanes 2.4x, and 2.6x without clearing the sums).
template <bool Bf16, bool Clear>
MOERT_AVX2 void adamwAvx2(float *pr, float *mr, float *vr, float *sr, uint16_t *wr,
                          int64_t count, AdamWConstants k) {
  adamwBlock<Bf16, Clear>(pr, mr, vr, sr, wr, count, k);
}
template <bool Bf16, bool Clear>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,prefer-vector-width=512"))) void
adamwAvx512(float *pr, float *mr, float *vr, float *sr, uint16_t *wr, int64_t count,
            AdamWConstants k) {
  adamwBlock<Bf16, Clear>(pr, mr, vr, sr, wr, count, k);
}
#endif

template <bool Bf16, bool Clear>
AdamWBlock adamwAtLevel() {
#ifdef MOERT_X86
  if (activeIsa() >= Isa::Avx512)
    return adamwAvx512<Bf16, Clear>;
  if (activeIsa() >= Isa::Avx2)
    return adamwAvx2<Bf16, Clear>;
#endif
  return adamwGeneric<Bf16, Clear>;
}

/// AdamW over n parameters in one pass, in blocks on all threads.
template <bool Bf16>
void adamwPass(float *param, float *m, float *v, float *gradSum, uint16_t *weight, int64_t n,
               const AdamWStep &s) {
  const AdamWConstants k(s);
  const AdamWBlock block = s.keepSum ? adamwAtLevel<Bf16, false>() : adamwAtLevel<Bf16, true>();
  blocks(n, [=](int64_t, int64_t begin, int64_t end) {
    block(param + begin, m + begin, v + begin, gradSum + begin, Bf16 ? weight + begin : nullptr,
          end - begin, k);
  });
}
} // namespace

void adamw(float *param, float *m, float *v, float *gradSum, int64_t n, const AdamWStep &s) {
  adamwPass<false>(param, m, v, gradSum, nullptr, n, s);
}

void adamwBf16(uint16_t *weight, float *master, float *m, float *v, float *gradSum, int64_t n,
               const AdamWStep &s) {
  adamwPass<true>(master, m, v, gradSum, weight, n, s);
}

bool countExperts(const int32_t *ids, int64_t n, float *load, int64_t experts) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= experts)
      return false;
    load[ids[i]] += 1.0f;
  }
  return true;
}

void expertBiasUpdate(float *bias, float *load, int64_t experts, double rate) {
  // sign(sum / E - load_e) = sign(sum - E load_e): integers, exact.
  double sum = 0;
  for (int64_t e = 0; e < experts; ++e)
    sum += load[e];
  const float step = static_cast<float>(rate);
  for (int64_t e = 0; e < experts; ++e) {
    const double offset = sum - static_cast<double>(experts) * load[e];
    const float sign = offset > 0 ? 1.0f : offset < 0 ? -1.0f : 0.0f;
    bias[e] = bias[e] + sign * step;
    load[e] = 0;
  }
}

} // namespace moert::cpu
