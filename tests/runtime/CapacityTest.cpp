// Units of the capacity-limited expert kernels (runtime/src/cpu/Capacity.cpp):
// dispatch + expert_ffn + combine against cpu::experts when nothing drops
// (whole batch, row parts, and two simulated expert-parallel ranks with the
// all_to_all done by hand), and the drop policy on a hand-computed case.
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Kernels.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

using namespace moert;
using namespace moert::cpu;

namespace {

std::vector<float> randomVector(size_t n, std::mt19937 &rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float &x : v)
    x = dist(rng);
  return v;
}

/// Runs a test body with `threads` pool threads, restoring the old count.
struct ThreadCount {
  int old;
  explicit ThreadCount(int threads) : old(numThreads()) { setNumThreads(threads); }
  ~ThreadCount() { setNumThreads(old); }
};

/// E random f32 experts of hidden H and intermediate I.
struct Experts {
  std::vector<std::vector<float>> storage;
  std::vector<Matrix> gate, up, down;
  Experts(int64_t E, int64_t H, int64_t I, std::mt19937 &rng) {
    storage.reserve(3 * E);
    for (int64_t e = 0; e < E; ++e) {
      gate.push_back(matrix(I, H, rng));
      up.push_back(matrix(I, H, rng));
      down.push_back(matrix(H, I, rng));
    }
  }
  Matrix matrix(int64_t rows, int64_t cols, std::mt19937 &rng) {
    storage.push_back(randomVector(rows * cols, rng, 1.0f / std::sqrt(float(cols))));
    Matrix m;
    m.dtype = DType::F32;
    m.data = storage.back().data();
    m.rows = rows;
    m.cols = cols;
    m.rowStride = cols;
    return m;
  }
};

/// k distinct random experts per token and random positive weights.
void randomRouting(int64_t T, int64_t k, int64_t E, std::mt19937 &rng, std::vector<int32_t> &ids,
                   std::vector<float> &weights) {
  ids.resize(T * k);
  weights = randomVector(T * k, rng);
  std::vector<int32_t> all(E);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::copy_n(all.begin(), k, ids.begin() + t * k);
    for (int64_t j = 0; j < k; ++j)
      weights[t * k + j] = std::fabs(weights[t * k + j]) + 0.1f;
  }
}

float maxAbsDiff(const std::vector<float> &a, const std::vector<float> &b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

/// dispatch + expert_ffn + combine of one rank holding every expert.
std::vector<float> capacityExperts(const std::vector<float> &x, int64_t T, int64_t H,
                                   const std::vector<int32_t> &ids,
                                   const std::vector<float> &weights, int64_t k,
                                   const Experts &experts, const DispatchParams &params,
                                   int64_t part, Activation act) {
  const int64_t E = params.numExperts, C = params.capacity;
  std::vector<float> buf(E * C * H, 0.0f), y(E * C * H, 0.0f), out(T * H, 555.0f);
  std::vector<int32_t> counts(E), slots(T * k);
  dispatch(x.data(), T, H, ids.data(), k, params, part, buf.data(), counts.data(), slots.data());
  expertFfn(buf.data(), counts.data(), 1, E, C, H, experts.gate, experts.up, experts.down, act,
            y.data());
  combine(y.data(), H, slots.data(), weights.data(), T, k, out.data());
  return out;
}

} // namespace

TEST(CapacityTest, StepCapacity) {
  EXPECT_EQ(stepCapacity(0.0, 37, 2, 8, 512), 37);       // dropless: T
  EXPECT_EQ(stepCapacity(0.5, 6, 2, 2, 100), 3);         // ceil(0.5 * 6 * 2 / 2)
  EXPECT_EQ(stepCapacity(1.25, 10, 2, 8, 100), 4);       // ceil(3.125)
  EXPECT_EQ(stepCapacity(8.0, 5, 2, 2, 100), 5);         // at most T
  EXPECT_EQ(stepCapacity(1.0, 512, 2, 8, 100), 100);     // at most C
  EXPECT_EQ(stepCapacity(1.0, 0, 2, 8, 100), 0);         // an empty batch
}

