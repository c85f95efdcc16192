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

/// --recompute auto and --zero auto for a training plan
/// (chooseTrainingLayout with this file's options).
llvm::Error chooseRecompute(mlir::MLIRContext &context, mlir::ModuleOp module,
                            CompileOptions &options, const hf::ModelConfig &config);

/// What chooseTrainingLayout may choose and within what.
struct TrainingChoice {
  bool recomputeAuto = false, zeroAuto = false;
  /// No --ep over replicas: expert parallelism is the planner's choice too.
  bool expertsAuto = false;
  /// --world-size N alone: tensor parallelism and pipeline stages (and with
  /// them dp) too.
  bool tensorAuto = false;
  int64_t budget = 0; ///< bytes a rank may hold (0: 90% of the CPU machine's share)
  const hf::ModelConfig *config = nullptr;
};

/// The planner's training mode (MoecTrainingLayout.cpp): each candidate
/// (ZeRO stage where zeroAuto over data-parallel replicas, recompute none /
/// selective / full where recomputeAuto) gets the training memory model of
/// its compiled programs (moe::rankProgramMemory) and a time model of an
/// update; the fastest that fits the budget is set in `options` (none
/// fits: the least memory, with a note). With --explain every candidate
/// and the choice's memory are printed, with the share of the update that
/// is communication not overlapped. Nothing for other plans.
llvm::Error chooseTrainingLayout(mlir::MLIRContext &context, mlir::ModuleOp module,
                                 CompileOptions &options, const TrainingChoice &request);

/// The planner's training mode over pipeline stages (MoecPipeline.cpp):
/// with recomputeAuto, each stage's recompute, the fastest whose memory
/// fits the budget (options' recomputeExpertsLayers / recomputeLayersOnly
/// where stages differ); --explain prints each stage's memory and time and
/// the update's 1F1B bubble.
llvm::Error choosePipelineRecompute(mlir::MLIRContext &context, mlir::ModuleOp module,
                                    CompileOptions &options, const TrainingChoice &request);

} // namespace moe::driver

#endif // MOE_DRIVER_MOECOPTIONS_H
