// What an op's CPU kernel (OpDef::cpu, runtime/src/ops/) sees of the device
// that runs it: the step, its rows, its buffers, weights, caches and rope
// tables, scratch memory and the rank. The CPU device implements it; so
// does the CUDA host check (tests/cuda-host), which runs the same kernels
// as the reference for the emitted CUDA ones.
#pragma once

#include "moert/RankExecutor.h"
#include "moert/Plan.h"
#include "moert/cpu/Kernels.h"

#include <cstdint>
#include <vector>

namespace moert::cpu {

class StepContext {
public:
  virtual ~StepContext() = default;

  const Plan *plan = nullptr;
  const PlanProgram *program = nullptr;
  const PlanStep *step = nullptr;
  size_t index = 0; ///< the step's index in the program
  int64_t rows = 0; ///< T: the batch's tokens (or fewer after the LM head)
  int64_t rank = 0;
  RankCoords coords;
  const TokenLayout *layout = nullptr;
  const Batch *batch = nullptr;

  /// Buffer `id` of the program (I32 buffers share the f32 storage).
  virtual float *f(int64_t id) = 0;
  int32_t *ints(int64_t id) { return reinterpret_cast<int32_t *>(f(id)); }
  int64_t width(int64_t id) const { return program->buffers[id].width; }
  int64_t bufferRows(int64_t id) const { return program->buffers[id].rows; }

  /// The step's i-th input / output buffer.
  float *in(size_t i) { return f(step->in[i]); }
  int32_t *inInts(size_t i) { return ints(step->in[i]); }
  float *out(size_t i) { return f(step->out[i]); }
  int32_t *outInts(size_t i) { return ints(step->out[i]); }
  int64_t inWidth(size_t i) const { return width(step->in[i]); }

  /// The step's i-th weight: a tensor, or an expert stack as one matrix per
  /// local expert.
  virtual const TensorView &weight(size_t i) = 0;
  const TensorView *optionalWeight(size_t i) {
    return step->weights.size() > i ? &weight(i) : nullptr;
  }
  virtual const std::vector<Matrix> &experts(size_t i) = 0;

  virtual const RopeTable &rope(const RopeParams &params) = 0;
  virtual KVCache &cache(int64_t id) = 0;

  /// Scratch of at least n elements, kept by the device between steps
  /// (its growth counts as the device's memory).
  enum class Scratch { Work, Rows };
  virtual float *scratch(Scratch which, int64_t n) = 0;
  virtual int32_t *intScratch(int64_t n) = 0;
};

} // namespace moert::cpu
