// The device interface: what the executor (moert/RankExecutor.h) asks of a
// target. A device holds the rank's weights and its memory (DeviceMemory:
// allocate, release, write, read, 2-D copies), on which the executor
// allocates the program (RankProgram), and gives the kernels of each step by
// the step's kernel id (StepKernels: the op's CPU kernel of the registry,
// or the CUDA table's launches and cuBLAS GEMMs). The executor runs the
// steps and the collectives' protocols; a device never sees a batch loop, a
// protocol or a model-level op name. CPU: cpu/CpuDevice.cpp; CUDA:
// cuda/CudaDevice.cpp.
#pragma once

#include "DeviceMemory.h"
#include "RankProgram.h"
#include "StepLoop.h"
#include "moert/RankExecutor.h"

#include <functional>
#include <memory>
#include <string>

namespace moert {

class Device : public StepKernels {
public:
  virtual std::string name() const = 0;
  /// Opens the device for `rank`'s program of `plan` and binds its weights
  /// from the checkpoint (RankWeights: names, shapes and dtypes checked
  /// against the plan); `world` is kept for a device communicator over it.
  virtual void open(const Plan &plan, int64_t rank, const Checkpoint &weights, Comm &world) = 0;
  /// The memory the program is allocated on.
  virtual DeviceMemory &memory() = 0;
  /// How the program stages all_gather (RankProgram::Staging).
  virtual RankProgram::Staging staging() const = 0;
  /// The communicator of the program's collective steps: the world given
  /// to open(), or the device's own over it (NCCL); null for one rank.
  virtual Comm *communicator() = 0;
  /// A program of the rank (one per entry, the rank's own first) is
  /// allocated: the device's views of it (caches, which its entries share)
  /// and its state for the steps (kept until the device goes).
  virtual void bind(const RankProgram &program) = 0;
  /// Runs `steps` (the executor's step loop over `program` and `batch`,
  /// whose inputs are written) with the batch's per-token state in place:
  /// the CUDA device uploads its index arrays and captures or replays a
  /// graph.
  virtual void run(const RankProgram &program, const Batch &batch,
                   const std::function<void()> &steps) = 0;
  /// The rank's weight i (its program's numbering) as f32 values in its
  /// local shape (an expert stack's experts in order): what training made
  /// of it.
  virtual void readWeight(size_t i, std::vector<float> &out);
  /// The rank's weight i in host memory, writable, its elements in order
  /// (the all_gather of a weight, ZeRO); none where the device does not
  /// own it there.
  virtual std::vector<collectives::WeightPart> weightParts(size_t) { return {}; }
  /// Waits for the work launched so far.
  virtual void synchronize() {}
  /// True when a step's kernels have finished when compute() returns (step
  /// times are real).
  virtual bool synchronous() const = 0;

  /// Bytes of weights bound on the device.
  virtual int64_t weightBytes() const = 0;
  /// Bytes of checkpoint data read (the rank's slices).
  virtual int64_t loadedWeightBytes() const = 0;
  /// The peak of what the device holds besides memory()'s allocations:
  /// weights (views into the checkpoint's mapping at their size) and
  /// scratch.
  virtual int64_t ownPeakBytes() const = 0;
};

std::unique_ptr<Device> createCpuDevice();
/// In a build without the CUDA toolkit: an InputError saying so.
std::unique_ptr<Device> createCudaDevice();

} // namespace moert
