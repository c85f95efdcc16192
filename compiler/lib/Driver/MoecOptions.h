//===- MoecOptions.h - what moec's driver files share ------------*- C++ -*-===//
//
// Internal to moec (Moec.cpp, MoecTraining.cpp): the compile subcommand that
// both files' options belong to, and the handling of the training options.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_DRIVER_MOECOPTIONS_H
#define MOE_DRIVER_MOECOPTIONS_H

#include "moe/Frontend/HF/ModelConfig.h"
#include "moe/Pipelines.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Error.h"

namespace moe::driver {

/// `moec compile` (a function so that the options of either file register
/// with it whatever the order of static initialisation).
llvm::cl::SubCommand &compileSubcommand();

/// --train and its options into `options` (the workload of one step, the
/// loss, --recompute, the optimizer); what training does not do yet is
/// refused, and so is any of `workloadOptions` (a step is --micro-batch-size
/// x --seq-len tokens).
llvm::Error trainingOptions(CompileOptions &options, const hf::ModelConfig &config,
                            bool distribution,
                            llvm::ArrayRef<llvm::cl::Option *> workloadOptions);

/// --recompute auto for a training plan: the training memory model
/// (moe::rankProgramMemory of the programs compiled with every intermediate
/// saved, then selective, then full) against --memory-budget sets
/// options.recomputeExperts / recomputeLayers; with --explain, the model of
/// the choice is printed (of a given choice too). Nothing for other plans.
llvm::Error chooseRecompute(mlir::MLIRContext &context, mlir::ModuleOp module,
                            CompileOptions &options);

} // namespace moe::driver

#endif // MOE_DRIVER_MOECOPTIONS_H
