// The device interface: what the executor asks of a backend. The CPU driver
// implements it now; the CUDA driver implements the same interface, so the
// executor (batching, chunking, sampling) is shared.
#pragma once

#include "moert/Checkpoint.h"
#include "moert/Comm.h"
#include "moert/Plan.h"

#include <memory>
#include <string>
#include <vector>

namespace moert {

/// One step's tokens: ids, positions, and KV-cache slots (sequences),
/// contiguous per sequence.
struct Batch {
  std::vector<int32_t> tokens, positions, slots;
  /// Rows whose logits the caller wants, in order; the device writes them
  /// as consecutive rows of `logits`.
  std::vector<int64_t> logitRows;
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

class Device {
public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  /// Binds the rank's weights from the checkpoint (checking every name,
  /// shape and dtype against the plan): its program's local weights are
  /// filled from the rank's slices (PlanLayout), a whole tensor is a view
  /// into the mapping, a part is copied. Allocates buffers and caches.
  /// Collective steps go through `comm` (kept; may be a world of one).
  virtual void prepare(const Plan &plan, int64_t rank, const Checkpoint &weights,
                       Comm &comm) = 0;
  /// Runs every step of the rank's program over the batch; on the last
  /// stage, logits of batch.logitRows go to `logits` ([logitRows.size(),
  /// vocab], f32); other stages leave `logits` alone. An empty batch (T = 0)
  /// still takes part in every collective (with no rows).
  virtual void forward(const Batch &batch, std::vector<float> &logits) = 0;
  /// Bytes of weights bound and of buffers/caches allocated.
  virtual int64_t weightBytes() const = 0;
  virtual int64_t workspaceBytes() const = 0;
  /// The allocator's peak: weight bytes it holds (copies; views into the
  /// mapping count as loaded bytes) + buffers + caches + scratch, in bytes.
  virtual int64_t peakBytes() const = 0;
  /// Bytes of checkpoint data this rank read (its slices).
  virtual int64_t loadedWeightBytes() const = 0;
  /// Seconds spent in each step of the rank's program since prepare (for
  /// benchmarks; may be empty).
  virtual std::vector<double> stepSeconds() const { return {}; }
};

/// The CPU driver.
std::unique_ptr<Device> createCpuDevice();
/// The CUDA driver (docs/cuda.md): runs `moec --target cuda` plans. Its
/// libraries load at run time, so without a GPU prepare() fails with a clear
/// InputError; in a build without the CUDA toolkit this throws one saying so.
std::unique_ptr<Device> createCudaDevice();
/// True when the rank's program of `plan` carries a CUDA kernel table.
bool planTargetsCuda(const Plan &plan);

} // namespace moert
