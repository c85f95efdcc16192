// Where a program's time goes: its steps' seconds (RankExecutor::stepSeconds)
// summed by op kind, for moert train --profile and moe-bench.
#pragma once

#include "moert/Plan.h"

#include <functional>
#include <string>
#include <vector>

namespace moert {

struct OpTime {
  std::string op;     ///< the op kind (the steps' `op`), in first-step order
  double seconds = 0; ///< summed over its steps
  double bytes = 0;   ///< summed stepBytes (0 without it)
};

/// The seconds of the program's steps between `since` (empty: from the
/// start) and `now`, by op kind; stepBytes(i), when given, is summed too.
std::vector<OpTime> timeByOp(const PlanProgram &program, const std::vector<double> &now,
                             const std::vector<double> &since,
                             const std::function<double(size_t)> &stepBytes = {});

} // namespace moert
