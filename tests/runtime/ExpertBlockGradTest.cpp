// The partitioned experts' backward kernels (moe.combine_grad,
// moe.expert_ffn_grad, moe.dispatch_grad over per-expert blocks) and the
// vocabulary-parallel cross-entropy (moe.vocab_stats,
// moe.cross_entropy_of_stats, cross_entropy_grad of a part), against the
// whole-tensor kernels one rank runs: what expert and tensor parallelism
// compute must be one rank's gradients (bit for bit where the kernels
// promise it). Run at every ISA level.
#include "GradientCheck.h"
#include "moert/cpu/Gradients.h"
#include "moert/cpu/Kernels.h"
#include "moert/cpu/Optimizer.h"

#include <gtest/gtest.h>

#include <cstring>

using namespace moert;
using namespace moert::gradcheck;

namespace {

constexpr int64_t T = 6, H = 8, I = 4, E = 4, k = 2;

std::vector<cpu::Matrix> stack(const std::vector<float> &s, int64_t rows, int64_t cols) {
  std::vector<cpu::Matrix> out;
  for (int64_t e = 0; e < E; ++e) {
    out.push_back(matrixOf(std::vector<float>(), rows, cols));
    out.back().data = s.data() + e * rows * cols;
  }
  return out;
}

/// One source's lowered forward and backward of rows [t0, t0 + n) in the
/// blocks of source q of two (the layout expert_ffn reads: [q, l, C, H]).
struct Source {
  std::vector<float> buf, out;
  std::vector<int32_t> counts, slots;
};

bool same(const std::vector<float> &a, const float *b, size_t n) {
  return std::memcmp(a.data(), b, n * sizeof(float)) == 0;
}

} // namespace

