// Units of the fused bf16 routing + dispatch (moert/cpu/Dispatch.h): its
// logits against the f32 linear of the widened bf16 data, its choices and
// weights against cpu::route on the same logits, and its gather (exact,
// stable, in expert order), on both kernels, 1-3 threads and odd shapes.
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Dispatch.h"
#include "moert/cpu/Isa.h"
#include "moert/cpu/Kernels.h"

#include "gtest/gtest.h"

#include <cmath>
#include <cstring>
#include <random>

using namespace moert;
using namespace moert::cpu;

namespace {

struct ThreadCount {
  int old;
  explicit ThreadCount(int threads) : old(numThreads()) { setNumThreads(threads); }
  ~ThreadCount() { setNumThreads(old); }
};

std::vector<uint16_t> randomBf16(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<uint16_t> v(n);
  for (auto &x : v)
    x = floatToBf16(u(rng) * scale);
  return v;
}

struct Case {
  int64_t tokens, hidden, experts, k;
  int threads;
  DispatchKernel kernel;
  size_t outMisalign = 0; // elements the output is shifted off 64 bytes
};

/// Runs the kernel and checks everything against cpu::linear / cpu::route.
/// Sets `nearTies` to the number of choices that differed at near-ties.
void checkInto(const Case &c, const std::vector<uint16_t> &x, const std::vector<uint16_t> &gate,
               int &nearTies) {
  nearTies = -1;
  ThreadCount threads(c.threads);
  const int64_t T = c.tokens, H = c.hidden, E = c.experts, k = c.k;
  std::vector<float> weights(T * k, -1), logits(T * E);
  std::vector<int32_t> ids(T * k, -1), rows(T * k, -1);
  std::vector<int64_t> offsets(E + 1, -1);
  std::vector<uint16_t> outStore(T * k * H + 64, 0xdead);
  uint16_t *out = outStore.data();
  while (reinterpret_cast<uintptr_t>(out) % 64)
    ++out;
  out += c.outMisalign;
  routeAndDispatchBf16(x.data(), T, H, gate.data(), E, k, weights.data(), ids.data(),
                       rows.data(), offsets.data(), out, logits.data(), c.kernel);

  // Logits: within 1e-5 of the f32 linear of the widened data, relative to
  // the dot product's sum of |terms| (its f32 rounding scale).
  std::vector<float> xf(T * H), gf(E * H), ref(T * E);
  for (size_t i = 0; i < xf.size(); ++i)
    xf[i] = bf16ToFloat(x[i]);
  for (size_t i = 0; i < gf.size(); ++i)
    gf[i] = bf16ToFloat(gate[i]);
  TensorView gateView{DType::F32, {E, H}, gf.data()};
  linear(xf.data(), T, Matrix::of(gateView), nullptr, ref.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      double scale = 0;
      for (int64_t i = 0; i < H; ++i)
        scale += std::abs(double(xf[t * H + i]) * gf[e * H + i]);
      ASSERT_NEAR(logits[t * E + e], ref[t * E + e], 1e-5 * scale + 1e-30)
          << "token " << t << " expert " << e;
    }

  // Choices and weights: cpu::route on the same logits.
  RoutingParams p;
  p.topK = k;
  p.normalize = true;
  std::vector<float> refW(T * k);
  std::vector<int32_t> refIds(T * k);
  route(logits.data(), T, E, nullptr, p, refW.data(), refIds.data());
  nearTies = 0;
  for (int64_t t = 0; t < T; ++t) {
    bool same = true;
    for (int64_t j = 0; j < k; ++j)
      same = same && ids[t * k + j] == refIds[t * k + j];
    if (!same) {
      // Allowed only where the logits at stake are within f32 rounding.
      for (int64_t j = 0; j < k; ++j) {
        const float a = logits[t * E + ids[t * k + j]], b = logits[t * E + refIds[t * k + j]];
        EXPECT_NEAR(a, b, 1e-6 * std::max(1.0f, std::abs(a))) << "token " << t;
      }
      ++nearTies;
      continue;
    }
    for (int64_t j = 0; j < k; ++j)
      EXPECT_NEAR(weights[t * k + j], refW[t * k + j], 1e-6) << "token " << t << " slot " << j;
  }

  // Positions: expert e owns [off[e], off[e+1]), rows in token order there,
  // every row once; the gather is exact.
  EXPECT_EQ(offsets[0], 0);
  EXPECT_EQ(offsets[E], T * k);
  std::vector<int64_t> next(offsets.begin(), offsets.end() - 1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      ASSERT_GE(e, 0);
      ASSERT_LT(e, E);
      ASSERT_EQ(rows[t * k + j], next[e]++) << "token " << t << " slot " << j;
      ASSERT_EQ(std::memcmp(out + int64_t(rows[t * k + j]) * H, x.data() + t * H, H * 2), 0)
          << "token " << t << " slot " << j;
    }
  for (int64_t e = 0; e < E; ++e)
    EXPECT_EQ(next[e], offsets[e + 1]);
  // Nothing written outside the output.
  for (uint16_t *q = outStore.data(); q < out; ++q)
    EXPECT_EQ(*q, 0xdead);
  for (uint16_t *q = out + T * k * H; q < outStore.data() + outStore.size(); ++q)
    EXPECT_EQ(*q, 0xdead);
}

int check(const Case &c, const std::vector<uint16_t> &x, const std::vector<uint16_t> &gate) {
  int nearTies = -1;
  checkInto(c, x, gate, nearTies);
  return nearTies;
}

} // namespace

