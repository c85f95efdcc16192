//===- InitAll.h - register every dialect and pass of the project -*- C++ -*-===//
#ifndef MOE_INITALL_H
#define MOE_INITALL_H

#include "mlir/IR/DialectRegistry.h"

namespace moe {

/// The dialects a `moe` module may contain: moe itself, func, and upstream
/// `mesh` for sharding annotations (docs/sharding.md).
void registerAllDialects(mlir::DialectRegistry &registry);

/// The project's passes and the upstream ones that pipelines use.
void registerAllPasses();

} // namespace moe

#endif // MOE_INITALL_H
