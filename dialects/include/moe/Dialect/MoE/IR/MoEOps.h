//===- MoEOps.h - ops and attributes of the moe dialect ---------*- C++ -*-===//
#ifndef MOE_DIALECT_MOE_IR_MOEOPS_H
#define MOE_DIALECT_MOE_IR_MOEOPS_H

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"

#include "moe/Dialect/MoE/IR/MoEEnums.h.inc"

#include "moe/Dialect/MoE/IR/MoEInterfaces.h.inc"

#define GET_ATTRDEF_CLASSES
#include "moe/Dialect/MoE/IR/MoEAttrs.h.inc"

#define GET_OP_CLASSES
#include "moe/Dialect/MoE/IR/MoEOps.h.inc"

namespace moe {
/// moe.experts' checks of its operands, shared with moe.experts_saved.
mlir::LogicalResult verifyExpertsOperands(mlir::Operation *op, mlir::Value input,
                                          mlir::Value weights, mlir::Value experts,
                                          mlir::Value gateWeights, mlir::Value upWeights,
                                          mlir::Value downWeights);
} // namespace moe

#endif // MOE_DIALECT_MOE_IR_MOEOPS_H
