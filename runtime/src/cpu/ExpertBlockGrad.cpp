// The backward kernels of the partitioned experts (moe.combine_grad,
// moe.expert_ffn_grad, moe.dispatch_grad; MoEGradientOps.td): the
// transposes of combine, expert_ffn and dispatch over per-expert blocks, so
// that expert parallelism exchanges gradient blocks as the forward
// exchanged activations.
#include "GradientUtil.h"
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Gradients.h"
#include "moert/cpu/Optimizer.h"

#include <algorithm>

namespace moert::cpu {
namespace {

std::vector<float> &blockGradErrors() {
  thread_local std::vector<float> errors;
  return errors;
}
std::vector<float> &blockGradPart() {
  thread_local std::vector<float> part;
  return part;
}

} // namespace

void combineGrad(const float *dy, int64_t H, const float *outputs, const int32_t *slots,
                 const float *weights, int64_t T, int64_t k, float *doutputs, float *dweights) {
  parallelFor(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float *g = dy + t * H;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t p = t * k + j, slot = slots[p];
        if (slot < 0) {
          dweights[p] = 0;
          continue;
        }
        const float *y = outputs + slot * H;
        float *d = doutputs + slot * H;
        const float w = weights[p];
        double dot = 0;
        for (int64_t c = 0; c < H; ++c) {
          dot += static_cast<double>(g[c]) * y[c];
          d[c] = w * g[c];
        }
        dweights[p] = static_cast<float>(dot);
      }
    }
  }, 16);
}

void expertFfnGrad(const float *dout, const float *buf, const int32_t *counts, int64_t sources,
                   int64_t El, int64_t C, int64_t H, const std::vector<Matrix> &gate,
                   const std::vector<Matrix> &up, const std::vector<Matrix> &down,
                   Activation act, float *dbuf, float *dgate, float *dup, float *ddown,
                   float *egate, float *eup, float *edown, bool addIntoSums) {
  using namespace grad;
  if (static_cast<int64_t>(gate.size()) != El || static_cast<int64_t>(up.size()) != El ||
      static_cast<int64_t>(down.size()) != El)
    runtimeError("expert_ffn_grad: {} gate, {} up and {} down matrices for {} experts",
                 gate.size(), up.size(), down.size(), El);
  for (int64_t b = 0; b < sources * El; ++b)
    if (counts[b] < 0 || counts[b] > C)
      runtimeError("expert_ffn_grad: {} rows for expert {} of source {} (capacity {})",
                   counts[b], b % El, b / El, C);
  // Per local expert and source: the source's rows through mlp_grad (the
  // bits of the expert's gradient on that source's tokens alone, as one
  // rank computes a micro-batch's), its weight gradients added in source
  // order (compensated: each sum is the rounding of the exact one where
  // one rank's compensated accumulation of micro-batches gives it too).
  for (int64_t l = 0; l < El; ++l) {
    const int64_t I = gate[l].rows;
    if (gate[l].cols != H || down[l].rows != H)
      runtimeError("expert_ffn_grad: expert {} does not map {} features to {}", l, H, H);
    float *dg = dgate + l * I * H, *du = dup + l * I * H, *dd = ddown + l * H * I;
    const int64_t sizes[3] = {I * H, I * H, H * I};
    float *sums[3] = {dg, du, dd};
    if (egate) {
      // Gradient sums: each source's gradients added into them in order,
      // their errors kept (the optimizer adds them back once).
      float *errs[3] = {egate + l * I * H, eup + l * I * H, edown + l * H * I};
      if (!addIntoSums)
        for (int i = 0; i < 3; ++i) {
          std::fill(sums[i], sums[i] + sizes[i], 0.0f);
          std::fill(errs[i], errs[i] + sizes[i], 0.0f);
        }
      std::vector<float> &part = blockGradPart();
      part.resize(static_cast<size_t>(3 * I * H));
      float *parts[3] = {part.data(), part.data() + I * H, part.data() + 2 * I * H};
      for (int64_t q = 0; q < sources; ++q) {
        const int64_t n = counts[q * El + l], block = (q * El + l) * C * H;
        if (n == 0)
          continue;
        mlpBackwardRecomputed(dout + block, buf + block, n, gate[l], up[l], down[l], act,
                              dbuf + block, parts[0], parts[1], parts[2]);
        for (int i = 0; i < 3; ++i)
          accumulate(parts[i], sums[i], errs[i], sizes[i]);
      }
      continue;
    }
    // The first source with rows writes the sums (0 plus them is them, with
    // no error); the errors exist from a second one on.
    std::vector<float> &errors = blockGradErrors();
    bool any = false, compensated = false;
    for (int64_t q = 0; q < sources; ++q) {
      const int64_t n = counts[q * El + l], block = (q * El + l) * C * H;
      if (n == 0)
        continue;
      if (!any) {
        mlpBackwardRecomputed(dout + block, buf + block, n, gate[l], up[l], down[l], act,
                              dbuf + block, dg, du, dd);
        any = true;
        continue;
      }
      if (!compensated) {
        errors.assign(static_cast<size_t>(3 * I * H), 0.0f);
        compensated = true;
      }
      std::vector<float> &part = blockGradPart();
      part.resize(static_cast<size_t>(3 * I * H));
      float *parts[3] = {part.data(), part.data() + I * H, part.data() + 2 * I * H};
      mlpBackwardRecomputed(dout + block, buf + block, n, gate[l], up[l], down[l], act,
                            dbuf + block, parts[0], parts[1], parts[2]);
      for (int i = 0; i < 3; ++i)
        accumulate(parts[i], sums[i], errors.data() + i * I * H, sizes[i]);
    }
    for (int i = 0; i < 3; ++i) {
      if (!any)
        std::fill(sums[i], sums[i] + sizes[i], 0.0f);
      else if (compensated)
        addCompensation(sums[i], errors.data() + i * I * H, sizes[i]);
    }
  }
}

void dispatchGrad(const float *dbuf, int64_t H, const int32_t *slots, int64_t T, int64_t k,
                  float *dx) {
  parallelFor(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float *o = dx + t * H;
      std::fill(o, o + H, 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t slot = slots[t * k + j];
        if (slot < 0)
          continue;
        const float *g = dbuf + slot * H;
        for (int64_t c = 0; c < H; ++c)
          o[c] += g[c];
      }
    }
  }, 16);
}

} // namespace moert::cpu
