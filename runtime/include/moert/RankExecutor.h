// One rank's programs on a device: the executor's half that every device
// shares. A rank runs one program per entry of the plan (its stage's
// "forward", or "prefill" and "decode", which the plan's schedule names);
// the executor owns each program's memory (its buffers and collective
// staging, and the KV caches its entries share: runtime/src/RankProgram.h),
// writes the batch in, runs
// the one step loop (runtime/src/StepLoop.h, the collectives' protocols
// included) over the device's kernels and reads the logits out. A device
// (runtime/src/Device.h: CPU, CUDA) gives only its memory, its weights and
// the kernels of each step; the generation loop (moert/Executor.h) drives
// this object the same way for every device.
#pragma once

#include "moert/Checkpoint.h"
#include "moert/Comm.h"
#include "moert/Plan.h"

#include <memory>
#include <string>
#include <vector>

namespace moert {

class Device;
class RankProgram;

/// One step's tokens: ids, positions, and KV-cache slots (sequences),
/// contiguous per sequence.
struct Batch {
  std::vector<int32_t> tokens, positions, slots;
  /// A training step's labels: the next token of each row (-100: none).
  std::vector<int32_t> labels;
  /// Rows whose logits the caller wants, in order; the device writes them
  /// as consecutive rows of `logits`.
  std::vector<int64_t> logitRows;
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

/// The devices a rank's program runs on.
enum class DeviceKind { Cpu, Cuda };

/// The part of a logical state a rank's state buffer holds: `elements`
/// values from `offset` of its `logicalElements` (a ZeRO shard: replica d
/// holds rows [d k, (d + 1) k) of the state's rows, its values past the end
/// zeros); a state that is not sharded holds all of them from 0.
struct StateShard {
  int64_t elements = 0, logicalElements = 0, offset = 0;
  bool sharded = false; ///< a ZeRO shard (the plan's logical_rows), on every replica alike
  bool overEdp = false; ///< sharded over the edp group (an expert stack's state), else dp
};

/// Whether state `name` is of one of these kinds (the name before ':').
bool stateOfKind(const std::string &name, const std::vector<std::string> &kinds);

class RankExecutor {
public:
  /// An executor over a new device of `kind`. CUDA's libraries load at run
  /// time, so without a GPU prepare() fails with a clear InputError; in a
  /// build without the CUDA toolkit this throws one saying so.
  static std::unique_ptr<RankExecutor> create(DeviceKind kind);
  ~RankExecutor();

  /// The device's name ("cpu", "cuda").
  std::string deviceName() const;
  /// Binds the rank's weights from the checkpoint on the device (checking
  /// every name, shape and dtype against the plan: its program's local
  /// weights filled from the rank's slices, PlanLayout; every entry of the
  /// rank uses them), then allocates each entry's buffers and the caches
  /// on the device's memory. Collective steps
  /// go through `comm` (kept; may be a world of one) or the device's
  /// communicator over it (NCCL).
  void prepare(const Plan &plan, int64_t rank, const Checkpoint &weights, Comm &comm);
  /// Runs every step of the rank's program of `entry` (empty: its own
  /// program, the plan's first entry) over the batch; on the last stage,
  /// logits of batch.logitRows go to `logits` ([logitRows.size(), vocab],
  /// f32), or a train program's loss [loss, ce, aux, z]; other stages leave
  /// `logits` alone. An empty batch (T = 0) still
  /// takes part in every collective (with no rows). Every rank of a
  /// collective group runs the same entry in a step.
  void forward(const Batch &batch, std::vector<float> &logits, const std::string &entry = {});

