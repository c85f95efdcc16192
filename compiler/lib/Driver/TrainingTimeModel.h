//===- TrainingTimeModel.h - a training update's time on a rank --*- C++ -*-===//
//
// Internal to moec's planner (MoecTrainingLayout.cpp, MoecPipeline.cpp):
// what the backward pass recomputes, the workload of the compiled train
// programs and the time model of an update on a rank (docs/training.md,
// "Choosing ZeRO and recompute").
//
//===----------------------------------------------------------------------===//
#ifndef MOE_DRIVER_TRAININGTIMEMODEL_H
#define MOE_DRIVER_TRAININGTIMEMODEL_H

#include "moe/Analysis/Cluster.h"
#include "moe/Frontend/HF/ModelConfig.h"
#include "moe/Pipelines.h"
#include "moe/Target/PlanWriter.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/Error.h"

namespace moe::driver::timing {

struct Recompute {
  const char *name, *what;
  bool experts, layers;
};
extern const Recompute kNone, kSelective, kFull;

/// What the backward pass may recompute: `options`' choice, or with
/// `automatic` every kind (selective not with a capacity factor).
llvm::SmallVector<Recompute> recomputeCandidates(const CompileOptions &options, bool automatic);

/// What the update's time depends on, from the compiled programs.
struct Workload {
  double parameters = 0;       ///< trained elements
  double weightBytes = 0;      ///< their bytes as the weights hold them
  double active = 0;           ///< multiply-add parameters a token uses
  double activeExperts = 0;    ///< of which in routed experts
  int64_t tensors = 0;         ///< trained tensors (collectives per kind)
  double expertParameters = 0; ///< trained elements of routed expert stacks
  int64_t expertTensors = 0;   ///< routed expert stacks (3 per MoE layer)
  double layers = 0;           ///< decoder layers (the model's, or a stage's)
};

/// The whole model's, or with `stage` >= 0 that pipeline stage's (each
/// weight's logical shape, moe.logical_weights, where a rank holds a part
/// of it (its experts, its TP part); else its shape, an expert stack's 1/ep
/// of the experts scaled by `ep`; `layers` the model's).
Workload workloadOf(mlir::ModuleOp module, const hf::ModelConfig &config, int64_t ep,
                    int64_t stage = -1);

/// One update on a rank, in seconds: nothing overlaps (moert runs each
/// collective between kernels).
struct UpdateTime {
  double compute = 0, optimizer = 0, comm = 0;
  double commBytes = 0; ///< sent by the rank
  double total() const { return compute + optimizer + comm; }
};

/// The time model: forward 2 FLOPs per active parameter and token, the
/// backward pass twice that, a recomputed forward once more (selective:
/// the experts' part), and each micro-batch's gradients added to their
/// compensated sums (5 f32 through memory per parameter it holds; under
/// ZeRO-2 the reduce_scatter's adds) count as compute; AdamW streams its states (about 7 f32
/// per parameter it updates) through memory; and what the rank sends over
/// its link:
/// the fixed-order all_reduce of the sums and errors (4 f32 per parameter
/// x (N - 1) / N; ZeRO-1: its reduce_scatter half), ZeRO's all_gather of
/// the weights ((N - 1) / N of their bytes), ZeRO-2's reduce_scatter per
/// micro-batch instead (2 f32 per parameter x (N - 1) / N each). Expert
/// parallelism over ep of the replicas: a rank holds and updates 1/ep of
/// the routed experts (whose backward recomputes their gate and up
/// products), whose sums (and ZeRO shards) go over edp = N / ep
/// replicas only, and sends (ep - 1) / ep of its routed rows (k per token,
/// H f32 each) four times per MoE layer and micro-batch (the blocks and the
/// outputs, then their gradients). Tensor parallelism over tp ranks of a
/// replica: each computes 1/tp of its FLOPs and holds 1/tp of the dense
/// weights (the experts whole, their sums over edp = N tp / ep), and
/// all_reduces the replica's activations four times per layer and
/// micro-batch (attention's and the MLP's outputs, then their input
/// gradients: 2 (tp - 1) / tp of tokens x H f32 each). `pp`: the pipeline
/// stages whose ranks share the CPU machine too (`w` one stage's).
UpdateTime updateTime(const Workload &w, const sharding::Cluster &machine, int64_t replicas,
                      int64_t tp, int64_t ep, int64_t zero, const Recompute &recompute,
                      double tokensPerMicroBatch, int64_t microBatchesPerReplica, bool bf16,
                      bool optimizer, const hf::ModelConfig &config, int64_t pp = 1);

/// A layout over pipeline stages (options.layout's pp > 1) compiled with
/// recompute `recompute` on every stage (MoecPipeline.cpp): its update (the
/// compute: 1F1B over the stages' micro-batches, bubble included; the
/// slowest stage's optimizer and communication), the bubble's share of
/// the stages' time, and the stage that holds the most memory.
struct PipelineEstimate {
  UpdateTime time;
  double bubble = 0;
  moe::RankProgramMemory memory;
  int64_t stage = 0;
};
llvm::Expected<PipelineEstimate> estimatePipeline(mlir::MLIRContext &context,
                                                  mlir::ModuleOp module,
                                                  const CompileOptions &options,
                                                  const hf::ModelConfig &config,
                                                  const Recompute &recompute);

} // namespace moe::driver::timing

#endif // MOE_DRIVER_TRAININGTIMEMODEL_H