// Dropless (C = T): exactly cpu::experts, for the whole batch and for two
// row parts whose outputs add up to it.
TEST(CapacityTest, DroplessMatchesExperts) {
  ThreadCount pool(2);
  std::mt19937 rng(3);
  const int64_t E = 5, H = 24, I = 40, T = 37, k = 2;
  Experts experts(E, H, I, rng);
  std::vector<float> x = randomVector(T * H, rng), weights;
  std::vector<int32_t> ids;
  randomRouting(T, k, E, rng, ids, weights);
  for (Activation act : {Activation::Silu, Activation::GeluTanh}) {
    std::vector<float> ref(T * H);
    cpu::experts(x.data(), T, H, weights.data(), ids.data(), k, experts.gate, experts.up,
                 experts.down, act, ref.data());

    DispatchParams whole{E, stepCapacity(0.0, T, k, E, INT64_MAX), k, 0.0, 1, 1};
    std::vector<float> out = capacityExperts(x, T, H, ids, weights, k, experts, whole, 0, act);
    EXPECT_LE(maxAbsDiff(out, ref), 1e-5f);

    DispatchParams halves = whole;
    halves.rowParts = 2;
    std::vector<float> a = capacityExperts(x, T, H, ids, weights, k, experts, halves, 0, act);
    std::vector<float> b = capacityExperts(x, T, H, ids, weights, k, experts, halves, 1, act);
    for (int64_t t = 0; t < T; ++t) // rows outside a part are 0
      for (int64_t c = 0; c < H; ++c)
        ASSERT_EQ((t < T / 2 ? b : a)[t * H + c], 0.0f) << "t=" << t;
    std::vector<float> sum(T * H);
    for (int64_t i = 0; i < T * H; ++i)
      sum[i] = a[i] + b[i];
    EXPECT_LE(maxAbsDiff(sum, ref), 1e-5f);
  }
}

// Two expert-parallel ranks (El = 2 of E = 4 each), each with its own
// tokens: dispatch, the all_to_all by hand, expert_ffn over two sources,
// the all_to_all back, combine; each rank's output is cpu::experts of its
// tokens.
TEST(CapacityTest, TwoExpertParallelRanks) {
  ThreadCount pool(2);
  std::mt19937 rng(5);
  const int64_t E = 4, El = 2, H = 16, I = 24, k = 2, n = 2;
  const int64_t tokens[n] = {9, 14};
  const int64_t C = stepCapacity(0.0, 14, k, E, INT64_MAX); // c(max_batch_tokens)
  Experts experts(E, H, I, rng);
  const Activation act = Activation::Silu;

  std::vector<float> x[n], weights[n], buf[n], bufIn[n], y[n], yBack[n];
  std::vector<int32_t> ids[n], counts[n], countsIn[n], slots[n];
  for (int64_t r = 0; r < n; ++r) {
    x[r] = randomVector(tokens[r] * H, rng);
    randomRouting(tokens[r], k, E, rng, ids[r], weights[r]);
    buf[r].assign(E * C * H, 0.0f);
    counts[r].assign(E, 0);
    slots[r].assign(tokens[r] * k, 0);
    DispatchParams p{E, C, k, 0.0, 1, 1};
    dispatch(x[r].data(), tokens[r], H, ids[r].data(), k, p, 0, buf[r].data(), counts[r].data(),
             slots[r].data());
  }
  // all_to_all: chunk m of source q (experts m*El..) lands at chunk q of m.
  for (int64_t m = 0; m < n; ++m) {
    bufIn[m].assign(E * C * H, 0.0f);
    countsIn[m].assign(E, 0);
    for (int64_t q = 0; q < n; ++q)
      for (int64_t l = 0; l < El; ++l) {
        int64_t e = m * El + l, into = q * El + l;
        countsIn[m][into] = counts[q][e];
        std::copy_n(buf[q].begin() + e * C * H, counts[q][e] * H, bufIn[m].begin() + into * C * H);
      }
  }
  for (int64_t m = 0; m < n; ++m) {
    std::vector<Matrix> g(experts.gate.begin() + m * El, experts.gate.begin() + (m + 1) * El);
    std::vector<Matrix> u(experts.up.begin() + m * El, experts.up.begin() + (m + 1) * El);
    std::vector<Matrix> d(experts.down.begin() + m * El, experts.down.begin() + (m + 1) * El);
    y[m].assign(E * C * H, 0.0f);
    expertFfn(bufIn[m].data(), countsIn[m].data(), n, El, C, H, g, u, d, act, y[m].data());
  }
  // ... and back: chunk q of m returns to source q as its experts m*El...
  for (int64_t q = 0; q < n; ++q) {
    yBack[q].assign(E * C * H, 0.0f);
    for (int64_t m = 0; m < n; ++m)
      for (int64_t l = 0; l < El; ++l)
        std::copy_n(y[m].begin() + (q * El + l) * C * H, countsIn[m][q * El + l] * H,
                    yBack[q].begin() + (m * El + l) * C * H);
  }
  for (int64_t r = 0; r < n; ++r) {
    std::vector<float> out(tokens[r] * H), ref(tokens[r] * H);
    combine(yBack[r].data(), H, slots[r].data(), weights[r].data(), tokens[r], k, out.data());
    cpu::experts(x[r].data(), tokens[r], H, weights[r].data(), ids[r].data(), k, experts.gate,
                 experts.up, experts.down, act, ref.data());
    EXPECT_LE(maxAbsDiff(out, ref), 1e-5f) << "rank " << r;
  }
}

