// A small Mixtral-like model imported into a context, for the compiler's
// unit tests that need a whole module (CudaTargetTest, PlanSchemaTest).
#pragma once

#include "moe/Frontend/HF/Importer.h"
#include "moe/InitAll.h"

#include "mlir/IR/MLIRContext.h"
#include "gtest/gtest.h"

namespace moe::test {

/// A context with every dialect of the compiler.
inline std::unique_ptr<mlir::MLIRContext> makeContext() {
  mlir::DialectRegistry registry;
  registerAllDialects(registry);
  return std::make_unique<mlir::MLIRContext>(registry);
}

/// Two layers, 8 experts of top-2, vocabulary 97, 128 positions.
inline mlir::OwningOpRef<mlir::ModuleOp> importTinyMixtral(mlir::MLIRContext &context) {
  auto config = hf::parseModelConfig(R"({
    "model_type": "mixtral", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 48,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 128})",
                                     "mixtral/config.json");
  EXPECT_TRUE(static_cast<bool>(config)) << llvm::toString(config.takeError());
  auto module = hf::importModel(*config, context);
  EXPECT_TRUE(static_cast<bool>(module)) << llvm::toString(module.takeError());
  return std::move(*module);
}

} // namespace moe::test