TEST(ExpertBlockGradTest, BlocksGiveOneRanksGradientsBitForBit) {
  const std::vector<int32_t> sel = {0, 1, 2, 0, 1, 3, 3, 2, 0, 2, 1, 0}; // [T, k]
  std::vector<float> x = randomValues(T * H, 40), w = randomValues(T * k, 41),
                     dy = randomValues(T * H, 42);
  std::vector<float> g = randomValues(E * I * H, 43), u = randomValues(E * I * H, 44),
                     d = randomValues(E * H * I, 45);
  const auto gate = stack(g, I, H), up = stack(u, I, H), down = stack(d, H, I);
  // Two replicas' micro-batches (rows [0, 3) and [3, 6)), each dispatched
  // into its own blocks, as two sources of one rank holding every expert.
  const int64_t n = T / 2, C = n;
  cpu::DispatchParams p;
  p.numExperts = E;
  p.capacity = C;
  p.topK = k;
  std::vector<float> blocks(2 * E * C * H, 0.0f), outputs(2 * E * C * H, 0.0f);
  std::vector<int32_t> counts(2 * E), slots(T * k);
  for (int64_t q = 0; q < 2; ++q)
    cpu::dispatch(x.data() + q * n * H, n, H, sel.data() + q * n * k, k, p, 0,
                  blocks.data() + q * E * C * H, counts.data() + q * E, slots.data() + q * n * k);
  cpu::expertFfn(blocks.data(), counts.data(), 2, E, C, H, gate, up, down,
                 cpu::Activation::Silu, outputs.data(), /*training=*/true);
  std::vector<float> dout(2 * E * C * H, 0.0f), dbuf(2 * E * C * H, 0.0f), dw(T * k), dx(T * H);
  for (int64_t q = 0; q < 2; ++q) {
    // The forward: as one rank's experts (its saving arithmetic, its order).
    std::vector<float> y(n * H), yOne(n * H);
    cpu::combine(outputs.data() + q * E * C * H, H, slots.data() + q * n * k,
                 w.data() + q * n * k, n, k, y.data(), /*expertOrder=*/true);
    static const cpu::ExpertsSaved kNothingKept;
    cpu::experts(x.data() + q * n * H, n, H, w.data() + q * n * k, sel.data() + q * n * k, k,
                 gate, up, down, cpu::Activation::Silu, yOne.data(), &kNothingKept);
    EXPECT_TRUE(same(y, yOne.data(), y.size())) << "forward of source " << q;
    cpu::combineGrad(dy.data() + q * n * H, H, outputs.data() + q * E * C * H,
                     slots.data() + q * n * k, w.data() + q * n * k, n, k,
                     dout.data() + q * E * C * H, dw.data() + q * n * k);
  }
  std::vector<float> dg(E * I * H), du(E * I * H), dd(E * H * I);
  cpu::expertFfnGrad(dout.data(), blocks.data(), counts.data(), 2, E, C, H, gate, up, down,
                     cpu::Activation::Silu, dbuf.data(), dg.data(), du.data(), dd.data());
  for (int64_t q = 0; q < 2; ++q)
    cpu::dispatchGrad(dbuf.data() + q * E * C * H, H, slots.data() + q * n * k, n, k,
                      dx.data() + q * n * H);
  // One rank: each micro-batch's experts_grad from what its experts_saved
  // kept (the default, --recompute none), the weight gradients added (two
  // terms: the compensated sum is their rounded sum).
  std::vector<float> dxOne(T * H), dwOne(T * k), sums[3] = {std::vector<float>(E * I * H, 0.0f),
                                                          std::vector<float>(E * I * H, 0.0f),
                                                          std::vector<float>(E * H * I, 0.0f)};
  for (int64_t q = 0; q < 2; ++q) {
    std::vector<float> pg(E * I * H), pu(E * I * H), pd(E * H * I);
    std::vector<float> y(n * H), sg(n * k * I), su(n * k * I), so(n * k * H);
    const cpu::ExpertsSaved saved{sg.data(), su.data(), so.data()};
    cpu::experts(x.data() + q * n * H, n, H, w.data() + q * n * k, sel.data() + q * n * k, k,
                 gate, up, down, cpu::Activation::Silu, y.data(), &saved);
    cpu::expertsGrad(dy.data() + q * n * H, x.data() + q * n * H, n, H, w.data() + q * n * k,
                     sel.data() + q * n * k, k, gate, up, down, cpu::Activation::Silu,
                     dxOne.data() + q * n * H, dwOne.data() + q * n * k, pg.data(), pu.data(),
                     pd.data(), sg.data(), su.data(), so.data());
    for (size_t i = 0; i < pg.size(); ++i) {
      sums[0][i] += pg[i];
      sums[1][i] += pu[i];
      sums[2][i] += pd[i];
    }
  }
  EXPECT_TRUE(same(dxOne, dx.data(), dx.size())) << "dx";
  EXPECT_TRUE(same(dwOne, dw.data(), dw.size())) << "dweights";
  EXPECT_TRUE(same(sums[0], dg.data(), dg.size())) << "dgate";
  EXPECT_TRUE(same(sums[1], du.data(), du.size())) << "dup";
  EXPECT_TRUE(same(sums[2], dd.data(), dd.size())) << "ddown";
  // Expert 3 got rows of source 1 only, expert 1 of both: an expert no row
  // reached would be exactly 0 (a source's empty block adds nothing).
  std::vector<int32_t> none(2 * E, 0);
  cpu::expertFfnGrad(dout.data(), blocks.data(), none.data(), 2, E, C, H, gate, up, down,
                     cpu::Activation::Silu, dbuf.data(), dg.data(), du.data(), dd.data());
  for (float v : dg)
    ASSERT_EQ(v, 0.0f);
}

