// Step times by op kind (moert/StepTimes.h).
#include "moert/StepTimes.h"
#include "moert/Op.h"

#include <algorithm>

namespace moert {

std::vector<OpTime> timeByOp(const PlanProgram &program, const std::vector<double> &now,
                             const std::vector<double> &since,
                             const std::function<double(size_t)> &stepBytes) {
  std::vector<OpTime> kinds;
  for (size_t i = 0; i < now.size() && i < program.steps.size(); ++i) {
    const std::string op(program.steps[i].op->name);
    auto kind = std::find_if(kinds.begin(), kinds.end(), [&](const OpTime &k) { return k.op == op; });
    if (kind == kinds.end())
      kind = kinds.insert(kinds.end(), OpTime{op, 0, 0});
    kind->seconds += now[i] - (i < since.size() ? since[i] : 0.0);
    if (stepBytes)
      kind->bytes += stepBytes(i);
  }
  return kinds;
}

} // namespace moert