// T = 6, k = 2, E = 3, cf = 0.5: c = ceil(0.5 * 6 * 2 / 3) = 2 (C = 4, the
// capacity of a 12-token batch). In (t, j) order:
//   e0: t0 (kept, n0), t1 (kept, n1), t2 dropped, t5 dropped
//   e1: t0 (kept, n0), t1 (kept, n1), t3 dropped, t4 dropped
//   e2: t2 (kept, n0), t3 (kept, n1), t4 dropped, t5 dropped
// so t2 keeps only j = 1, t3 only j = 0, t4 and t5 nothing.
TEST(CapacityTest, DropPolicy) {
  const int64_t T = 6, k = 2, E = 3, H = 2, C = 4;
  EXPECT_EQ(stepCapacity(0.5, 12, k, E, INT64_MAX), C);
  const std::vector<int32_t> ids = {0, 1, 0, 1, 0, 2, 2, 1, 1, 2, 2, 0};
  std::vector<float> x(T * H);
  for (int64_t i = 0; i < T * H; ++i)
    x[i] = static_cast<float>(i);
  DispatchParams p{E, C, k, 0.5, 1, 1};
  std::vector<float> buf(E * C * H, -1.0f);
  std::vector<int32_t> counts(E), slots(T * k);
  dispatch(x.data(), T, H, ids.data(), k, p, 0, buf.data(), counts.data(), slots.data());
  EXPECT_EQ(counts, (std::vector<int32_t>{2, 2, 2}));
  EXPECT_EQ(slots, (std::vector<int32_t>{0, 4, 1, 5, -1, 8, 9, -1, -1, -1, -1, -1}));
  // Rows land in (t, j) order: e0 = t0, t1; e1 = t0, t1; e2 = t2, t3.
  const int64_t rowOf[E][2] = {{0, 1}, {0, 1}, {2, 3}};
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t c = 0; c < H; ++c)
        EXPECT_EQ(buf[(e * C + n) * H + c], x[rowOf[e][n] * H + c]) << "e=" << e << " n=" << n;

  // Combine: a token's dropped assignments contribute nothing (no
  // renormalisation); t4 and t5 get 0.
  std::vector<float> y(E * C * H), weights(T * k), out(T * H);
  for (int64_t i = 0; i < E * C * H; ++i)
    y[i] = static_cast<float>(i % 7 + 1);
  for (int64_t i = 0; i < T * k; ++i)
    weights[i] = 0.25f * static_cast<float>(i + 1);
  combine(y.data(), H, slots.data(), weights.data(), T, k, out.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < H; ++c) {
      float want = 0;
      for (int64_t j = 0; j < k; ++j)
        if (slots[t * k + j] >= 0)
          want += weights[t * k + j] * y[slots[t * k + j] * H + c];
      EXPECT_EQ(out[t * H + c], want);
      if (t >= 4)
        EXPECT_EQ(out[t * H + c], 0.0f);
    }

  // Two row parts ([0, 3) and [3, 6)): keep decisions over all rows, slots
  // and counts only of the part's own rows.
  p.rowParts = 2;
  dispatch(x.data(), T, H, ids.data(), k, p, 0, buf.data(), counts.data(), slots.data());
  EXPECT_EQ(counts, (std::vector<int32_t>{2, 2, 1}));
  EXPECT_EQ(slots, (std::vector<int32_t>{0, 4, 1, 5, -1, 8, -1, -1, -1, -1, -1, -1}));
  dispatch(x.data(), T, H, ids.data(), k, p, 1, buf.data(), counts.data(), slots.data());
  EXPECT_EQ(counts, (std::vector<int32_t>{0, 0, 1}));
  EXPECT_EQ(slots, (std::vector<int32_t>{-1, -1, -1, -1, -1, -1, 8, -1, -1, -1, -1, -1}));
  EXPECT_EQ(buf[8 * H], x[3 * H]);
}

TEST(CapacityTest, BadInputsThrow) {
  const int64_t H = 2, k = 1;
  std::vector<float> x(4 * H), buf(8 * H);
  std::vector<int32_t> ids = {0, 5, 1, 0}, counts(2), slots(4);
  DispatchParams p{2, 4, 1, 0.0, 1, 1};
  EXPECT_THROW(dispatch(x.data(), 4, H, ids.data(), k, p, 0, buf.data(), counts.data(),
                        slots.data()),
               RuntimeError);
  counts = {5, 0}; // more rows than the capacity
  std::vector<float> y(8 * H);
  std::vector<float> w(2 * H * H);
  Matrix m{DType::F32, w.data(), H, H, H};
  EXPECT_THROW(expertFfn(buf.data(), counts.data(), 1, 2, 4, H, {m, m}, {m, m}, {m, m},
                         Activation::Silu, y.data()),
               RuntimeError);
}
