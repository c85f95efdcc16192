//===- Passes.h - passes of the moe compiler --------------------*- C++ -*-===//
#ifndef MOE_TRANSFORMS_PASSES_H
#define MOE_TRANSFORMS_PASSES_H

#include "moe/Dialect/Exec/IR/ExecOps.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Dialect/Mesh/IR/MeshDialect.h"
#include "mlir/Pass/Pass.h"

namespace moe {

#define GEN_PASS_DECL
#include "moe/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "moe/Transforms/Passes.h.inc"

} // namespace moe

#endif // MOE_TRANSFORMS_PASSES_H
