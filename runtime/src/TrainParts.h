// A training run's state (TrainParts.cpp, TrainState.cpp): the weights that
// the ranks hold in parts (TrainParts.cpp):
// an expert stack split over ep (its experts) and etp (their slices), a
// tensor-parallel weight split over tp.
// Checkpoints hold every tensor whole: --save and --weights-out gather the
// parts, --resume gives each rank its part (docs/training.md).
#pragma once

#include "moert/Checkpoint.h"
#include "moert/Comm.h"
#include "moert/Plan.h"
#include "moert/SafetensorsWriter.h"
#include "moert/ShardedCheckpoint.h"

#include <functional>
#include <string>
#include <vector>

namespace moert {

class RankExecutor;
struct PlanSlice;

/// How rank `rank` holds weight `w` (a PlanWeight of its program).
class WeightParts {
public:
  WeightParts(const Plan &plan, int rank, const PlanWeight &w);
  /// Whether the ranks of a group hold parts of it.
  bool split() const { return split_; }
  /// The whole weight as a PlanWeight (every expert; the model's shape).
  const PlanWeight &whole() const { return whole_; }
  /// The rank's values `own` (its part, in its shape) gathered into the
  /// whole (every rank of its pipeline stage calls it, for the same
  /// weights in the same order).
  void gather(Comm &comm, const std::string &what, const std::vector<float> &own,
              std::vector<float> &whole) const;
  /// The rank's part of the whole values (the padding rows of a
  /// vocabulary-split weight 0).
  std::vector<float> part(const std::vector<float> &whole) const;

private:
  /// Rank `rank`'s first expert of a stack.
  int64_t firstExpert(int rank) const;
  /// box(where in the part, where in the whole, its slice) for each of rank
  /// `rank`'s boxes (an expert's, or the weight's).
  void forParts(int rank,
                const std::function<void(int64_t, int64_t, const PlanSlice &)> &box) const;

  bool split_ = false;
  const Plan &plan_;
  int rank_;
  PlanWeight own_, whole_;
};

/// The weight of a state's name ("exp_avg:<weight>") in `program`, or null.
const PlanWeight *weightOfState(const PlanProgram &program, const std::string &state);

// TrainState.cpp: the run's state in checkpoints.

/// Whether `rank` is its pipeline stage's first rank (dp, tp, ep 0): the
/// rank that holds the stage's weights and states whole for a checkpoint
/// (rank 0 without pipeline stages).
bool stageLead(const Plan &plan, int rank);
/// Pipeline stages: every stage lead's `tensors` (whole) to rank 0, after
/// its own, in stage order (the other ranks' lists end empty); nothing
/// without stages. Every rank calls it.
void gatherStages(const Plan &plan, Comm &comm, std::vector<TensorToWrite> &tensors,
                  const std::string &what);

/// `values` (f32, weight w's shape) as the checkpoint's tensors of w: one,
/// or one per expert of a stack, by their checkpoint names; in `dtype` F32,
/// or BF16 (values that are bf16 already: exact).
void appendByName(const PlanWeight &w, const std::vector<float> &values,
                  std::vector<TensorToWrite> &tensors, DType dtype = DType::F32);
/// The dtype the checkpoint holds weight `w` in (its slices').
DType storedDtype(const PlanLayout &layout, const PlanWeight &w);
/// The trained weights by checkpoint name, whole (`values` keeps them;
/// every rank calls it, rank 0 gets them): f32, or with `layout` each in the
/// dtype of its slices.
std::vector<TensorToWrite> trainedWeights(const Plan &plan, RankExecutor &executor, Comm &comm,
                                          const PlanProgram &program,
                                          std::vector<std::vector<float>> &values,
                                          const PlanLayout *layout = nullptr);
/// Where --save writes: the directory, the model and plan it names, the
/// plan's layout (the weights' dtypes).
struct CheckpointTarget {
  std::string dir, planPath;
  CheckpointModel model;
  const PlanLayout &layout;
};
/// --save: the weights and every state that is not all zeros, whole; every
/// rank calls it, rank 0 writes.
void saveCheckpoint(const Plan &plan, RankExecutor &executor, Comm &comm,
                    const PlanProgram &program, const CheckpointTarget &target,
                    const TrainingProgress &progress);
/// --resume: the checkpoint's progress (its update's shape must be the
/// plan's) and its states, each rank given its part. `saveAgain`: --save
/// with --steps at the checkpoint's update (written again, no update).
TrainingProgress resumeFrom(const std::string &dir, const Checkpoint &checkpoint,
                            RankExecutor &executor, const Plan &plan, int rank,
                            const PlanProgram &optimizer, int64_t B, int64_t L, int64_t steps,
                            int64_t shuffleSeed, bool saveAgain);

} // namespace moert
