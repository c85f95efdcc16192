// Capacity-limited expert dispatch: the kernels of moe.dispatch,
// moe.expert_ffn and moe.combine (docs/partitioned-execution.md). Together
// they compute what cpu::experts computes, except that assignments past an
// expert's capacity are dropped and the experts' rows can travel between
// ranks (all_to_all) between the three steps.
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace moert::cpu {
namespace {

/// Below this many values copied or multiply-added, a thread's share of
/// work is not worth a hand-off to the pool.
constexpr int64_t kMinWorkPerThread = 1 << 15;

} // namespace

int64_t stepCapacity(double cf, int64_t T, int64_t k, int64_t E, int64_t C) {
  int64_t c = T;
  if (cf > 0) {
    // The ceiling of the double-precision product, in this order, as the
    // compiler computes the static C = c(max_batch_tokens).
    double wanted = cf * static_cast<double>(T) * static_cast<double>(k) / static_cast<double>(E);
    c = std::min<int64_t>(T, static_cast<int64_t>(std::ceil(wanted)));
  }
  return std::max<int64_t>(0, std::min(c, C));
}

void dispatch(const float *x, int64_t T, int64_t H, const int32_t *experts, int64_t k,
              const DispatchParams &params, int64_t part, float *buf, int32_t *counts,
              int32_t *slots) {
  const int64_t E = params.numExperts, C = params.capacity, P = params.rowParts;
  if (part < 0 || part >= P)
    runtimeError("dispatch: row part {} of {}", part, P);
  const int64_t c = stepCapacity(params.capacityFactor, T, k, E, C);
  const int64_t rowBegin = T * part / P, rowEnd = T * (part + 1) / P;

  // Keep decisions over all T rows (so every rank drops what an unsharded
  // run drops); slots only for this part's rows. Serial: T * k steps.
  std::vector<int64_t> seen(static_cast<size_t>(E), 0);
  std::fill_n(counts, E, 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t p = t * k + j, e = experts[p];
      if (e < 0 || e >= E)
        runtimeError("dispatch: token {} routed to expert {} of {}", t, e, E);
      const bool kept = seen[e]++ < c;
      if (kept && t >= rowBegin && t < rowEnd)
        slots[p] = static_cast<int32_t>(e * C + counts[e]++);
      else
        slots[p] = -1;
    }

  // The row copies, split by tokens: every kept slot is a distinct row.
  parallelFor(rowEnd - rowBegin, [&](int64_t i0, int64_t i1) {
    for (int64_t t = rowBegin + i0; t < rowBegin + i1; ++t)
      for (int64_t j = 0; j < k; ++j)
        if (slots[t * k + j] >= 0)
          std::copy_n(x + t * H, H, buf + slots[t * k + j] * H);
  }, std::max<int64_t>(1, kMinWorkPerThread / std::max<int64_t>(1, k * H)));
}

void expertFfn(const float *buf, const int32_t *counts, int64_t sources, int64_t El, int64_t C,
               int64_t H, const std::vector<Matrix> &gate, const std::vector<Matrix> &up,
               const std::vector<Matrix> &down, Activation act, float *y, bool training) {
  if (static_cast<int64_t>(gate.size()) != El || static_cast<int64_t>(up.size()) != El ||
      static_cast<int64_t>(down.size()) != El)
    runtimeError("expert_ffn: {} gate, {} up and {} down matrices for {} experts", gate.size(),
                 up.size(), down.size(), El);
  for (int64_t b = 0; b < sources * El; ++b)
    if (counts[b] < 0 || counts[b] > C)
      runtimeError("expert_ffn: {} rows for expert {} of source {} (capacity {})", counts[b],
                   b % El, b / El, C);

  // Per local expert, the rows of every source as one matrix: one GEMM per
  // projection instead of one per (source, expert) block. With one source
  // the block already is that matrix; else the rows are gathered and the
  // results scattered back to the blocks' rows.
  thread_local std::vector<float> gatheredBuf, resultBuf, scratchBuf;
  std::vector<int64_t> rows(static_cast<size_t>(El), 0);
  int64_t total = 0;
  for (int64_t l = 0; l < El; ++l) {
    if (gate[l].cols != H || down[l].rows != H)
      runtimeError("expert_ffn: expert {} does not map {} features to {}", l, H, H);
    for (int64_t q = 0; q < sources; ++q)
      rows[l] += counts[q * El + l];
    total += rows[l];
  }
  if (sources > 1 && gatheredBuf.size() < static_cast<size_t>(total * H)) {
    gatheredBuf.resize(static_cast<size_t>(total * H));
    resultBuf.resize(static_cast<size_t>(total * H));
  }
  std::vector<ExpertRows> groups;
  if (training) {
    // A training plan's arithmetic (cpu::experts saving its activations),
    // block by block: each source's rows as one rank computes them.
    for (int64_t l = 0; l < El; ++l)
      for (int64_t q = 0; q < sources; ++q)
        if (const int64_t n = counts[q * El + l])
          groups.push_back({&gate[l], &up[l], &down[l], buf + (q * El + l) * C * H,
                            y + (q * El + l) * C * H, n});
    expertMlpsAsTraining(groups, act);
    return;
  }
  for (int64_t l = 0, at = 0; l < El; ++l) {
    if (rows[l] == 0)
      continue;
    if (sources == 1) {
      groups.push_back({&gate[l], &up[l], &down[l], buf + l * C * H, y + l * C * H, rows[l]});
      continue;
    }
    groups.push_back({&gate[l], &up[l], &down[l], gatheredBuf.data() + at * H,
                      resultBuf.data() + at * H, rows[l]});
    for (int64_t q = 0; q < sources; ++q) {
      const int64_t n = counts[q * El + l];
      std::copy_n(buf + (q * El + l) * C * H, n * H, gatheredBuf.data() + at * H);
      at += n;
    }
  }
  if (scratchBuf.size() < static_cast<size_t>(expertMlpsScratch(groups)))
    scratchBuf.resize(static_cast<size_t>(expertMlpsScratch(groups)));
  expertMlps(groups, act, scratchBuf.data());
  if (sources == 1)
    return;
  for (int64_t l = 0, at = 0; l < El; ++l)
    for (int64_t q = 0; q < sources; ++q) {
      const int64_t n = counts[q * El + l];
      std::copy_n(resultBuf.data() + at * H, n * H, y + (q * El + l) * C * H);
      at += n;
    }
}

void combine(const float *y, int64_t H, const int32_t *slots, const float *weights, int64_t T,
             int64_t k, float *out, bool expertOrder) {
  parallelFor(T, [&](int64_t t0, int64_t t1) {
    std::vector<int64_t> order(static_cast<size_t>(k));
    for (int64_t t = t0; t < t1; ++t) {
      float *dst = out + t * H;
      std::fill_n(dst, H, 0.0f);
      for (int64_t j = 0; j < k; ++j)
        order[j] = t * k + j;
      if (expertOrder) // slots e * C + n: ascending is expert order
        std::sort(order.begin(), order.end(),
                  [&](int64_t a, int64_t b) { return slots[a] < slots[b]; });
      for (int64_t p : order) {
        const int64_t slot = slots[p];
        if (slot < 0)
          continue;
        const float w = weights[p];
        const float *src = y + slot * H;
        for (int64_t c = 0; c < H; ++c)
          dst[c] += w * src[c];
      }
    }
  }, std::max<int64_t>(1, kMinWorkPerThread / std::max<int64_t>(1, k * H)));
}

} // namespace moert::cpu
