// The CPU driver: runs one rank's program of a validated plan with the
// kernels of moert/cpu/Kernels.h, its collectives through moert::Comm.
// Activations are f32 buffers (I32 ones share the storage); weights are
// views into the mmapped Hugging Face checkpoint where the rank holds a whole
// tensor, and owned buffers filled with Checkpoint::readBox (pread of just
// the box's bytes, from a Hugging Face or a sharded checkpoint of any
// layout) otherwise.
#include "../Collectives.h"
#include "moert/Device.h"
#include "moert/Error.h"
#include "moert/RankWeights.h"
#include "moert/cpu/Kernels.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unordered_map>

namespace moert {
namespace {

struct BoundWeight {
  TensorView view;                  // plain weight
  std::vector<cpu::Matrix> experts; // expert stack: one matrix per local expert
};

/// What the device holds and its peak, in bytes: weights (owned copies, and
/// views into the checkpoint's mapping counted at their size, so that the
/// figure compares with the plan's predicted weights + activations +
/// kv_cache whatever was copied), activation buffers, KV caches and the
/// device's scratch vectors. Scratch that kernels keep internally (per
/// thread) is not counted.
class MemoryTracker {
public:
  void add(int64_t bytes) {
    current += bytes;
    peak_ = std::max(peak_, current);
  }
  void reset() { current = peak_ = 0; }
  int64_t peak() const { return peak_; }

private:
  int64_t current = 0, peak_ = 0;
};

class CpuDevice final : public Device {
public:
  std::string name() const override { return "cpu"; }

  void prepare(const Plan &plan, int64_t rankIndex, const Checkpoint &ckpt,
               Comm &comm) override {
    this->plan = &plan;
    this->comm = &comm;
    rank = rankIndex;
    coords = plan.ranks.at(rankIndex).coords;
    program = &plan.programOf(rankIndex);
    memory.reset();
    bindWeights(ckpt);

    buffers.assign(program->buffers.size(), {});
    allocated = 0;
    for (size_t i = 0; i < program->buffers.size(); ++i) {
      const PlanBuffer &b = program->buffers[i];
      buffers[i].assign(static_cast<size_t>(b.rows * b.width), 0.0f);
      allocated += b.rows * b.width * 4;
    }
    caches.assign(program->caches.size(), {});
    for (size_t i = 0; i < program->caches.size(); ++i) {
      caches[i].allocate(plan.maxSequences, plan.maxSeqLen, program->caches[i].keyWidth,
                         program->caches[i].valueWidth);
      allocated += static_cast<int64_t>(caches[i].keys.size() + caches[i].values.size()) * 4;
    }
    memory.add(allocated);

    // The collectives (runtime/src/Collectives.h) over host memory.
    collective.plan = &plan;
    collective.program = program;
    collective.rank = rank;
    collective.comm = &comm;
    collective.memory = &hostMemory;
    collective.groups = collectives::groupsOf(plan, rank);
    collective.address = [this](int64_t id) -> void * { return buffers[id].data(); };
    collective.gatherStage = [this](int64_t bytes) -> void * {
      return reserve(gatherStage, (bytes + 3) / 4);
    };
    // Rope tables per distinct parameter set (every layer shares one).
    ropeTables.clear();
    for (const PlanStep &s : program->steps)
      if (s.op == OpKind::Rope || s.op == OpKind::MLAttention)
        table(s.rope);
  }

