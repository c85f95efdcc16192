// The importer's output for a tiny model: structure checked through the C++
// API (lit tests check the printed form).
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Frontend/HF/Importer.h"
#include "moe/InitAll.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "gtest/gtest.h"

using mlir::DialectRegistry;
using mlir::MLIRContext;
using mlir::Operation;
namespace md = moe;

namespace {

TEST(Importer, WeightsOfTheIRAreTheCheckpointTensors) {
  auto config = moe::hf::parseModelConfig(R"({
    "model_type": "qwen2_moe", "vocab_size": 97, "hidden_size": 64,
    "intermediate_size": 128, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 8,
    "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [1]})",
                                          "qwen/config.json");
  ASSERT_TRUE(static_cast<bool>(config)) << llvm::toString(config.takeError());
  DialectRegistry registry;
  moe::registerAllDialects(registry);
  MLIRContext context(registry);
  auto module = moe::hf::importModel(*config, context);
  ASSERT_TRUE(static_cast<bool>(module)) << llvm::toString(module.takeError());

  // Every checkpoint tensor appears exactly once, per-expert tensors through
  // their stacks, with the same shape.
  std::map<std::string, std::vector<int64_t>> fromIR;
  (**module)->walk([&](Operation *op) {
    if (auto w = llvm::dyn_cast<md::WeightOp>(op)) {
      auto shape = w.getType().getShape();
      EXPECT_TRUE(fromIR.emplace(w.getName().str(),
                                 std::vector<int64_t>(shape.begin(), shape.end()))
                      .second)
          << w.getName().str();
    } else if (auto s = llvm::dyn_cast<md::ExpertWeightOp>(op)) {
      auto shape = s.getType().getShape().drop_front();
      for (int64_t e = 0; e < s.getNumExperts(); ++e)
        EXPECT_TRUE(fromIR.emplace(s.getExpertTensorName(e),
                                   std::vector<int64_t>(shape.begin(), shape.end()))
                        .second);
    }
  });
  std::map<std::string, std::vector<int64_t>> fromLayout;
  for (const auto &t : moe::hf::checkpointTensors(*config))
    fromLayout.emplace(t.name, t.shape);
  EXPECT_EQ(fromIR, fromLayout);

  // The importer's routing: the gate's linear, then moe.route (fused later).
  int routes = 0;
  (**module)->walk([&](md::RouteOp route) {
    ++routes;
    EXPECT_TRUE(route.getLogits().getDefiningOp<md::LinearOp>());
  });
  EXPECT_EQ(routes, 2); // layer 1 is mlp-only
}

TEST(Importer, UnsupportedFamiliesSayWhat) {
  auto config = moe::hf::parseModelConfig(R"({
    "model_type": "granitemoe", "vocab_size": 97, "hidden_size": 64,
    "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
    "num_local_experts": 4, "num_experts_per_tok": 2})",
                                          "granite/config.json");
  ASSERT_TRUE(static_cast<bool>(config));
  MLIRContext context;
  auto module = moe::hf::importModel(*config, context);
  ASSERT_FALSE(static_cast<bool>(module));
  EXPECT_EQ(llvm::toString(module.takeError()),
            "granite/config.json: not supported yet: fused expert tensors and "
            "embedding/residual/logit multipliers (granitemoe)");
}

} // namespace