  /// A pipelined training plan's step (Plan::pipelineSchedule): the stage's
  /// forward ("train_forward") or backward ("train") program on its
  /// micro-batch `batch`, with that micro-batch's slot of the values kept
  /// between them; the last stage's forward gives the loss. When `next` is
  /// fused with it, the program's last sends and `next`'s first receives
  /// (of `nextBatch`) run as one exchange with the neighbour.
  void pipelineStep(const Plan::PipelineStep &step, const Batch &batch, std::vector<float> &loss,
                    const Plan::PipelineStep *next, const Batch *nextBatch);
  /// Seconds the pipeline steps so far spent computing, and waiting in
  /// their receives, sends and exchanges (the bubble, and the transfers).
  double pipelineBusySeconds() const { return pipelineBusy_; }
  double pipelineWaitSeconds() const { return pipelineWait_; }
  /// After a step of a differentiated train program: the gradient of its
  /// weight program.gradients[i].weight, f32 in the weight's local shape.
  void readGradient(size_t i, std::vector<float> &out, const std::string &entry = {});

  /// Runs the optimizer entry (moec compile --optimizer) for update `step`
  /// (from 1): the weights change in place from the gradients the train
  /// steps since the last update added up. `stats`: [lr, grad_norm,
  /// clip_coef, skipped] of the update (skipped: 1 when the gradient was not
  /// finite and no weight moved).
  void optimizerStep(int64_t step, std::vector<float> &stats);
  /// The rank's weight i (program.weights[i]) as f32 in its local shape (an
  /// expert stack's experts one after another).
  void readWeight(size_t i, std::vector<float> &out);
  /// The rank's state buffers (gradient sums, optimizer moments; all its
  /// entries'), by name, and their values (f32) to / from the host: of a
  /// ZeRO shard, the rank's own rows (read), the whole logical state
  /// (written: the rank keeps its rows).
  std::vector<std::string> stateNames() const;
  void readState(const std::string &name, std::vector<float> &out);
  void writeState(const std::string &name, const std::vector<float> &values);
  /// What the rank is doing ("update 3, micro-batch 2"), named in the
  /// messages of a training program's collectives (empty: nothing).
  void setPhase(std::string phase) { phase_ = std::move(phase); }
  /// Which part of its logical state state `name` holds (StateShard).
  StateShard stateShard(const std::string &name) const;
  /// Bytes allocated for the states of these kinds (the name before ':',
  /// e.g. exp_avg; ZeRO shards at their size).
  int64_t stateBytes(const std::vector<std::string> &kinds) const;

  /// Bytes of weights bound on the device.
  int64_t weightBytes() const;
  /// Bytes held besides the weights at the peak: the program's buffers,
  /// caches and staging, and the device's scratch.
  int64_t workspaceBytes() const;
  /// The peak: weights (copies, and views into the checkpoint's mapping at
  /// their size) + the program's memory + the device's scratch, in bytes.
  int64_t peakBytes() const;
  /// Bytes of checkpoint data this rank read (its slices).
  int64_t loadedWeightBytes() const;
  /// Seconds spent in each step of the rank's program of `entry` (empty:
  /// its own) since prepare, on a device whose kernels finish before they
  /// return (the CPU); empty otherwise.
  std::vector<double> stepSeconds(const std::string &entry = {}) const;

private:
  explicit RankExecutor(std::unique_ptr<Device> device);
  /// The index of `entry`'s program (empty: 0).
  size_t entryIndex(const std::string &entry) const;
  RankProgram &stateHolder(const std::string &name) const;

  std::unique_ptr<Device> device;
  std::vector<std::unique_ptr<RankProgram>> programs; ///< one per entry, the rank's own first
  std::string phase_; ///< setPhase (the programs' collectives point at it)
  double pipelineBusy_ = 0, pipelineWait_ = 0;
  std::vector<std::vector<double>> seconds;          ///< per entry, per step
};

/// True when the rank's program of `plan` carries a CUDA kernel table.
bool planTargetsCuda(const Plan &plan);

/// The device of `--device NAME` (cpu, cuda; empty: cuda when the plan has
/// CUDA kernels, as moert run and train choose); InputError for another name
/// or cuda without kernels (`compileHint`: the moec command that makes them).
DeviceKind chooseDevice(const Plan &plan, const std::string &planPath, const std::string &name,
                        const char *compileHint);

} // namespace moert
