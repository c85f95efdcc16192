//===- Pipelines.h - the compilation phases, in one place --------*- C++ -*-===//
#ifndef MOE_PIPELINES_H
#define MOE_PIPELINES_H

#include "moe/Transforms/Layout.h"

#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/StringRef.h"

#include <optional>
#include <string>

namespace moe {

/// The phases `moec compile --compile-to=<phase>` can stop after.
enum class Phase { Import, Workload, Partition, Buffers, Exec, Plan };
std::optional<Phase> parsePhase(llvm::StringRef name);
/// "import, workload, partition, buffers, plan"
const char *phaseNames();

/// Everything `moec compile` passes to the pipeline.
struct CompileOptions {
  int64_t maxBatchTokens = 512;
  int64_t maxSeqLen = 2048;
  int64_t maxSequences = 8;
  double capacityFactor = 0; ///< 0: dropless
  /// Run the fusion passes (moe-fuse-router, moe-fuse-add-norm); `moec compile --no-fuse`
  /// turns them off.
  bool fuse = true;
  /// The sharding planner (moe-choose-layout) and what it is asked; when
  /// set, the module is partitioned if the machine has more than one rank
  /// or capacity applies.
  std::optional<LayoutRequest> layout;
  bool explain = false, json = false;
  /// With Phase::Plan and an output: moe-emit-plan writes the plan there.
  std::string output, target = "cpu", cudaArch = "sm_80,sm_90";
  /// --compile-to=kernels: the CUDA sources beside the plan (stage<i>.cu),
  /// or on standard output without an output; no nvcc.
  bool kernelsOnly = false;
  /// A decode entry beside the prefill one (moec compile --decode-entry):
  /// the passes after the workload run on each entry's copy of the model
  /// (moe-split-entries / moe-join-entries).
  bool decodeEntry = false;
  /// A training program (moec compile --train): moe-append-loss first, with
  /// its coefficients (auxLossCoef < 0: the config's), then moe-differentiate
  /// unless lossOnly (--loss-only: the loss without the backward pass).
  /// recomputeExperts: moe-differentiate's recompute-experts (moec compile
  /// --recompute experts); recomputeLayers: moe-recompute-layers on the
  /// partitioned programs (--recompute full; over pipeline stages, on the
  /// whole program before moe-partition). recomputeExpertsLayers /
  /// recomputeLayersOnly: only those decoder layers (empty: all), as the
  /// planner chooses per pipeline stage.
  bool train = false, lossOnly = false, recomputeExperts = false, recomputeLayers = false;
  llvm::SmallVector<int64_t> recomputeExpertsLayers, recomputeLayersOnly;
  /// A training plan whose weights compute in another dtype than the
  /// checkpoint's (moec compile --param-dtype bf16 on an f32 checkpoint):
  /// the checkpoint's dtype, which the weight slices keep (moe-choose-layout's
  /// dtype), while the imported module's weights are in the compute dtype.
  std::string checkpointDtype;
  /// The checkpoint stores weights in FP8 blocks (config.json's
  /// quantization_config): the plan always lists each rank's slices, since
  /// only they say how each weight is stored (moe-choose-layout runs for one
  /// rank when no layout is asked for).
  bool storedSlices = false;
  /// "int8" (moec compile --weight-format int8): moe-quantize-weights marks
  /// the matrices moert keeps as int8.
  std::string weightFormat;
  /// FP8 checkpoints: "dynamic" (the default with --target cuda, as the
  /// config's quantization_config.activation_scheme says) when every FP8
  /// GEMM multiplies activations quantised per 1 x 128 (DeepSeek's FP8 GEMM;
  /// moert runs it on cuBLASLt on sm_90, the same numbers elsewhere and on
  /// the CPU), "" when they multiply unquantised activations (moec compile
  /// --fp8-activations none, the default with --target cpu). moe-emit-plan writes it into the plan
  /// (`fp8_activations`) and refuses a layout that cuts a 128-column group.
  std::string fp8Activations;
  double auxLossCoef = -1, zLossCoef = 0;
  /// The optimizer program of a training plan (moec compile --optimizer
  /// adamw): moe-append-optimizer's options.
  struct Optimizer {
    double lr = 1e-3, minLr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0.01,
           clipGradNorm = 0, expertBiasUpdateRate = 1e-3;
    std::string schedule = "constant";
    int64_t warmupSteps = 0, decaySteps = 0, microBatches = 1;
    /// ZeRO stage over the data-parallel replicas (1: the optimizer's
    /// states sharded).
    int64_t zero = 0;
  };
  std::optional<Optimizer> optimizer;
  /// Ranks of the plan one process runs, each on its own thread (moec
  /// compile --train --tp-arithmetic L over --tp T: L / T; the plan's tp is
  /// L). moe-emit-plan writes it into the plan (`ranks_per_process`), and
  /// moert runs the ranks in process as `--in-process` does.
  int64_t ranksPerProcess = 1;
};

/// Adds the passes that take an imported module to `last` (Import adds none).
void buildPipeline(mlir::OpPassManager &pm, const CompileOptions &options, Phase last);

/// Registers `moe-plan-pipeline` (all phases, default workload) and
/// `moe-compile-pipeline` (moec compile's options, ending with the plan
/// file) for moe-opt.
void registerPipelines();

} // namespace moe

#endif // MOE_PIPELINES_H
