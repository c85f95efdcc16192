//===- PlanSharding.cpp - weights annotated with their sharding -*- C++ -*-===//
#include "moe/Analysis/Planner.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Frontend/HF/ModelConfig.h"
#include "moe/Transforms/Passes.h"
#include "moe/Transforms/Layout.h"

#include "mlir/Dialect/Mesh/IR/MeshOps.h"
#include "mlir/IR/Builders.h"


namespace moe {
#define GEN_PASS_DEF_MOEPLANSHARDING
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;
using mesh::MeshAxis;

namespace {

// Axes of the two meshes (docs/sharding.md).
constexpr MeshAxis kTpAxis = 2;     // @mesh: PP x DP x TP
constexpr MeshAxis kEpAxis = 2;     // @experts: PP x EDP x EP x ETP
constexpr MeshAxis kEtpAxis = 3;

struct PlanSharding : moe::impl::MoEPlanShardingBase<PlanSharding> {
  using MoEPlanShardingBase::MoEPlanShardingBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto config = moe::moduleConfig(module);
    if (!config) {
      module.emitError(llvm::toString(config.takeError()));
      return signalPassFailure();
    }
    auto weights = moe::modelWeights(module);
    if (!weights) {
      module.emitError(llvm::toString(weights.takeError()));
      return signalPassFailure();
    }
    auto info = moe::sharding::ModelInfo::build(*config, std::move(*weights));
    if (!info) {
      module.emitError(llvm::toString(info.takeError()));
      return signalPassFailure();
    }
    std::vector<int64_t> stages(stageBegin.begin(), stageBegin.end());
    if (failed(moe::applySharding(module, *info, {dp, pp, tp, ep, etp}, vocabPadTo, stages)))
      signalPassFailure();
  }
};

} // namespace

LogicalResult moe::applySharding(ModuleOp module, const moe::sharding::ModelInfo &info,
                                 moe::sharding::Degrees d, int64_t vocabPadTo,
                                 std::vector<int64_t> stages) {
  int64_t world = d.world();
  moe::sharding::FixedDegrees fixed{d.dp, d.pp, d.tp, d.ep, d.etp};
  if (llvm::Error e = moe::sharding::validateFixedDegrees(info, world, fixed)) {
    module.emitError(llvm::toString(std::move(e)));
    return failure();
  }
  if (stages.empty())
    for (int64_t s = 0; s < d.pp; ++s)
      stages.push_back(s * info.config.numLayers / d.pp);
  if (static_cast<int64_t>(stages.size()) != d.pp || stages.front() != 0 ||
      !llvm::is_sorted(stages) ||
      std::adjacent_find(stages.begin(), stages.end()) != stages.end() ||
      stages.back() >= info.config.numLayers) {
    module.emitError("expected stage-begin to list ")
        << d.pp << " increasing first layers starting at 0";
    return failure();
  }

  OpBuilder b(module.getContext());
  b.setInsertionPointToStart(module.getBody());
  b.create<mesh::MeshOp>(module.getLoc(), "mesh",
                         ArrayRef<int64_t>{d.pp, d.dp, d.tp});
  b.create<mesh::MeshOp>(module.getLoc(), "experts",
                         ArrayRef<int64_t>{d.pp, d.edp(), d.ep, d.etp});
  auto meshRef = FlatSymbolRefAttr::get(module.getContext(), "mesh");
  auto expertsRef = FlatSymbolRefAttr::get(module.getContext(), "experts");

  auto annotate = [&](Operation *op, FlatSymbolRefAttr on,
                      SmallVector<SmallVector<MeshAxis>> axes) {
    Value weight = op->getResult(0);
    b.setInsertionPointAfter(op);
    auto sharding = mesh::MeshShardingAttr::get(module.getContext(), on, axes);
    auto shard = b.create<mesh::ShardOp>(op->getLoc(), weight, sharding);
    weight.replaceAllUsesExcept(shard.getResult(), shard);
  };
  // Each weight's role (the importer's, moe::WeightOpInterface) says how
  // it is split: column-parallel and vocabulary rows over TP on dim 0,
  // row-parallel over TP on dim 1, an expert stack over EP on dim 0 and over
  // ETP on its experts' etp_dim.
  WalkResult walk = module.walk([&](Operation *op) -> WalkResult {
    if (auto s = dyn_cast<moe::ExpertWeightOp>(op)) {
      SmallVector<SmallVector<MeshAxis>> axes = {{kEpAxis}, {}, {}};
      axes[1 + s.getEtpDimOrDefault()] = {kEtpAxis};
      annotate(op, expertsRef, axes);
      return WalkResult::advance();
    }
    auto w = dyn_cast<moe::WeightOp>(op);
    if (!w)
      return WalkResult::advance();
    switch (w.getWeightRole()) {
    case moe::WeightRole::column:
    case moe::WeightRole::embedding:
    case moe::WeightRole::lm_head:
      annotate(op, meshRef, {{kTpAxis}});
      break;
    case moe::WeightRole::row:
      annotate(op, meshRef, {{}, {kTpAxis}});
      break;
    case moe::WeightRole::replicated:
    case moe::WeightRole::experts:
      annotate(op, meshRef, {{}});
      break;
    }
    return WalkResult::advance();
  });
  if (walk.wasInterrupted())
    return failure();

  moe::sharding::ShardingLayout layout;
  layout.degrees = d;
  int64_t padded = moe::sharding::paddedVocabSize(info.config.vocabSize, d.tp, vocabPadTo);
  module->setAttr(
      "moe.sharding",
      b.getDictionaryAttr({
          b.getNamedAttr("dp", b.getI64IntegerAttr(d.dp)),
          b.getNamedAttr("pp", b.getI64IntegerAttr(d.pp)),
          b.getNamedAttr("tp", b.getI64IntegerAttr(d.tp)),
          b.getNamedAttr("ep", b.getI64IntegerAttr(d.ep)),
          b.getNamedAttr("etp", b.getI64IntegerAttr(d.etp)),
          b.getNamedAttr("vocab_pad_to", b.getI64IntegerAttr(vocabPadTo)),
          b.getNamedAttr("vocab_padded", b.getI64IntegerAttr(padded)),
          b.getNamedAttr("stage_begin", b.getDenseI64ArrayAttr(stages)),
      }));
  return success();
}
