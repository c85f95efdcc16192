// rms_norm and layer_norm over rows.
#include "Ops.h"

namespace moert::ops {
namespace {

void checkNorm(const StepChecker &c, const PlanStep &step, bool layerNorm) {
  c.arity(1, 1, layerNorm ? 2 : 1, 1);
  int64_t w = c.tokens(step.in[0]);
  const PlanWeight &g = c.weight(0, 1);
  c.expect(g.shape[0] > 0 && w % g.shape[0] == 0, "weight size does not divide the width");
  c.expect(!layerNorm || g.shape[0] == w, "layer_norm weight must span the row");
  if (step.weights.size() == 2)
    c.expect(c.weight(1, 1).shape == g.shape, "bias and weight shapes differ");
  c.expect(c.tokens(step.out[0]) == w, "output width differs from the input's");
  c.expect(step.eps > 0, "eps must be > 0");
}

void checkRmsNorm(const StepChecker &c, const PlanStep &step) { checkNorm(c, step, false); }
void checkLayerNorm(const StepChecker &c, const PlanStep &step) { checkNorm(c, step, true); }

int64_t runRmsNorm(cpu::StepContext &c) {
  cpu::rmsNorm(c.in(0), c.rows, c.inWidth(0), c.weight(0), c.step->eps, c.out(0));
  return c.rows;
}

int64_t runLayerNorm(cpu::StepContext &c) {
  cpu::layerNorm(c.in(0), c.rows, c.inWidth(0), c.weight(0), c.optionalWeight(1), c.step->eps,
                 c.out(0));
  return c.rows;
}

} // namespace

const OpDef kRmsNorm = {"rms_norm", Collective::None, 0, nullptr, checkRmsNorm, runRmsNorm};
const OpDef kLayerNorm = {"layer_norm", Collective::None, 0, nullptr, checkLayerNorm,
                          runLayerNorm};

} // namespace moert::ops
