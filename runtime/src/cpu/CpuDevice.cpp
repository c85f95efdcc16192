// The CPU driver: runs a validated plan's steps with the kernels of
// moert/cpu/Kernels.h. Activations are f32 buffers of max_batch_tokens rows;
// weights are views into the mmapped checkpoint.
#include "moert/Device.h"
#include "moert/Error.h"
#include "moert/cpu/Kernels.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <map>

namespace moert {
namespace {

struct BoundWeight {
  TensorView view;                  // plain weight
  std::vector<cpu::Matrix> experts; // expert stack: one matrix per expert
};

class CpuDevice final : public Device {
public:
  std::string name() const override { return "cpu"; }

  void prepare(const Plan &plan, int64_t rankIndex, const Checkpoint &ckpt) override {
    this->plan = &plan;
    rank = &plan.ranks.at(rankIndex);
    // Bind only the weights this rank's steps use.
    std::vector<bool> used(plan.weights.size(), false);
    for (const PlanStep &s : rank->steps)
      for (int64_t w : s.weights)
        used[w] = true;
    weights.assign(plan.weights.size(), {});
    boundBytes = 0;
    for (size_t i = 0; i < plan.weights.size(); ++i) {
      if (!used[i])
        continue;
      const PlanWeight &pw = plan.weights[i];
      // The plan's dtype is part of its memory figures: a checkpoint in
      // another dtype is another model file.
      auto checked = [&](const std::string &name, const std::vector<int64_t> &shape) {
        TensorView v = ckpt.tensor(name, shape);
        if (v.dtype != pw.dtype)
          inputError("{}: tensor '{}': expected dtype {} (the plan's) but found {}",
                     ckpt.fileOf(name), name, dtypeName(pw.dtype), dtypeName(v.dtype));
        return v;
      };
      if (pw.experts == 0) {
        weights[i].view = checked(pw.name, pw.shape);
        boundBytes += weights[i].view.bytes();
        continue;
      }
      for (int64_t e = 0; e < pw.experts; ++e) {
        TensorView v = checked(pw.expertName(e), pw.tensorShape());
        boundBytes += v.bytes();
        weights[i].experts.push_back(cpu::Matrix::of(v));
      }
    }
    buffers.assign(rank->buffers.size(), {});
    allocated = 0;
    for (size_t i = 0; i < rank->buffers.size(); ++i) {
      buffers[i].assign(plan.maxBatchTokens * rank->buffers[i].width, 0.0f);
      allocated += rank->buffers[i].bytes;
    }
    caches.assign(rank->caches.size(), {});
    for (size_t i = 0; i < rank->caches.size(); ++i) {
      caches[i].allocate(plan.maxSequences, plan.maxSeqLen, rank->caches[i].keyWidth,
                         rank->caches[i].valueWidth);
      allocated += rank->caches[i].bytes;
    }
    // Rope tables per distinct parameter set (every layer shares one).
    ropeTables.clear();
    for (const PlanStep &s : rank->steps)
      if (s.op == OpKind::Rope || s.op == OpKind::MLAttention)
        table(s.rope);
  }

