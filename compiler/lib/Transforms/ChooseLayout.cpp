//===- ChooseLayout.cpp - the sharding planner as a pass ---------*- C++ -*-===//
//
// moe-choose-layout: searches the layouts (Planner.h), records the choice as
// `moe.layout` (Layout.h) and applies it as moe-plan-sharding does.
//
//===----------------------------------------------------------------------===//
#include "moe/Target/Distribution.h"
#include "moe/Transforms/Layout.h"
#include "moe/Transforms/Passes.h"

#include "mlir/Dialect/Mesh/IR/MeshOps.h"
#include "llvm/Support/raw_ostream.h"

namespace moe {
#define GEN_PASS_DEF_MOECHOOSELAYOUT
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;

namespace {

struct ChooseLayout : moe::impl::MoEChooseLayoutBase<ChooseLayout> {
  using MoEChooseLayoutBase::MoEChooseLayoutBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    moe::LayoutRequest request;
    request.worldSize = worldSize;
    request.gpu = gpu;
    request.cluster = cluster;
    request.dtype = dtype;
    request.dp = dp;
    request.pp = pp;
    request.tp = tp;
    request.ep = ep;
    request.etp = etp;
    request.vocabPadTo = vocabPadTo;
    // What the module lacks: at the module.
    if (!module->hasAttr("moe.config") && !module->hasAttr("moe.source")) {
      module.emitError("expected moe.config or moe.source (the config.json the module was "
                       "imported from)");
      return signalPassFailure();
    }
    if (!module->hasAttr("moe.workload")) {
      module.emitError("expected moe.workload (run moe-specialize-workload first)");
      return signalPassFailure();
    }
    llvm::Expected<moe::PlannedLayout> planned = moe::planLayout(module, request);
    if (!planned) {
      // No location: the planner's message names the option or the file.
      emitError(UnknownLoc::get(&getContext())) << llvm::toString(planned.takeError());
      return signalPassFailure();
    }
    const moe::sharding::LayoutEstimate &chosen = planned->result.chosen();
    if (explain)
      llvm::outs() << moe::sharding::explainPlan(planned->model, planned->cluster,
                                                 planned->workload, planned->result);
    if (json) {
      // Streamed: a many-rank layout has too many slices for a JSON tree.
      llvm::json::OStream J(llvm::outs());
      J.object([&] {
        moe::writeDistribution(J, planned->model, chosen);
        J.attribute("search", moe::sharding::toJSON(planned->result));
      });
      llvm::outs() << "\n";
    }
    moe::setLayoutAttr(module, request, chosen.layout);
    // The search, for the plan's report (moec report): the chosen layout's
    // time and memory per stage, the alternatives, the rejections and the
    // machine. Compact JSON; the search's wall time is left out (the plan's
    // bytes depend only on its inputs).
    llvm::json::Value search = moe::sharding::toJSON(planned->result);
    llvm::json::Object &o = *search.getAsObject();
    o.erase("search_seconds");
    const moe::sharding::Cluster &c = planned->cluster;
    o["cluster"] = llvm::json::Object{{"name", c.name},
                                      {"description", c.description},
                                      {"nodes", c.nodes},
                                      {"devices_per_node", c.devicesPerNode},
                                      {"memory_bytes", c.memoryBytes}};
    std::string text;
    llvm::raw_string_ostream(text) << search;
    module->setAttr("moe.planner", StringAttr::get(&getContext(), text));

    const moe::sharding::ShardingLayout &layout = chosen.layout;
    // The layout also lists the end (num layers); the annotation takes the firsts.
    std::vector<int64_t> firsts(layout.stageBegin.begin(), layout.stageBegin.end() - 1);
    if (failed(moe::applySharding(module, planned->model, layout.degrees, layout.vocabPadTo,
                                  firsts)))
      return signalPassFailure();
  }
};

} // namespace
