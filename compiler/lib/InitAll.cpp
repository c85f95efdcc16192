//===- InitAll.cpp ----------------------------------------------*- C++ -*-===//
#include "moe/InitAll.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Mesh/IR/MeshDialect.h"
#include "mlir/Transforms/Passes.h"

void moe::registerAllDialects(mlir::DialectRegistry &registry) {
  registry.insert<mlir::moe::MoEDialect, mlir::func::FuncDialect,
                  mlir::mesh::MeshDialect>();
}

void moe::registerAllPasses() {
  // Upstream canonicalize/cse/symbol-dce etc.; the project's own passes join
  // here as they land (one def each in Transforms/Passes.td).
  mlir::registerTransformsPasses();
}
