// One rank's program as both devices run it: its buffers and KV caches,
// allocated on the device's memory (DeviceMemory) in the plan's layout, the
// batch's inputs written into them and the logits read out of them, and the
// context of its collective steps (Collectives.h). The devices give the
// kernels of each step (StepKernels) and run the one step loop
// (StepLoop.h) over it.
#pragma once

#include "Collectives.h"
#include "DeviceMemory.h"
#include "moert/RankExecutor.h"
#include "moert/Plan.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moert {

class RankProgram {
public:
  /// all_gather's staging block (its members' parts before they are laid
  /// out as columns): sized for max_batch_tokens rows at prepare (a device
  /// that replays captured graphs needs fixed addresses), or grown to the
  /// rows of each gather as they come (the CPU's: the LM head gathers only
  /// the logit rows).
  enum class Staging { Reserved, OnDemand };

  /// Allocates every buffer ([rows, width] 4-byte values) and every KV cache
  /// (keys and values, [max_sequences, max_seq_len, width] f32) of `rank`'s
  /// program (or of `entry`, one of plan.entriesOf(rank)) on `memory`; with
  /// `cachesOf` (another entry of the rank), its KV caches are shared
  /// instead.
  /// Collective steps go through `comm` (may be null for a plan of one
  /// rank).
  /// `statesOf` (the rank's entry prepared last): the states its entries
  /// declared so far, shared by name. A pipeline stage's
  /// kept values (states "stash:<i>") get Plan::stashSlots copies, one per
  /// micro-batch in flight (bindSlot).
  void prepare(const Plan &plan, int64_t rank, DeviceMemory &memory, Comm *comm,
               Staging staging, const PlanProgram *entry = nullptr,
               const RankProgram *cachesOf = nullptr, const RankProgram *statesOf = nullptr);
  /// Binds micro-batch `microBatch`'s slot of every kept value.
  void bindSlot(int64_t microBatch);
  /// The receives the program starts with, the sends it ends with (steps).
  size_t leadingRecvs() const;
  size_t trailingSends() const;
  const PlanProgram &program() const { return *program_; }

  /// The collective steps' context (runSteps).
  const collectives::Context &collectives() const { return context; }
  /// Where the collectives find the rank's weights (Device::weightParts).
  void setWeightParts(std::function<std::vector<collectives::WeightPart>(int64_t)> parts) {
    context.weightParts = std::move(parts);
  }
  /// What the rank is doing, named in its collectives' messages (kept by
  /// the caller).
  void setPhase(const std::string *phase) { context.phase = phase; }

  void *buffer(int64_t id) const { return buffers[static_cast<size_t>(id)]; }
  float *cacheKeys(int64_t id) const { return caches[static_cast<size_t>(id)].keys; }
  float *cacheValues(int64_t id) const { return caches[static_cast<size_t>(id)].values; }
  /// Bytes allocated for the program (buffers, caches unless shared,
  /// staging).
  int64_t bytes() const { return allocated + gatherBytes; }

  /// The batch's tokens, positions and (a train program's) labels into the
  /// program's input buffers (a batch larger than max_batch_tokens is
  /// refused).
  void writeInputs(const Batch &batch);
  /// `rows` rows of the program's logits (vocab_size wide) to the host, or
  /// a train program's loss [loss, ce, aux, z]; nothing on a program
  /// without either (not the last stage).
  void readOutput(int64_t rows, std::vector<float> &logits);
  /// The program's gradient i (PlanProgram::gradients) to the host.
  void readGradient(size_t i, std::vector<float> &out);
  /// An optimizer program's step number (from 1) into its input, and its
  /// stats [lr, grad_norm, clip_coef, skipped] out.
  void writeStep(int64_t step);
  void readStats(std::vector<float> &stats);
  /// The program's state buffers (its own and those it shares), by name;
  /// not a pipeline stage's kept values.
  std::vector<std::string> stateNames() const;
  /// State `name` to / from the host (f32, its elements in order; a ZeRO
  /// shard's own rows, written from the whole logical state);
  /// RuntimeError for a name the program has not or a size that differs.
  void readState(const std::string &name, std::vector<float> &out) const;
  void writeState(const std::string &name, const std::vector<float> &values);
  /// State `name`'s shard: its elements, the logical state's, and where
  /// they start in it (a state that is not a ZeRO shard: all of them, 0).
  StateShard stateShard(const std::string &name) const;

private:
  struct State {
    void *address = nullptr;
    int64_t elements = 0;
    StateShard shard;
    std::vector<void *> slots; ///< a kept value's, one per micro-batch in flight
  };
  std::vector<std::pair<size_t, std::string>> slotted; ///< (buffer, its kept value's state)
  struct Cache {
    float *keys = nullptr, *values = nullptr;
  };
  const Plan *plan_ = nullptr;
  const PlanProgram *program_ = nullptr;
  DeviceMemory *memory = nullptr;
  std::vector<void *> buffers;
  std::vector<Cache> caches;
  std::map<std::string, State> states; ///< by name, shared with the rank's other entries
  void *gatherStage = nullptr;
  int64_t gatherBytes = 0; ///< of gatherStage
  int64_t allocated = 0;   ///< buffers and caches
  collectives::Context context;
};

} // namespace moert
