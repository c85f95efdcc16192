// A training run's weights that the ranks hold in parts (TrainParts.cpp):
// an expert stack split over ep, a tensor-parallel weight split over tp.
// Checkpoints hold every tensor whole: --save and --weights-out gather the
// parts, --resume gives each rank its part (docs/training.md).
#pragma once

#include "moert/Comm.h"
#include "moert/Plan.h"

#include <string>
#include <vector>

namespace moert {

/// How rank `rank` holds weight `w` (a PlanWeight of its program).
class WeightParts {
public:
  WeightParts(const Plan &plan, int rank, const PlanWeight &w);
  /// Whether the ranks of a group hold parts of it.
  bool split() const { return kind_ != Kind::Whole; }
  /// The whole weight as a PlanWeight (every expert; the model's shape).
  const PlanWeight &whole() const { return whole_; }
  /// The rank's values `own` (its part, in its shape) gathered over its
  /// group into the whole (every member calls it).
  void gather(Comm &comm, const std::string &what, const std::vector<float> &own,
              std::vector<float> &whole) const;
  /// The rank's part of the whole values (the padding rows of a
  /// vocabulary-split weight 0).
  std::vector<float> part(const std::vector<float> &whole) const;

private:
  enum class Kind { Whole, Experts, Tensor } kind_ = Kind::Whole;
  const Plan &plan_;
  int rank_;
  PlanWeight own_, whole_;
};

/// The weight of a state's name ("exp_avg:<weight>") in `program`, or null.
const PlanWeight *weightOfState(const PlanProgram &program, const std::string &state);

} // namespace moert
