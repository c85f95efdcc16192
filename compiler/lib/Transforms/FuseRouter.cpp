//===- FuseRouter.cpp - moe.linear + moe.route -> moe.router -----*- C++ -*-===//
//
// moe-fuse-router: the router epilogue fusion. The importer emits a MoE
// layer's routing as the gate's logits (moe.linear) and the routing
// (moe.route); this pass folds the pair into moe.router, whose kernels
// compute the logits into scratch and route them in one step.
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/SmallVector.h"

namespace moe {
#define GEN_PASS_DEF_MOEFUSEROUTER
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;

namespace {

struct FuseRouterPass : moe::impl::MoEFuseRouterBase<FuseRouterPass> {
  void runOnOperation() override {
    llvm::SmallVector<moe::RouteOp> routes;
    getOperation().walk([&](moe::RouteOp route) { routes.push_back(route); });
    for (moe::RouteOp route : routes) {
      auto linear = route.getLogits().getDefiningOp<moe::LinearOp>();
      if (!linear || linear.getBias() || !linear->hasOneUse())
        continue;
      OpBuilder b(route);
      auto router = b.create<moe::RouterOp>(
          route.getLoc(), route.getWeights().getType(), route.getExperts().getType(),
          linear.getInput(), linear.getWeight(), route.getCorrectionBias(), route.getRouting());
      route.getWeights().replaceAllUsesWith(router.getWeights());
      route.getExperts().replaceAllUsesWith(router.getExperts());
      route.erase();
      linear.erase();
    }
  }
};

} // namespace
