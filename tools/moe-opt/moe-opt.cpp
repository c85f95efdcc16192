//===- moe-opt.cpp - mlir-opt for the moe project ---------------*- C++ -*-===//
#include "moe/InitAll.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  moe::registerAllDialects(registry);
  moe::registerAllPasses();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "moe optimizer driver\n", registry));
}
