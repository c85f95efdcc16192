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

/// Set by moe-partition on a `builtin.unrealized_conversion_cast` from a
/// value's part (split along its last dimension over a group) to the whole
/// value, naming the group: `{mesh = @mesh, axis = 2}`. moe-insert-collectives
/// replaces it by an moe.all_gather over that group, and a split that drops
/// the columns past the whole width (a vocabulary padded for tp).
inline constexpr llvm::StringLiteral kGatherAttr = "moe.gather";

/// Set by moe-partition on a stage function's arguments that come from the
/// stage before (`moe.recv_from = s - 1`) and on its results that go to the
/// next one (`moe.send_to = s + 1`); moe-insert-collectives makes them
/// moe.recv at the entry and moe.send before the return, in order.
inline constexpr llvm::StringLiteral kRecvFromAttr = "moe.recv_from";
inline constexpr llvm::StringLiteral kSendToAttr = "moe.send_to";

/// Whether `op` is a mark moe-insert-collectives has still to replace by a
/// collective (a partial-sum annotation or its user's, an moe.exchange, an
/// moe.gather, a function with stage transfers in its signature): lowering
/// or proving a program with one would drop that collective.
bool awaitsCollective(mlir::Operation *op);

#define GEN_PASS_DECL
#include "moe/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "moe/Transforms/Passes.h.inc"

} // namespace moe

#endif // MOE_TRANSFORMS_PASSES_H
