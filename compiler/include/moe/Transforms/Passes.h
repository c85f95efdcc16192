//===- Passes.h - passes of the moe compiler --------------------*- C++ -*-===//
#ifndef MOE_TRANSFORMS_PASSES_H
#define MOE_TRANSFORMS_PASSES_H

#include "moe/Dialect/Exec/IR/ExecOps.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Dialect/Mesh/IR/MeshDialect.h"
#include "mlir/Pass/Pass.h"

namespace moe {

/// Set by moe-partition on an moe.expert_ffn whose blocks travel to the
/// ranks that hold their experts and back, naming the group:
/// `{mesh = @experts, axis = 2}`. moe-insert-collectives replaces it by an
/// moe.all_to_all over that group before the op and one after.
inline constexpr llvm::StringLiteral kExchangeAttr = "moe.exchange";

/// Whether `op` is a mark moe-insert-collectives has still to replace by a
/// collective (a partial-sum annotation or its user's, an moe.exchange):
/// lowering or proving a program with one would drop that collective.
bool awaitsCollective(mlir::Operation *op);

#define GEN_PASS_DECL
#include "moe/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "moe/Transforms/Passes.h.inc"

} // namespace moe

#endif // MOE_TRANSFORMS_PASSES_H
