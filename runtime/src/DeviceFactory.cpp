// Which device runs a plan, and the CUDA factory of a build without CUDA.
#include "moert/Device.h"
#include "moert/Error.h"

namespace moert {

bool planTargetsCuda(const Plan &plan) {
  for (const PlanProgram &p : plan.programs)
    if (p.cuda)
      return true;
  return false;
}

#ifndef MOERT_HAVE_CUDA
std::unique_ptr<Device> createCudaDevice() {
  inputError("this moert was built without the CUDA toolkit: it runs CUDA plans on the CPU "
             "only (--device cpu); rebuild with the toolkit installed to run them on a GPU");
}
#endif

} // namespace moert
