//===- Importer.h - config.json -> moe IR -----------------------*- C++ -*-===//
#ifndef MOE_FRONTEND_HF_IMPORTER_H
#define MOE_FRONTEND_HF_IMPORTER_H

#include "moe/Frontend/HF/ModelConfig.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace moe::hf {

/// Builds the `moe` IR of the whole model: one `func.func @forward(%tokens,
/// %positions) -> logits`, weights by checkpoint name. Fails with
/// "<path>: not supported yet: <feature>" for families that are only parsed.
llvm::Expected<mlir::OwningOpRef<mlir::ModuleOp>>
importModel(const ModelConfig &config, mlir::MLIRContext &context);

} // namespace moe::hf

#endif // MOE_FRONTEND_HF_IMPORTER_H