  void forward(const Batch &batch, std::vector<float> &logits) override {
    int64_t T = batch.size();
    if (T == 0 || T > plan->maxBatchTokens)
      runtimeError("batch of {} tokens outside [1, {}]", T, plan->maxBatchTokens);
    std::copy(batch.tokens.begin(), batch.tokens.end(), ints(rank->tokensBuffer));
    std::copy(batch.positions.begin(), batch.positions.end(), ints(rank->positionsBuffer));
    cpu::TokenLayout layout{batch.slots.data(), batch.positions.data(), T};
    for (const PlanStep &s : rank->steps) {
      auto start = std::chrono::steady_clock::now();
      run(s, T, layout, batch, logits);
      seconds[static_cast<size_t>(s.op)] +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  }

  std::vector<std::pair<std::string, double>> opSeconds() const override {
    std::vector<std::pair<std::string, double>> out;
    for (size_t i = 0; i < seconds.size(); ++i)
      if (seconds[i] > 0)
        out.emplace_back(opName(static_cast<OpKind>(i)), seconds[i]);
    return out;
  }

  int64_t weightBytes() const override { return boundBytes; }
  int64_t workspaceBytes() const override { return allocated; }

private:
  float *f(int64_t id) { return buffers[id].data(); }
  int32_t *ints(int64_t id) { return reinterpret_cast<int32_t *>(buffers[id].data()); }
  int64_t width(int64_t id) const { return rank->buffers[id].width; }
  const TensorView &w(const PlanStep &s, size_t i) const { return weights[s.weights[i]].view; }
  const TensorView *optional(const PlanStep &s, size_t i) const {
    return s.weights.size() > i ? &weights[s.weights[i]].view : nullptr;
  }

  static bool same(const cpu::RopeParams &a, const cpu::RopeParams &b) {
    return a.kind == b.kind && a.theta == b.theta && a.rotaryDim == b.rotaryDim &&
           a.interleaved == b.interleaved && a.factor == b.factor &&
           a.originalMaxPosition == b.originalMaxPosition &&
           a.lowFreqFactor == b.lowFreqFactor && a.highFreqFactor == b.highFreqFactor &&
           a.betaFast == b.betaFast && a.betaSlow == b.betaSlow && a.mscale == b.mscale &&
           a.mscaleAllDim == b.mscaleAllDim;
  }

  const cpu::RopeTable &table(const cpu::RopeParams &p) {
    for (auto &[params, t] : ropeTables)
      if (same(params, p))
        return *t;
    ropeTables.emplace_back(p, std::make_unique<cpu::RopeTable>(p, plan->maxSeqLen));
    return *ropeTables.back().second;
  }

  void run(const PlanStep &s, int64_t T, const cpu::TokenLayout &layout, const Batch &batch,
           std::vector<float> &logits) {
    switch (s.op) {
    case OpKind::Embedding:
      cpu::embedding(cpu::Matrix::of(w(s, 0)), ints(s.in[0]), T, f(s.out[0]));
      return;
    case OpKind::RMSNorm:
      cpu::rmsNorm(f(s.in[0]), T, width(s.in[0]), w(s, 0), s.eps, f(s.out[0]));
      return;
    case OpKind::LayerNorm:
      cpu::layerNorm(f(s.in[0]), T, width(s.in[0]), w(s, 0), optional(s, 1), s.eps, f(s.out[0]));
      return;
    case OpKind::Linear: {
      cpu::Matrix m = cpu::Matrix::of(w(s, 0));
      if (s.out[0] != rank->logitsBuffer) {
        cpu::linear(f(s.in[0]), T, m, optional(s, 1), f(s.out[0]));
        return;
      }
      // The LM head: only the rows the caller wants (the last prompt token
      // of each sequence when no full logits are asked for).
      int64_t rows = static_cast<int64_t>(batch.logitRows.size());
      gathered.resize(rows * m.cols);
      for (int64_t r = 0; r < rows; ++r)
        std::copy_n(f(s.in[0]) + batch.logitRows[r] * m.cols, m.cols, gathered.data() + r * m.cols);
      logits.resize(rows * m.rows);
      cpu::linear(gathered.data(), rows, m, optional(s, 1), logits.data());
      return;
    }
    case OpKind::Rope: {
      int64_t wd = width(s.in[0]);
      if (s.out[0] != s.in[0])
        std::copy_n(f(s.in[0]), T * wd, f(s.out[0]));
      table(s.rope).apply(f(s.out[0]), T, wd, s.headDim, ints(s.in[1]));
      return;
    }
    case OpKind::Attention: {
      int64_t q = width(s.in[0]), k = width(s.in[1]), v = width(s.in[2]);
      cpu::attention(f(s.in[0]), f(s.in[1]), f(s.in[2]), layout, s.heads, s.kvHeads,
                     q / s.heads, v / s.kvHeads, s.scale, s.slidingWindow, caches[s.kvCache],
                     f(s.out[0]));
      (void)k;
      return;
    }
    case OpKind::MLAttention: {
      int64_t r = width(s.in[2]);
      int64_t nope = width(s.in[0]) / s.heads - r;
      int64_t vdim = width(s.in[1]) / s.heads - nope;
      cpu::mlaAttention(f(s.in[0]), f(s.in[1]), f(s.in[2]), layout, s.heads, nope, r, vdim,
                        s.scale, table(s.rope), caches[s.kvCache], f(s.out[0]));
      return;
    }
    case OpKind::Split: {
      int64_t wd = width(s.in[0]), offset = 0;
      for (size_t i = 0; i < s.out.size(); ++i) {
        int64_t part = s.widths[i];
        float *dst = f(s.out[i]);
        const float *src = f(s.in[0]);
        for (int64_t t = 0; t < T; ++t)
          std::copy_n(src + t * wd + offset, part, dst + t * width(s.out[i]));
        offset += part;
      }
      return;
    }
    case OpKind::Add:
      cpu::add(f(s.in[0]), f(s.in[1]), T * width(s.in[0]), f(s.out[0]));
      return;
    case OpKind::SigmoidGate:
      cpu::sigmoidGate(f(s.in[0]), f(s.in[1]), T, width(s.in[0]), f(s.out[0]));
      return;
    case OpKind::MLP: {
      cpu::Matrix g = cpu::Matrix::of(w(s, 0)), u = cpu::Matrix::of(w(s, 1)),
                  d = cpu::Matrix::of(w(s, 2));
      scratch.resize(2 * T * g.rows);
      cpu::mlp(f(s.in[0]), T, g, u, d, s.activation, scratch.data(), f(s.out[0]));
      return;
    }
    case OpKind::Router: {
      cpu::Matrix g = cpu::Matrix::of(w(s, 0));
      scratch.resize(T * g.rows);
      cpu::linear(f(s.in[0]), T, g, nullptr, scratch.data());
      cpu::route(scratch.data(), T, g.rows, optional(s, 1), s.routing, f(s.out[0]),
                 ints(s.out[1]));
      return;
    }
    case OpKind::Experts:
      cpu::experts(f(s.in[0]), T, width(s.in[0]), f(s.in[1]), ints(s.in[2]), width(s.in[1]),
                   weights[s.weights[0]].experts, weights[s.weights[1]].experts,
                   weights[s.weights[2]].experts, s.activation, f(s.out[0]));
      return;
    }
  }

  const Plan *plan = nullptr;
  const PlanRank *rank = nullptr;
  std::vector<BoundWeight> weights;
  std::vector<std::vector<float>> buffers; // I32 buffers reuse the f32 storage
  std::vector<cpu::KVCache> caches;
  std::vector<std::pair<cpu::RopeParams, std::unique_ptr<cpu::RopeTable>>> ropeTables;
  std::vector<float> scratch, gathered;
  int64_t boundBytes = 0, allocated = 0;
  std::array<double, static_cast<size_t>(OpKind::Experts) + 1> seconds{};
};

} // namespace

std::unique_ptr<Device> createCpuDevice() { return std::make_unique<CpuDevice>(); }

} // namespace moert