// With errors, expert_ffn_grad's weight gradients are compensated sums:
// each source's gradients (as the op computes one source alone) added in
// source order by accumulate into the given sums and errors (`add`: a
// train program's gradient sums, as one rank's micro-batches are added),
// or into zeros; rounded once, the latter is the op's sum without errors.
TEST(ExpertBlockGradTest, CompensatedSumsCarryEachSourcesError) {
  const int64_t C = 3, sources = 2, block = E * C * H;
  std::vector<float> dout = randomValues(sources * block, 50),
                     blocks = randomValues(sources * block, 51);
  const std::vector<int32_t> counts = {3, 0, 2, 1, 1, 3, 0, 2}; // [source, expert]
  std::vector<float> g = randomValues(E * I * H, 52), u = randomValues(E * I * H, 53),
                     d = randomValues(E * H * I, 54);
  const auto gate = stack(g, I, H), up = stack(u, I, H), down = stack(d, H, I);
  const int64_t n = E * I * H; // each of the three stacks' gradient
  auto fill = [&](uint64_t seed) {
    std::vector<std::vector<float>> v;
    for (int i = 0; i < 3; ++i)
      v.push_back(randomValues(n, seed + i));
    return v;
  };
  // Each source alone.
  std::vector<std::vector<float>> parts[2];
  std::vector<float> dbuf(sources * block);
  for (int64_t q = 0; q < sources; ++q) {
    parts[q] = fill(60);
    cpu::expertFfnGrad(dout.data() + q * block, blocks.data() + q * block, counts.data() + q * E,
                       1, E, C, H, gate, up, down, cpu::Activation::Silu, dbuf.data() + q * block,
                       parts[q][0].data(), parts[q][1].data(), parts[q][2].data());
  }
  for (bool add : {true, false}) {
    // The reference: accumulate's compensated sums of the sources in order,
    // from the sums given (add) or from zeros.
    std::vector<std::vector<float>> sums = add ? fill(70) : std::vector<std::vector<float>>(
                                                                3, std::vector<float>(n, 0.0f)),
                                    errs = add ? fill(80) : sums;
    if (add)
      for (auto &e : errs)
        for (float &v : e)
          v *= 1e-8f;
    std::vector<std::vector<float>> gotSums = add ? sums : fill(90), gotErrs = add ? errs : fill(93);
    for (int64_t q = 0; q < sources; ++q)
      for (int i = 0; i < 3; ++i)
        cpu::accumulate(parts[q][i].data(), sums[i].data(), errs[i].data(), n);
    std::vector<float> gotBuf(sources * block);
    cpu::expertFfnGrad(dout.data(), blocks.data(), counts.data(), sources, E, C, H, gate, up, down,
                       cpu::Activation::Silu, gotBuf.data(), gotSums[0].data(), gotSums[1].data(),
                       gotSums[2].data(), gotErrs[0].data(), gotErrs[1].data(), gotErrs[2].data(),
                       add);
    EXPECT_TRUE(same(dbuf, gotBuf.data(), dbuf.size())) << "dbuf, add " << add;
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(same(sums[i], gotSums[i].data(), n)) << "sum " << i << ", add " << add;
      EXPECT_TRUE(same(errs[i], gotErrs[i].data(), n)) << "error " << i << ", add " << add;
    }
    if (add)
      continue;
    // Rounded once: the op's own compensated sum, without errors.
    std::vector<float> dg(n), du(n), dd(n);
    cpu::expertFfnGrad(dout.data(), blocks.data(), counts.data(), sources, E, C, H, gate, up, down,
                       cpu::Activation::Silu, gotBuf.data(), dg.data(), du.data(), dd.data());
    const float *rounded[3] = {dg.data(), du.data(), dd.data()};
    for (int i = 0; i < 3; ++i) {
      cpu::addCompensation(gotSums[i].data(), gotErrs[i].data(), n);
      EXPECT_TRUE(same(gotSums[i], rounded[i], n)) << "rounded sum " << i;
    }
  }
}

TEST(ExpertBlockGradTest, VocabularyParallelCrossEntropyIsTheWholeOnes) {
  // A vocabulary of 11 padded to 16 over 2 parts of 8 (the second holds 3
  // real columns); labels in both parts, one row ignored.
  const int64_t V = 11, W = 8, parts = 2;
  const std::vector<int32_t> labels = {3, 9, -100, 10, 0, 7};
  std::vector<float> logits = randomValues(T * V, 50, 3.0f);
  float ce[2];
  cpu::crossEntropy(logits.data(), T, V, V, labels.data(), ce);
  std::vector<float> padded(parts * T * W, 0.0f), stats(T * 4 * parts);
  for (int64_t q = 0; q < parts; ++q) {
    std::vector<float> part(T * W, 0.0f);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < W && q * W + c < V; ++c)
        part[t * W + c] = logits[t * V + q * W + c];
    std::copy(part.begin(), part.end(), padded.begin() + q * T * W);
    std::vector<float> own(T * 4);
    cpu::vocabStats(part.data(), T, W, std::min<int64_t>(W, V - q * W), q * W, labels.data(),
                    own.data());
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(own.data() + 4 * t, 4, stats.data() + t * 4 * parts + 4 * q);
  }
  float parted[2];
  cpu::crossEntropyOfStats(stats.data(), T, parts, V, labels.data(), parted);
  EXPECT_NEAR(parted[0], ce[0], 1e-6 * std::abs(ce[0]));
  EXPECT_EQ(parted[1], ce[1]);
  // The gradient of each part: the whole one's columns (0 in the padding).
  std::vector<float> whole(T * V);
  cpu::crossEntropyGrad(logits.data(), T, V, V, labels.data(), ce, whole.data());
  for (int64_t q = 0; q < parts; ++q) {
    std::vector<float> grad(T * W, 1.0f);
    cpu::crossEntropyGradPart(padded.data() + q * T * W, T, W, std::min<int64_t>(W, V - q * W),
                              q * W, V, labels.data(), ce, stats.data(), parts, grad.data());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < W; ++c) {
        const float want = q * W + c < V ? whole[t * V + q * W + c] : 0.0f;
        EXPECT_NEAR(grad[t * W + c], want, 1e-7f) << "row " << t << " column " << q * W + c;
      }
  }
}