TEST(DispatchTest, MixtralSizesMatchLinearAndRoute) {
  const int64_t T = 301, H = 4096, E = 8;
  auto x = randomBf16(T * H, 1, 1.0f), gate = randomBf16(E * H, 2, 0.02f);
  for (DispatchKernel kernel : {DispatchKernel::Auto, DispatchKernel::Scalar})
    for (int threads : {1, 2, 3}) {
      SCOPED_TRACE(testing::Message() << "threads " << threads << " scalar "
                                      << (kernel == DispatchKernel::Scalar));
      EXPECT_EQ(check({T, H, E, 2, threads, kernel}, x, gate), 0);
    }
}

TEST(DispatchTest, OddShapesAndAlignments) {
  struct Shape {
    int64_t tokens, hidden, experts, k;
    size_t misalign;
  };
  for (Shape s : {Shape{1, 4096, 8, 2, 0}, Shape{7, 100, 5, 3, 1}, Shape{50, 33, 12, 2, 3},
                  Shape{40, 64, 3, 1, 0}, Shape{65, 96, 16, 5, 7}, Shape{20, 4096, 8, 8, 5},
                  Shape{0, 4096, 8, 2, 0}})
    for (DispatchKernel kernel : {DispatchKernel::Auto, DispatchKernel::Scalar})
      for (int threads : {1, 2}) {
        SCOPED_TRACE(testing::Message() << "T " << s.tokens << " H " << s.hidden << " E "
                                        << s.experts << " k " << s.k << " threads " << threads
                                        << " scalar " << (kernel == DispatchKernel::Scalar));
        auto x = randomBf16(s.tokens * s.hidden, 3, 1.0f);
        auto gate = randomBf16(s.experts * s.hidden, 4, 0.05f);
        EXPECT_EQ(check({s.tokens, s.hidden, s.experts, s.k, threads, kernel, s.misalign}, x,
                        gate),
                  0);
      }
}

TEST(DispatchTest, LargeBatchesStreamTheCopiesExactly) {
  // Input + output above 16 MiB: the copies use non-temporal stores (whole
  // lines; partial lines at the ends of rows when the output is misaligned).
  const int64_t T = 720, H = 4096, E = 8;
  auto x = randomBf16(T * H, 7, 1.0f), gate = randomBf16(E * H, 8, 0.02f);
  for (size_t misalign : {size_t(0), size_t(3)}) {
    SCOPED_TRACE(testing::Message() << "misalign " << misalign);
    EXPECT_EQ(check({T, H, E, 2, 2, DispatchKernel::Auto, misalign}, x, gate), 0);
  }
}

