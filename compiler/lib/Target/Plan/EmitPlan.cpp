//===- EmitPlan.cpp - the plan file, as the last pass ------------*- C++ -*-===//
//
// moe-emit-plan: buildPlan (PlanWriter.h), the CUDA kernels for target=cuda
// (Cuda.h), the distribution of `moe.layout` (Layout.h, Distribution.h),
// written atomically. `moec compile -o` and `moe-opt --moe-compile-pipeline=
// "output=..."` both end with it, so they write the same bytes.
//
//===----------------------------------------------------------------------===//
#include "moe/Target/Cuda.h"
#include "moe/Target/Distribution.h"
#include "moe/Target/PlanWriter.h"
#include "moe/Transforms/Layout.h"
#include "moe/Transforms/Passes.h"

#include "mlir/IR/Diagnostics.h"
#include "llvm/Support/Path.h"

namespace moe {
#define GEN_PASS_DEF_MOEEMITPLAN
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;
namespace json = llvm::json;

namespace {

struct EmitPlan : moe::impl::MoEEmitPlanBase<EmitPlan> {
  using MoEEmitPlanBase::MoEEmitPlanBase;

  void runOnOperation() override {
    // What is wrong with the options or the module: at the module.
    ModuleOp module = getOperation();
    if (output.empty() && !kernelsOnly) {
      module.emitError("moe-emit-plan: expected output=<plan file>");
      return signalPassFailure();
    }
    if (target != "cpu" && target != "cuda") {
      module.emitError("moe-emit-plan: unknown target '") << target << "' (expected cpu or cuda)";
      return signalPassFailure();
    }
    if (kernelsOnly && target != "cuda") {
      module.emitError("moe-emit-plan: kernels-only needs target=cuda");
      return signalPassFailure();
    }
    if (target == "cuda") {
      llvm::Expected<std::vector<std::string>> parsed = moe::cuda::parseArchs(cudaArch);
      if (!parsed) {
        module.emitError(llvm::toString(parsed.takeError()));
        return signalPassFailure();
      }
      archs = std::move(*parsed);
    }
    // What the files and tools say (nvcc, the disk, the planner): unlocated,
    // the message names them.
    if (llvm::Error e = emit()) {
      // No location: the message names the file or the option itself.
      emitError(UnknownLoc::get(&getContext())) << llvm::toString(std::move(e));
      signalPassFailure();
    }
  }

  llvm::Error emit() {
    ModuleOp module = getOperation();
    auto error = [](const llvm::Twine &message) {
      return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
    };
    llvm::Expected<json::Value> plan = moe::buildPlan(module);
    if (!plan)
      return plan.takeError();
    json::Object &root = *plan->getAsObject();
    if (target == "cuda") {
      std::string nvcc, dir;
      if (kernelsOnly) {
        dir = llvm::sys::path::parent_path(output).str();
        if (dir.empty() && !output.empty())
          dir = ".";
      } else {
        nvcc = moe::cuda::findNvcc();
        if (nvcc.empty())
          return error("--target cuda: nvcc not found (set MOE_NVCC, or install the CUDA "
                       "toolkit at /usr/local/cuda; --compile-to=kernels writes the sources "
                       "without nvcc)");
      }
      if (llvm::Error e = moe::cuda::emitPlanKernels(root, dir, nvcc, archs))
        return e;
      if (output.empty())
        return llvm::Error::success(); // the sources went to standard output
    }
    llvm::Expected<std::unique_ptr<moe::PlannedLayout>> layout = moe::recordedLayout(module);
    if (!layout)
      return layout.takeError();
    if (!*layout)
      return moe::writePlanFile(*plan, output);
    const moe::sharding::LayoutEstimate &chosen = (*layout)->result.chosen();
    root["weights"] = moe::logicalWeights(module);
    if (chosen.layout.degrees.world() == 1) {
      moe::mergeDistribution(root, moe::distributionJson((*layout)->model, chosen));
      return moe::writePlanFile(*plan, output);
    }
    // Many ranks: the per-stage programs are in the plan; each rank's entry
    // (coords, program, slices) is streamed.
    root.erase("ranks");
    return moe::writePlanFile(root, output, [&](json::OStream &J) {
      moe::writeDistribution(J, (*layout)->model, chosen);
    });
  }

  std::vector<std::string> archs;
};

} // namespace
