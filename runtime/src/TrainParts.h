// A training run's weights that the ranks hold in parts (TrainParts.cpp):
// an expert stack split over ep (its experts) and etp (their slices), a
// tensor-parallel weight split over tp.
// Checkpoints hold every tensor whole: --save and --weights-out gather the
// parts, --resume gives each rank its part (docs/training.md).
#pragma once

#include "moert/Comm.h"
#include "moert/Plan.h"

#include <functional>
#include <string>
#include <vector>

namespace moert {

/// How rank `rank` holds weight `w` (a PlanWeight of its program).
class WeightParts {
public:
  WeightParts(const Plan &plan, int rank, const PlanWeight &w);
  /// Whether the ranks of a group hold parts of it.
  bool split() const { return split_; }
  /// The whole weight as a PlanWeight (every expert; the model's shape).
  const PlanWeight &whole() const { return whole_; }
  /// The rank's values `own` (its part, in its shape) gathered into the
  /// whole (every rank of the world calls it, for the same weights in the
  /// same order).
  void gather(Comm &comm, const std::string &what, const std::vector<float> &own,
              std::vector<float> &whole) const;
  /// The rank's part of the whole values (the padding rows of a
  /// vocabulary-split weight 0).
  std::vector<float> part(const std::vector<float> &whole) const;

private:
  /// Rank `rank`'s first expert of a stack.
  int64_t firstExpert(int rank) const;
  /// copy(at in the part, at in the whole, count) over rank `rank`'s boxes.
  void forParts(int rank, const std::function<void(int64_t, int64_t, int64_t)> &copy) const;

  bool split_ = false;
  const Plan &plan_;
  int rank_;
  PlanWeight own_, whole_;
};

/// The weight of a state's name ("exp_avg:<weight>") in `program`, or null.
const PlanWeight *weightOfState(const PlanProgram &program, const std::string &state);

} // namespace moert
