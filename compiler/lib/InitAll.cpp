//===- InitAll.cpp ----------------------------------------------*- C++ -*-===//
#include "moe/InitAll.h"
#include "moe/Dialect/Exec/IR/ExecOps.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Pipelines.h"
#include "moe/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Mesh/IR/MeshDialect.h"
#include "mlir/Transforms/Passes.h"

void moe::registerAllDialects(mlir::DialectRegistry &registry) {
  registry.insert<moe::MoEDialect, moe::exec::ExecDialect, mlir::func::FuncDialect,
                  mlir::mesh::MeshDialect>();
}

void moe::registerAllPasses() {
  // Upstream canonicalize/cse/symbol-dce etc., then ours (Passes.td).
  mlir::registerTransformsPasses();
  registerMoEPasses();
  registerPipelines();
}
