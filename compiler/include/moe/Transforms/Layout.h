//===- Layout.h - the sharding planner on a module --------------*- C++ -*-===//
//
// What moe-choose-layout asks of the planner (compiler/include/moe/Analysis/
// Planner.h) and records on the module (`moe.layout`), so that the passes
// after it (moe-plan-sharding, run by it; moe-emit-plan, which writes each
// rank's slices and memory) work from the module alone.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_TRANSFORMS_LAYOUT_H
#define MOE_TRANSFORMS_LAYOUT_H

#include "moe/Analysis/Planner.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"

#include <string>

namespace moe {

/// The request: the machine (built-in gpu kind and world size, or a cluster
/// file), fixed degrees (0: free), the weight dtype the planner counts
/// ("": the config's) and the vocabulary padding.
struct LayoutRequest {
  int64_t worldSize = 0;
  std::string gpu, cluster, dtype;
  int64_t dp = 0, pp = 0, tp = 0, ep = 0, etp = 0;
  int64_t vocabPadTo = 64;
};

/// The model as the planner sizes it: config.json of the module (`moe.config`,
/// the text the importer kept, else the file `moe.source` names: a
/// hand-written module) with the sizes its ops state taken from the ops
/// (modelSizes).
llvm::Expected<hf::ModelConfig> moduleConfig(mlir::ModuleOp module);

/// The sizes the ops of `module`'s @forward state, as a dictionary
/// (`moe.model_sizes`, which moe-partition keeps when it replaces @forward;
/// null when neither is there): vocab_size and hidden_size (the embedding's
/// table), num_layers (the weights' layers), num_heads, num_kv_heads,
/// head_dim, sliding_window (moe.attention; 0: none) and qk_norm (the
/// query's moe.rms_norm before its rope, as hf::QKNorm: 0 none, 1 per head,
/// 2 the whole row) or mla_heads and
/// MLA's head widths (moe.mla_attention), num_experts, moe_layers (the
/// expert stacks), moe_intermediate_size (the routed experts' gate
/// weights), experts_per_token (the routing's result), kv_lora_rank and
/// q_lora_rank (MLA's kv_b / q_b), intermediate_size and
/// shared_expert_intermediate_size (moe.mlp outside / inside the expert
/// layers), shared_expert_gate (moe.sigmoid_gate), tie_word_embeddings
/// (the head multiplies by the embedding's table), and dtype (a string: the
/// embedding table's element type as torch names it). Fails naming the size
/// when two ops disagree (layers of different shapes are not supported yet).
llvm::Expected<mlir::DictionaryAttr> modelSizes(mlir::ModuleOp module);
/// The moe.weight / moe.expert_weight behind `v`, through its sharding
/// annotations (mesh.shard); null for any other value.
moe::WeightOpInterface weightBehind(mlir::Value v);
/// A pipeline stage's backward function's forward function (entry
/// "train_forward", the same moe.stage), or null: also for a function that
/// is not a backward one (entry "train").
mlir::func::FuncOp pipelineForwardOf(mlir::func::FuncOp backward);

/// `sizes` (modelSizes) over the config's.
llvm::Error applyModelSizes(mlir::DictionaryAttr sizes, hf::ModelConfig &config);

/// The model's weights as the planner classifies them: each moe.weight /
/// moe.expert_weight of @forward (a stack as one tensor per expert) with the
/// role and layer the importer recorded (moe::WeightOpInterface), or, in a
/// partitioned module, the same from `moe.logical_weights`. In program
/// order, each name once.
llvm::Expected<std::vector<hf::TensorSpec>> modelWeights(mlir::ModuleOp module);

/// The weights of `forward` (name, type, experts of each, role, layer and
/// etp_dim as the ops have them, in order), as moe-partition and
/// moe-lower-to-exec keep them on the module (`moe.logical_weights`) for the
/// plan's top-level weights and the planner once @forward is gone.
mlir::ArrayAttr logicalWeightsAttr(mlir::func::FuncOp forward);

/// The whole model's type of each weight `module` keeps in
/// moe.logical_weights, by its name (an expert stack's all experts; empty
/// without the attribute): the shape a rank's part of it is a part of.
llvm::StringMap<mlir::Type> logicalWeightTypes(mlir::ModuleOp module);

/// The planner's search for `module` (the config.json of its moe.source for
/// the model's sizes, its weights' roles, the workload of its moe.workload).
struct PlannedLayout {
  sharding::ModelInfo model;
  sharding::Cluster cluster;
  sharding::Workload workload;
  sharding::PlanResult result;
};
llvm::Expected<PlannedLayout> planLayout(mlir::ModuleOp module, const LayoutRequest &request);

/// Records the request with the chosen degrees and stages as `moe.layout`.
void setLayoutAttr(mlir::ModuleOp module, const LayoutRequest &request,
                   const sharding::ShardingLayout &chosen);

/// The layout moe-choose-layout recorded, searched again with its degrees
/// fixed (the same estimate: the planner is deterministic); fails when the
/// module has none or the search no longer gives the recorded stages.
/// Null when the module has no `moe.layout`.
llvm::Expected<std::unique_ptr<PlannedLayout>> recordedLayout(mlir::ModuleOp module);

/// moe-plan-sharding's work: the two meshes, a mesh.shard after every
/// weight, `moe.sharding`. `stages`: the first layer of each stage (empty:
/// an even split). Emits the error and fails on degrees the model does not
/// divide or stages that do not fit.
mlir::LogicalResult applySharding(mlir::ModuleOp module, const sharding::ModelInfo &model,
                                  sharding::Degrees degrees, int64_t vocabPadTo,
                                  std::vector<int64_t> stages);

} // namespace moe

#endif // MOE_TRANSFORMS_LAYOUT_H
