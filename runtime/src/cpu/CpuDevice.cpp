// The CPU device (runtime/src/Device.h): the program's memory is host memory
// (HostMemory), its steps run the ops' CPU kernels of the registry
// (moert/cpu/Kernels.h), its collectives go through moert::Comm (the world).
// Activations are f32 buffers (I32 ones share the storage); weights are
// views into the mmapped Hugging Face checkpoint where the rank holds a whole
// tensor, and owned buffers filled with Checkpoint::readBox (pread of just
// the box's bytes, from a Hugging Face or a sharded checkpoint of any
// layout) otherwise.
#include "../Device.h"
#include "moert/Error.h"
#include "moert/RankWeights.h"
#include "moert/cpu/Kernels.h"
#include "moert/cpu/StepContext.h"

#include <fmt/core.h>

#include <algorithm>
#include <memory>

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

class CpuDevice final : public Device, private cpu::StepContext {
public:
  std::string name() const override { return "cpu"; }

  void open(const Plan &plan, int64_t rankIndex, const Checkpoint &ckpt, Comm &comm) override {
    this->plan = &plan;
    rank = rankIndex;
    coords = plan.ranks.at(rankIndex).coords;
    program = &plan.programOf(rankIndex);
    world = &comm;
    memory_.reset();
    bindWeights(ckpt);
  }

  DeviceMemory &memory() override { return hostMemory; }
  /// The LM head gathers only the logit rows: staging grows as needed.
  RankProgram::Staging staging() const override { return RankProgram::Staging::OnDemand; }
  Comm *communicator() override { return world; }

  /// The first program (the rank's own) binds the caches its entries
  /// share; every program adds the rope tables of its steps.
  void bind(const RankProgram &p) override {
    const PlanProgram &entry = p.program();
    if (&entry == program) {
      caches.assign(entry.caches.size(), {});
      for (size_t i = 0; i < entry.caches.size(); ++i)
        caches[i].bind(p.cacheKeys(static_cast<int64_t>(i)),
                       p.cacheValues(static_cast<int64_t>(i)), plan->maxSequences,
                       plan->maxSeqLen, entry.caches[i].keyWidth, entry.caches[i].valueWidth);
      ropeTables.clear();
    }
    // Rope tables per distinct parameter set (every layer shares one).
    for (const PlanStep &s : entry.steps)
      if (s.rope.rotaryDim > 0) // a step with "rope" attributes
        rope(s.rope);
  }

  /// The kernels see `p`'s program and buffers while its steps run (the
  /// weights are the rank's: its entries declare the same ones).
  void run(const RankProgram &p, const Batch &b, const std::function<void()> &steps) override {
    const PlanProgram *own = program;
    program = &p.program();
    rankProgram = &p;
    cpu::TokenLayout tokenLayout{b.slots.data(), b.positions.data(), b.size()};
    layout = &tokenLayout;
    batch = &b;
    steps();
    layout = nullptr;
    batch = nullptr;
    rankProgram = nullptr;
    program = own;
  }

  bool synchronous() const override { return true; }

  void readWeight(size_t i, std::vector<float> &out) override {
    const RankWeights::Weight &w = rankWeights.weights().at(i);
    // Sized once and converted in bulk: a whole model's master weights
    // pass through here when training starts.
    std::vector<const TensorView *> views;
    if (w.experts.empty())
      views.push_back(&w.view);
    for (const TensorView &e : w.experts)
      views.push_back(&e);
    int64_t total = 0;
    for (const TensorView *v : views)
      total += v->numel();
    out.resize(static_cast<size_t>(total));
    float *to = out.data();
    for (const TensorView *v : views) {
      v->toFloats(to);
      to += v->numel();
    }
  }
  std::vector<collectives::WeightPart> weightParts(size_t i) override {
    const RankWeights::Weight &w = rankWeights.weights().at(i);
    std::vector<collectives::WeightPart> parts;
    auto add = [&](const TensorView &v) {
      parts.push_back({static_cast<char *>(const_cast<void *>(v.data)), v.numel()});
    };
    if (w.experts.empty())
      add(w.view);
    for (const TensorView &e : w.experts)
      add(e);
    return parts;
  }
  int64_t weightBytes() const override { return rankWeights.boundBytes(); }
  int64_t loadedWeightBytes() const override { return rankWeights.loadedBytes(); }
  /// Nothing the device holds shrinks: its peak is what it holds now.
  int64_t ownPeakBytes() const override { return memory_.peak(); }

private:
  /// A step's kernel (the executor's loop, StepLoop.h): the op's CPU kernel.
  int64_t compute(size_t i, const PlanStep &s, int64_t stepRows) override {
    step = &s;
    index = i;
    rows = stepRows;
    return s.op->cpu(*this);
  }

  // What the ops' CPU kernels see (cpu::StepContext).
  float *f(int64_t id) override { return static_cast<float *>(rankProgram->buffer(id)); }
  const TensorView &weight(size_t i) override { return weights[step->weights[i]].view; }
  const std::vector<cpu::Matrix> &experts(size_t i) override {
    return weights[step->weights[i]].experts;
  }
  cpu::KVCache &cache(int64_t id) override { return caches[id]; }
  float *scratch(Scratch which, int64_t n) override {
    return reserve(which == Scratch::Work ? work : gathered, n);
  }
  int32_t *intScratch(int64_t n) override { return reserve(idScratch, n); }

  /// `v` grown to at least n elements; growth is counted as memory.
  template <typename T> T *reserve(std::vector<T> &v, int64_t n) {
    size_t before = v.capacity();
    if (v.size() < static_cast<size_t>(n))
      v.resize(static_cast<size_t>(n));
    memory_.add(static_cast<int64_t>((v.capacity() - before) * sizeof(T)));
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
    rankWeights.bind(*plan, rank, ckpt, [&](int64_t bytes) { memory_.add(bytes); });
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

  /// One table per distinct parameter set (every layer shares one).
  const cpu::RopeTable &rope(const cpu::RopeParams &p) override {
    for (auto &[params, t] : ropeTables)
      if (params == p)
        return *t;
    ropeTables.emplace_back(p, std::make_unique<cpu::RopeTable>(p, plan->maxSeqLen));
    return *ropeTables.back().second;
  }

  std::vector<BoundWeight> weights;
  RankWeights rankWeights;
  Comm *world = nullptr;
  HostMemory hostMemory;
  const RankProgram *rankProgram = nullptr; ///< buffers (I32 ones share the f32 storage), caches
  std::vector<cpu::KVCache> caches;         ///< views of rankProgram's caches
  std::vector<std::pair<cpu::RopeParams, std::unique_ptr<cpu::RopeTable>>> ropeTables;
  std::vector<float> work, gathered;
  std::vector<int32_t> idScratch;
  MemoryTracker memory_; ///< weights and scratch
};

} // namespace

std::unique_ptr<Device> createCpuDevice() { return std::make_unique<CpuDevice>(); }

} // namespace moert