  void forward(const Batch &batch, std::vector<float> &logits) override {
    const int64_t T = batch.size();
    if (T > plan->maxBatchTokens)
      runtimeError("batch of {} tokens exceeds max_batch_tokens ({})", T, plan->maxBatchTokens);
    if (program->tokensBuffer >= 0)
      std::copy(batch.tokens.begin(), batch.tokens.end(), ints(program->tokensBuffer));
    if (program->positionsBuffer >= 0)
      std::copy(batch.positions.begin(), batch.positions.end(), ints(program->positionsBuffer));
    cpu::TokenLayout layout{batch.slots.data(), batch.positions.data(), T};
    // Rows of every per-token buffer: T, then the logit rows after the head.
    int64_t rows = T;
    for (size_t i = 0; i < program->steps.size(); ++i) {
      const PlanStep &s = program->steps[i];
      auto start = std::chrono::steady_clock::now();
      rows = run(i, s, rows, layout, batch);
      seconds[static_cast<size_t>(s.op)] +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    // The last stage's logits buffer is vocab_size wide (the compiler drops
    // the padding of a sharded head with a split).
    if (program->logitsBuffer >= 0) {
      const float *out = f(program->logitsBuffer);
      logits.assign(out, out + rows * plan->vocabSize);
    }
  }

  std::vector<std::pair<std::string, double>> opSeconds() const override {
    std::vector<std::pair<std::string, double>> out;
    for (size_t i = 0; i < seconds.size(); ++i)
      if (seconds[i] > 0)
        out.emplace_back(opName(static_cast<OpKind>(i)), seconds[i]);
    return out;
  }

  int64_t weightBytes() const override { return rankWeights.boundBytes(); }
  int64_t workspaceBytes() const override { return allocated; }
  int64_t peakBytes() const override { return memory.peak(); }
  int64_t loadedWeightBytes() const override { return rankWeights.loadedBytes(); }

private:
  float *f(int64_t id) { return buffers[id].data(); }
  int32_t *ints(int64_t id) { return reinterpret_cast<int32_t *>(buffers[id].data()); }
  int64_t width(int64_t id) const { return program->buffers[id].width; }
  int64_t bufferRows(int64_t id) const { return program->buffers[id].rows; }
  const TensorView &w(const PlanStep &s, size_t i) const { return weights[s.weights[i]].view; }
  const TensorView *optional(const PlanStep &s, size_t i) const {
    return s.weights.size() > i ? &weights[s.weights[i]].view : nullptr;
  }

  /// `v` grown to at least n elements; growth is counted as memory.
  template <typename T> T *reserve(std::vector<T> &v, int64_t n) {
    size_t before = v.capacity();
    if (v.size() < static_cast<size_t>(n))
      v.resize(static_cast<size_t>(n));
    memory.add(static_cast<int64_t>((v.capacity() - before) * sizeof(T)));
    return v.data();
  }

  //===--------------------------------------------------------------------===//
  // Weights
  //===--------------------------------------------------------------------===//

  /// Fills every weight the program's steps use from this rank's slices
  /// (PlanLayout): local expert l of a stack is global expert ep * El + l.
  /// The rank's weights (moert/RankWeights.h): views into the mapping or
  /// owned copies of its boxes; expert stacks as one matrix per expert.
  void bindWeights(const Checkpoint &ckpt) {
    rankWeights.bind(*plan, rank, ckpt, [&](int64_t bytes) { memory.add(bytes); });
    weights.assign(rankWeights.weights().size(), {});
    for (size_t i = 0; i < weights.size(); ++i) {
      const RankWeights::Weight &w = rankWeights.weights()[i];
      weights[i].view = w.view;
      for (const TensorView &e : w.experts)
        weights[i].experts.push_back(cpu::Matrix::of(e));
    }
  }

  //===--------------------------------------------------------------------===//
  // Steps
  //===--------------------------------------------------------------------===//

  static bool same(const cpu::RopeParams &a, const cpu::RopeParams &b) { return a == b; }

  const cpu::RopeTable &table(const cpu::RopeParams &p) {
    for (auto &[params, t] : ropeTables)
      if (same(params, p))
        return *t;
    ropeTables.emplace_back(p, std::make_unique<cpu::RopeTable>(p, plan->maxSeqLen));
    return *ropeTables.back().second;
  }

  std::string what(size_t index, const PlanStep &s) const {
    return collectives::describe(index, s);
  }

  /// Runs step `index` over `T` rows; returns the rows of the steps after it
  /// (the head leaves only the logit rows).
  int64_t run(size_t index, const PlanStep &s, int64_t T, const cpu::TokenLayout &layout,
              const Batch &batch) {
    switch (s.op) {
    // Collectives and the expert steps run with any T, 0 included: every
    // member of a group takes part, and expert_ffn computes rows that
    // other ranks sent.
    case OpKind::AllReduce:
    case OpKind::AllGather:
    case OpKind::AllToAll:
    case OpKind::Send:
    case OpKind::Recv:
      collectives::run(collective, index, s, T);
      return T;
    case OpKind::Dispatch:
      cpu::dispatch(f(s.in[0]), T, width(s.in[0]), ints(s.in[1]), width(s.in[1]), s.dispatch,
                    coords.tp / s.dispatch.rowPartStride, f(s.out[0]), ints(s.out[1]),
                    ints(s.out[2]));
      return T;
    case OpKind::ExpertFFN: {
      const BoundWeight &g = weights[s.weights[0]], &u = weights[s.weights[1]],
                        &d = weights[s.weights[2]];
      const int64_t E = width(s.in[1]), El = static_cast<int64_t>(g.experts.size());
      cpu::expertFfn(f(s.in[0]), ints(s.in[1]), E / El, El, bufferRows(s.in[0]) / E,
                     width(s.in[0]), g.experts, u.experts, d.experts, s.activation,
                     f(s.out[0]));
      return T;
    }
    default:
      break;
    }
    if (s.op == OpKind::Linear && s.head)
      return head(s, T, batch);
    if (T == 0)
      return T; // nothing to compute
    switch (s.op) {
    case OpKind::Embedding: {
      cpu::Matrix m = cpu::Matrix::of(w(s, 0));
      if (!s.vocabShard) {
        cpu::embedding(m, ints(s.in[0]), T, f(s.out[0]));
        return T;
      }
      // This rank's rows [tp * R, (tp + 1) * R) of the padded vocabulary;
      // other ids give zero rows (the all_reduce over tp that follows adds
      // the one rank's row that holds them).
      const int64_t first = coords.tp * m.rows;
      const int32_t *ids = ints(s.in[0]);
      int32_t *localIds = reserve(idScratch, T);
      for (int64_t t = 0; t < T; ++t) {
        int64_t id = ids[t] - first;
        localIds[t] = id >= 0 && id < m.rows ? static_cast<int32_t>(id) : 0;
      }
      cpu::embedding(m, localIds, T, f(s.out[0]));
      for (int64_t t = 0; t < T; ++t)
        if (ids[t] < first || ids[t] >= first + m.rows)
          std::fill_n(f(s.out[0]) + t * m.cols, m.cols, 0.0f);
      return T;
    }
    case OpKind::RMSNorm:
      cpu::rmsNorm(f(s.in[0]), T, width(s.in[0]), w(s, 0), s.eps, f(s.out[0]));
      return T;
    case OpKind::LayerNorm:
      cpu::layerNorm(f(s.in[0]), T, width(s.in[0]), w(s, 0), optional(s, 1), s.eps, f(s.out[0]));
      return T;
    case OpKind::Linear:
      cpu::linear(f(s.in[0]), T, cpu::Matrix::of(w(s, 0)), optional(s, 1), f(s.out[0]));
      return T;
    case OpKind::Rope: {
      int64_t wd = width(s.in[0]);
      if (s.out[0] != s.in[0])
        std::copy_n(f(s.in[0]), T * wd, f(s.out[0]));
      table(s.rope).apply(f(s.out[0]), T, wd, s.headDim, ints(s.in[1]));
      return T;
    }
    case OpKind::Attention: {
      int64_t q = width(s.in[0]), v = width(s.in[2]);
      cpu::attention(f(s.in[0]), f(s.in[1]), f(s.in[2]), layout, s.heads, s.kvHeads,
                     q / s.heads, v / s.kvHeads, s.scale, s.slidingWindow, caches[s.kvCache],
                     f(s.out[0]));
      return T;
    }
    case OpKind::MLAttention: {
      int64_t r = width(s.in[2]);
      int64_t nope = width(s.in[0]) / s.heads - r;
      int64_t vdim = width(s.in[1]) / s.heads - nope;
      cpu::mlaAttention(f(s.in[0]), f(s.in[1]), f(s.in[2]), layout, s.heads, nope, r, vdim,
                        s.scale, table(s.rope), caches[s.kvCache], f(s.out[0]));
      return T;
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
      return T;
    }
    case OpKind::Add:
      cpu::add(f(s.in[0]), f(s.in[1]), T * width(s.in[0]), f(s.out[0]));
      return T;
    case OpKind::SigmoidGate:
      cpu::sigmoidGate(f(s.in[0]), f(s.in[1]), T, width(s.in[0]), f(s.out[0]));
      return T;
    case OpKind::MLP: {
      cpu::Matrix g = cpu::Matrix::of(w(s, 0)), u = cpu::Matrix::of(w(s, 1)),
                  d = cpu::Matrix::of(w(s, 2));
      cpu::mlp(f(s.in[0]), T, g, u, d, s.activation, reserve(scratch, 2 * T * g.rows),
               f(s.out[0]));
      return T;
    }
    case OpKind::Router: {
      cpu::Matrix g = cpu::Matrix::of(w(s, 0));
      float *logits = reserve(scratch, T * g.rows);
      cpu::linear(f(s.in[0]), T, g, nullptr, logits);
      cpu::route(logits, T, g.rows, optional(s, 1), s.routing, f(s.out[0]), ints(s.out[1]));
      return T;
    }
    case OpKind::Experts:
      cpu::experts(f(s.in[0]), T, width(s.in[0]), f(s.in[1]), ints(s.in[2]), width(s.in[1]),
                   weights[s.weights[0]].experts, weights[s.weights[1]].experts,
                   weights[s.weights[2]].experts, s.activation, f(s.out[0]));
      return T;
    case OpKind::Combine: {
      // Slots index y's rows: checked, as y may come from another rank.
      const int64_t k = width(s.in[1]), yRows = bufferRows(s.in[0]);
      const int32_t *slots = ints(s.in[1]);
      for (int64_t p = 0; p < T * k; ++p)
        if (slots[p] >= yRows)
          runtimeError("rank {}: {}: slot {} of token {} outside the {} rows of buffer {}", rank,
                       what(index, s), slots[p], p / k, yRows, s.in[0]);
      cpu::combine(f(s.in[0]), width(s.in[0]), slots, f(s.in[2]), T, k, f(s.out[0]));
      return T;
    }
    default:
      runtimeError("{}: not a per-token op", what(index, s));
    }
  }

  /// The LM head: only the rows the caller wants (the last prompt token of
  /// each sequence when no full logits are asked for), packed as rows
  /// 0..R-1 of the output; the steps after it run on R rows.
  int64_t head(const PlanStep &s, int64_t T, const Batch &batch) {
    cpu::Matrix m = cpu::Matrix::of(w(s, 0));
    const int64_t R = static_cast<int64_t>(batch.logitRows.size());
    if (R > plan->maxBatchTokens)
      runtimeError("{} logit rows exceed max_batch_tokens ({})", R, plan->maxBatchTokens);
    float *rows = reserve(gathered, R * m.cols);
    for (int64_t r = 0; r < R; ++r) {
      int64_t t = batch.logitRows[r];
      if (t < 0 || t >= T)
        runtimeError("logit row {} outside the batch of {} tokens", t, T);
      std::copy_n(f(s.in[0]) + t * m.cols, m.cols, rows + r * m.cols);
    }
    cpu::linear(rows, R, m, optional(s, 1), f(s.out[0]));
    return R;
  }

  const Plan *plan = nullptr;
  Comm *comm = nullptr;
  int64_t rank = 0;
  RankCoords coords;
  const PlanProgram *program = nullptr;
  std::vector<BoundWeight> weights;
  RankWeights rankWeights;
  std::vector<std::vector<float>> buffers;    // I32 buffers reuse the f32 storage
  std::vector<cpu::KVCache> caches;
  collectives::HostMemory hostMemory;
  collectives::Context collective;
  std::vector<std::pair<cpu::RopeParams, std::unique_ptr<cpu::RopeTable>>> ropeTables;
  std::vector<float> scratch, gathered, gatherStage;
  std::vector<int32_t> idScratch;
  int64_t allocated = 0;
  MemoryTracker memory;
  std::array<double, kNumOpKinds> seconds{};
};

} // namespace

std::unique_ptr<Device> createCpuDevice() { return std::make_unique<CpuDevice>(); }

} // namespace moert
