//===- ExecOps.h - the exec dialect: types and ops --------------*- C++ -*-===//
#ifndef MOE_DIALECT_EXEC_IR_EXECOPS_H
#define MOE_DIALECT_EXEC_IR_EXECOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"

#include "moe/Dialect/Exec/IR/ExecDialect.h.inc"

#define GET_TYPEDEF_CLASSES
#include "moe/Dialect/Exec/IR/ExecTypes.h.inc"

#define GET_OP_CLASSES
#include "moe/Dialect/Exec/IR/ExecOps.h.inc"

namespace moe::exec {

/// Whether `a` is a constant a launch may carry: an integer, float, string,
/// bool or unit, or an array or dictionary of those (what every target and
/// the plan's JSON can hold).
bool isPlainConstant(mlir::Attribute a);

} // namespace moe::exec

#endif // MOE_DIALECT_EXEC_IR_EXECOPS_H
