//===- EmitPlan.cpp - the plan file, as the last pass ------------*- C++ -*-===//
//
// moe-emit-plan: buildPlan (PlanWriter.h) of the exec programs, the target's
// part (TargetBackend.h: the CUDA kernels for target=cuda), the distribution of `moe.layout` (Layout.h, Distribution.h),
// written atomically. `moec compile -o` and `moe-opt --moe-compile-pipeline=
// "output=..."` both end with it, so they write the same bytes.
//
//===----------------------------------------------------------------------===//
#include "moe/Target/Distribution.h"
#include "moe/Target/PlanWriter.h"
#include "moe/Target/TargetBackend.h"
#include "moe/Transforms/Layout.h"
#include "moe/Transforms/Passes.h"

#include "mlir/IR/Diagnostics.h"

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
    backend = moe::lookupTargetBackend(target);
    if (!backend) {
      module.emitError("moe-emit-plan: unknown target '")
          << target << "' (expected " << moe::targetBackendNames() << ")";
      return signalPassFailure();
    }
    options.output = output;
    options.cudaArch = cudaArch;
    options.kernelsOnly = kernelsOnly;
    if (llvm::Error e = backend->checkOptions(options)) {
      module.emitError(llvm::toString(std::move(e)));
      return signalPassFailure();
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
    llvm::Expected<json::Value> plan = moe::buildPlan(module);
    if (!plan)
      return plan.takeError();
    json::Object &root = *plan->getAsObject();
    // moec compile --tp-arithmetic: the ranks each process runs.
    if (auto perProcess = module->getAttrOfType<IntegerAttr>("moe.ranks_per_process"))
      root["ranks_per_process"] = perProcess.getInt();
    // moec compile's FP8 activation scheme (--fp8-activations).
    auto fp8Activations = module->getAttrOfType<StringAttr>("moe.fp8_activations");
    if (fp8Activations)
      root["fp8_activations"] = fp8Activations.getValue();
    if (llvm::Error e = backend->serialize(module, root, options))
      return e;
    if (output.empty())
      return llvm::Error::success(); // kernels-only: the sources went to standard output
    llvm::Expected<std::unique_ptr<moe::PlannedLayout>> layout = moe::recordedLayout(module);
    if (!layout)
      return layout.takeError();
    if (!*layout)
      return moe::writePlanFile(*plan, output);
    const moe::sharding::LayoutEstimate &chosen = (*layout)->result.chosen();
    root["weights"] = moe::logicalWeights(module);
    // The planner's search (moe-choose-layout), for moec report.
    if (auto search = module->getAttrOfType<StringAttr>("moe.planner")) {
      llvm::Expected<json::Value> parsed = json::parse(search.getValue());
      if (!parsed)
        return parsed.takeError();
      root["planner"] = std::move(*parsed);
    }
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

  const moe::TargetBackend *backend = nullptr;
  moe::TargetOptions options;
};

} // namespace