TEST(DispatchTest, TiesPickTheLowerExpertFirst) {
  // Gate rows 1, 2 and 4 are equal: their logits tie exactly.
  const int64_t T = 64, H = 256, E = 6;
  auto x = randomBf16(T * H, 5, 1.0f), gate = randomBf16(E * H, 6, 0.001f);
  for (int64_t i = 0; i < H; ++i) {
    gate[1 * H + i] = floatToBf16(0.05f);
    gate[2 * H + i] = gate[1 * H + i];
    gate[4 * H + i] = gate[1 * H + i];
    x[i] = floatToBf16(1.0f); // token 0: experts 1, 2, 4 lead
  }
  for (DispatchKernel kernel : {DispatchKernel::Auto, DispatchKernel::Scalar}) {
    EXPECT_EQ(check({T, H, E, 2, 2, kernel}, x, gate), 0);
    std::vector<float> w(T * 2);
    std::vector<int32_t> ids(T * 2), rows(T * 2);
    std::vector<int64_t> offsets(E + 1);
    std::vector<uint16_t> out(T * 2 * H);
    routeAndDispatchBf16(x.data(), T, H, gate.data(), E, 2, w.data(), ids.data(), rows.data(),
                         offsets.data(), out.data(), nullptr, kernel);
    EXPECT_EQ(ids[0], 1);
    EXPECT_EQ(ids[1], 2);
    EXPECT_EQ(w[0], 0.5f);
    EXPECT_EQ(w[1], 0.5f);
  }
}

// The AVX2 tiles (3 tokens x 4, 3, 2 or 1 experts; the avx2 and avx512
// levels run them) add each lane's products in the portable order: the
// logits are the portable kernel's, bit for bit, whatever the mix of tiles.
TEST(DispatchTest, VectorLogitsAreThePortableBits) {
  if (activeIsa() >= Isa::Avx512Bf16)
    GTEST_SKIP() << "the avx512bf16 kernel's vdpbf16ps adds pairs of products first";
  for (int64_t E : {3, 8, 12, 16, 20}) {
    const int64_t T = 23, H = 4096 + 8 + 3, k = 2;
    auto x = randomBf16(T * H, 5, 1.0f), gate = randomBf16(E * H, 6, 0.05f);
    std::vector<float> logits[2];
    for (int v = 0; v < 2; ++v) {
      std::vector<float> weights(T * k);
      std::vector<int32_t> ids(T * k), rows(T * k);
      std::vector<int64_t> offsets(E + 1);
      std::vector<uint16_t> out(T * k * H);
      logits[v].assign(T * E, 0);
      routeAndDispatchBf16(x.data(), T, H, gate.data(), E, k, weights.data(), ids.data(),
                           rows.data(), offsets.data(), out.data(), logits[v].data(),
                           v ? DispatchKernel::Scalar : DispatchKernel::Auto);
    }
    EXPECT_EQ(std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * 4), 0)
        << "E " << E;
  }
}

TEST(DispatchTest, RejectsBadTopK) {
  std::vector<uint16_t> x(8), gate(16);
  std::vector<float> w(8);
  std::vector<int32_t> ids(8), rows(8);
  std::vector<int64_t> offsets(3);
  std::vector<uint16_t> out(64);
  EXPECT_THROW(routeAndDispatchBf16(x.data(), 1, 8, gate.data(), 2, 3, w.data(), ids.data(),
                                    rows.data(), offsets.data(), out.data()),
               InputError);
  EXPECT_THROW(routeAndDispatchBf16(x.data(), 1, 8, gate.data(), 2, 0, w.data(), ids.data(),
                                    rows.data(), offsets.data(), out.data()),
               InputError);
}
