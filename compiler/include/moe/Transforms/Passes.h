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

/// A pipelined training program (docs/training.md, "Pipeline parallelism"):
/// set by moe-partition on a stage's forward function's result and its
/// backward function's argument that carry the same value from one to the
/// other on the rank (`moe.stash = i`, the i-th of the stage). The exec
/// programs hold it in state `stash:<i>`, one slot per micro-batch in
/// flight.
inline constexpr llvm::StringLiteral kStashAttr = "moe.stash";

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
