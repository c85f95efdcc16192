//===- Layout.cpp - the sharding planner on a module -------------*- C++ -*-===//
#include "moe/Transforms/Layout.h"
#include "moe/Frontend/HF/ModelConfig.h"

#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Mesh/IR/MeshOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
namespace sh = moe::sharding;

static llvm::Error layoutError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

namespace {

/// One weight's entry: a plain tensor, or each expert's of a stack.
void addWeight(std::vector<moe::hf::TensorSpec> &out, llvm::StringSet<> &seen, StringRef name,
               RankedTensorType type, moe::WeightRole role, std::optional<int64_t> layer,
               int64_t etpDim, DenseI64ArrayAttr fp8Block) {
  using moe::hf::TensorRole;
  using moe::hf::TensorSplit;
  if (!seen.insert(name).second)
    return;
  moe::hf::TensorSpec spec;
  spec.layer = layer.value_or(-1);
  spec.shape.assign(type.getShape().begin(), type.getShape().end());
  // (A weight the IR keeps in f32 in a model of another dtype: the
  // correction bias of DeepSeek's FP8 releases and of --param-dtype bf16.)
  spec.storedF32 = type.getElementType().isF32();
  // An FP8 weight is followed by its block scales (checkpoint order).
  if (fp8Block && fp8Block.size() == 2) {
    spec.fp8BlockRows = fp8Block[0];
    spec.fp8BlockCols = fp8Block[1];
  }
  auto push = [&](moe::hf::TensorSpec s) {
    const bool fp8 = s.isFp8();
    out.push_back(std::move(s));
    if (fp8)
      out.push_back(moe::hf::blockScalesOf(out.back()));
  };
  switch (role) {
  case moe::WeightRole::embedding: spec.role = TensorRole::Embedding; break;
  case moe::WeightRole::lm_head: spec.role = TensorRole::LMHead; break;
  case moe::WeightRole::column: spec.tpSplit = TensorSplit::Column; break;
  case moe::WeightRole::row: spec.tpSplit = TensorSplit::Row; break;
  case moe::WeightRole::replicated: break;
  case moe::WeightRole::experts: {
    // One tensor per expert, as the checkpoint publishes them.
    spec.role = TensorRole::RoutedExperts;
    spec.etpDim = static_cast<int>(etpDim);
    spec.shape.erase(spec.shape.begin());
    const size_t at = name.find("{e}");
    for (int64_t e = 0; e < type.getDimSize(0); ++e) {
      moe::hf::TensorSpec one = spec;
      one.expert = e;
      one.name = (name.take_front(at) + std::to_string(e) + name.drop_front(at + 3)).str();
      push(std::move(one));
    }
    return;
  }
  }
  spec.name = name.str();
  push(std::move(spec));
}

} // namespace

llvm::Expected<std::vector<moe::hf::TensorSpec>> moe::modelWeights(ModuleOp module) {
  std::vector<hf::TensorSpec> out;
  llvm::StringSet<> seen;
  if (auto forward = module.lookupSymbol<func::FuncOp>("forward")) {
    forward.walk([&](moe::WeightOpInterface w) {
      auto stack = dyn_cast<moe::ExpertWeightOp>(w.getOperation());
      addWeight(out, seen, w.getTensorName(),
                cast<RankedTensorType>(w->getResult(0).getType()), w.getWeightRole(),
                w.getDecoderLayer(), stack ? stack.getEtpDimOrDefault() : 0,
                w->getAttrOfType<DenseI64ArrayAttr>("moe.fp8_block"));
    });
    return out;
  }
  auto kept = module->getAttrOfType<ArrayAttr>("moe.logical_weights");
  if (!kept)
    return layoutError("expected func.func @forward or, after moe-partition, "
                       "moe.logical_weights");
  for (Attribute a : kept) {
    auto entry = dyn_cast<DictionaryAttr>(a);
    auto name = entry ? entry.getAs<StringAttr>("name") : nullptr;
    auto type = entry ? entry.getAs<TypeAttr>("type") : nullptr;
    auto ranked = type ? dyn_cast<RankedTensorType>(type.getValue()) : nullptr;
    if (!name || !ranked)
      return layoutError("moe.logical_weights: expected entries with a name and a tensor type");
    auto role = entry.getAs<moe::WeightRoleAttr>("role");
    auto layer = entry.getAs<IntegerAttr>("layer");
    auto etpDim = entry.getAs<IntegerAttr>("etp_dim");
    moe::WeightRole r = role ? role.getValue()
                        : entry.get("experts") ? moe::WeightRole::experts
                                               : moe::WeightRole::replicated;
    addWeight(out, seen, name.getValue(), ranked, r,
              layer ? std::optional<int64_t>(layer.getInt()) : std::nullopt,
              etpDim ? etpDim.getInt() : 0, entry.getAs<DenseI64ArrayAttr>("fp8_block"));
  }
  return out;
}

func::FuncOp moe::pipelineForwardOf(func::FuncOp backward) {
  auto entry = backward->getAttrOfType<StringAttr>("moe.entry");
  auto module = backward->getParentOfType<ModuleOp>();
  if (!entry || entry.getValue() != "train" || !module)
    return {};
  for (auto other : module.getOps<func::FuncOp>()) {
    auto otherEntry = other->getAttrOfType<StringAttr>("moe.entry");
    if (otherEntry && otherEntry.getValue() == "train_forward" &&
        other->getAttr("moe.stage") == backward->getAttr("moe.stage"))
      return other;
  }
  return {};
}

moe::WeightOpInterface moe::weightBehind(Value v) {
  while (Operation *def = v.getDefiningOp()) {
    if (auto w = dyn_cast<moe::WeightOpInterface>(def))
      return w;
    auto shard = dyn_cast<mesh::ShardOp>(def);
    if (!shard)
      return nullptr;
    v = shard.getSrc();
  }
  return nullptr;
}

llvm::Expected<DictionaryAttr> moe::modelSizes(ModuleOp module) {
  auto forward = module.lookupSymbol<func::FuncOp>("forward");
  if (!forward)
    return module->getAttrOfType<DictionaryAttr>("moe.model_sizes");
  // Every op that states a size states the same one.
  std::string conflict;
  llvm::StringMap<int64_t> sizes;
  auto agree = [&](StringRef key, int64_t value) {
    auto [it, inserted] = sizes.try_emplace(key, value);
    if (!inserted && it->second != value && conflict.empty())
      conflict = llvm::formatv("the ops state {0} {1} and {2}", key, it->second, value).str();
  };
  int64_t layers = 0;
  llvm::SmallSetVector<int64_t, 8> expertLayers;
  // Gated MLPs by layer (-1: outside the layers) and width.
  SmallVector<std::pair<int64_t, int64_t>> mlps;
  bool sharedGate = false;
  std::optional<StringRef> dtype; // the embedding table's element type
  std::optional<bool> tied;
  forward.walk([&](Operation *op) {
    if (auto w = dyn_cast<moe::WeightOpInterface>(op)) {
      auto type = cast<RankedTensorType>(op->getResult(0).getType());
      std::optional<int64_t> layer = w.getDecoderLayer();
      if (layer)
        layers = std::max(layers, *layer + 1);
      if (w.getWeightRole() == moe::WeightRole::embedding && type.getRank() == 2) {
        agree("vocab_size", type.getDimSize(0));
        agree("hidden_size", type.getDimSize(1));
        Type element = type.getElementType();
        dtype = element.isBF16() ? "bfloat16" : element.isF16() ? "float16" : "float32";
      }
      if (isa<moe::ExpertWeightOp>(op)) {
        agree("num_experts", type.getDimSize(0));
        if (layer)
          expertLayers.insert(*layer);
      }
    } else if (auto a = dyn_cast<moe::AttentionOp>(op)) {
      agree("num_heads", a.getNumHeads());
      agree("num_kv_heads", a.getNumKvHeads());
      const int64_t headDim =
          a.getNumHeads() > 0 ? a.getQuery().getType().getDimSize(1) / a.getNumHeads() : 0;
      if (a.getNumHeads() > 0)
        agree("head_dim", headDim);
      agree("sliding_window", a.getSlidingWindow().value_or(0));
      // The query's norm before its rotation (Qwen3: per head, OLMoE: the
      // whole row), as hf::QKNorm numbers it.
      Value query = a.getQuery();
      if (auto rope = query.getDefiningOp<moe::RopeOp>())
        query = rope.getInput();
      auto norm = query.getDefiningOp<moe::RMSNormOp>();
      const int64_t group = norm ? norm.getWeight().getType().getNumElements() : 0;
      agree("qk_norm", !norm              ? int64_t(hf::QKNorm::None)
                       : group == headDim ? int64_t(hf::QKNorm::PerHead)
                                          : int64_t(hf::QKNorm::Full));
    } else if (auto m = dyn_cast<moe::MLAttentionOp>(op)) {
      agree("mla_heads", m.getNumHeads());
      agree("qk_nope_head_dim", m.getNopeHeadDim());
      agree("qk_rope_head_dim", m.getRopeHeadDim());
      agree("v_head_dim", m.getValueHeadDim());
      // The LoRA ranks: kv_b's input width; q_b's when the query's linear
      // reads the norm of another linear (q_a), else none (q_proj).
      if (auto kvB = m.getKv().getDefiningOp<moe::LinearOp>())
        agree("kv_lora_rank", kvB.getWeight().getType().getDimSize(1));
      if (auto q = m.getQuery().getDefiningOp<moe::LinearOp>()) {
        auto norm = q.getInput().getDefiningOp<moe::RMSNormOp>();
        agree("q_lora_rank", norm && norm.getInput().getDefiningOp<moe::LinearOp>()
                                 ? q.getWeight().getType().getDimSize(1)
                                 : 0);
      }
    } else if (auto mlp = dyn_cast<moe::MLPOp>(op)) {
      moe::WeightOpInterface gate = weightBehind(mlp.getGateWeight());
      std::optional<int64_t> layer = gate ? gate.getDecoderLayer() : std::nullopt;
      mlps.push_back({layer.value_or(-1), mlp.getGateWeight().getType().getDimSize(0)});
    } else if (isa<moe::SigmoidGateOp>(op)) {
      sharedGate = true;
    } else if (auto linear = dyn_cast<moe::LinearOp>(op)) {
      // The LM head: tied when it multiplies by the embedding's table.
      if (moe::WeightOpInterface w = weightBehind(linear.getWeight())) {
        if (w.getWeightRole() == moe::WeightRole::embedding)
          tied = true;
        else if (w.getWeightRole() == moe::WeightRole::lm_head)
          tied = false;
      }
    } else if (isa<moe::ExpertsOp, moe::ExpertsSavedOp>(op)) {
      // Operand 3: the gate stack [E, I, H] (the same operands in both).
      agree("moe_intermediate_size",
            cast<RankedTensorType>(op->getOperand(3).getType()).getDimSize(1));
    } else if (auto e = dyn_cast<moe::ExpertFFNOp>(op)) {
      agree("moe_intermediate_size", e.getGateWeights().getType().getDimSize(1));
    } else if (isa<moe::RouteOp, moe::RouterOp>(op)) {
      agree("experts_per_token",
            cast<RankedTensorType>(op->getResult(1).getType()).getDimSize(1));
    }
  });
  // Dense MLPs outside the expert layers; in them, the shared experts (one
  // fused MLP; none: width 0) and their gate.
  for (auto [layer, width] : mlps)
    agree(expertLayers.contains(layer) ? "shared_expert_intermediate_size" : "intermediate_size",
          width);
  if (!expertLayers.empty()) {
    sizes.try_emplace("shared_expert_intermediate_size", 0);
    agree("shared_expert_gate", sharedGate ? 1 : 0);
  }
  if (tied)
    agree("tie_word_embeddings", *tied ? 1 : 0);
  if (!conflict.empty())
    return layoutError("not supported yet: " + conflict + " (layers of different shapes)");
  Builder b(module.getContext());
  SmallVector<NamedAttribute> entries;
  for (const auto &entry : sizes)
    entries.push_back(b.getNamedAttr(entry.getKey(), b.getI64IntegerAttr(entry.getValue())));
  if (layers)
    entries.push_back(b.getNamedAttr("num_layers", b.getI64IntegerAttr(layers)));
  if (dtype)
    entries.push_back(b.getNamedAttr("dtype", b.getStringAttr(*dtype)));
  if (!expertLayers.empty())
    entries.push_back(
        b.getNamedAttr("moe_layers", b.getDenseI64ArrayAttr(expertLayers.getArrayRef())));
  return b.getDictionaryAttr(entries);
}

llvm::Error moe::applyModelSizes(DictionaryAttr sizes, hf::ModelConfig &config) {
  if (!sizes)
    return llvm::Error::success();
  for (NamedAttribute entry : sizes) {
    StringRef key = entry.getName().getValue();
    if (key == "moe_layers")
      continue; // after num_layers, below
    if (key == "dtype") {
      auto name = dyn_cast<StringAttr>(entry.getValue());
      if (!name)
        return layoutError("moe.model_sizes: 'dtype' must be a string");
      config.dtype = name.getValue().str();
      continue;
    }
    auto value = dyn_cast<IntegerAttr>(entry.getValue());
    if (!value)
      return layoutError("moe.model_sizes: '" + key + "' must be an integer");
    const int64_t v = value.getInt();
    if (key == "vocab_size") config.vocabSize = v;
    else if (key == "hidden_size") config.hiddenSize = v;
    else if (key == "num_layers") config.numLayers = v;
    else if (key == "num_heads") config.numHeads = v;
    else if (key == "num_kv_heads") config.numKVHeads = v;
    else if (key == "head_dim") config.headDim = v;
    else if (key == "sliding_window")
      config.slidingWindow = v > 0 ? std::optional<int64_t>(v) : std::nullopt;
    else if (key == "mla_heads") config.numHeads = v;
    else if (key == "qk_nope_head_dim") config.qkNopeHeadDim = v;
    else if (key == "qk_rope_head_dim") config.qkRopeHeadDim = v;
    else if (key == "v_head_dim") config.vHeadDim = v;
    else if (key == "num_experts") config.numExperts = v;
    else if (key == "moe_intermediate_size") config.moeIntermediateSize = v;
    else if (key == "experts_per_token") config.expertsPerToken = v;
    else if (key == "intermediate_size") config.intermediateSize = v;
    else if (key == "shared_expert_intermediate_size") config.sharedExpertIntermediateSize = v;
    else if (key == "shared_expert_gate") config.sharedExpertGate = v != 0;
    else if (key == "tie_word_embeddings") config.tieWordEmbeddings = v != 0;
    else if (key == "qk_norm") {
      if (v < 0 || v > int64_t(hf::QKNorm::Full))
        return layoutError("moe.model_sizes: qk_norm " + llvm::Twine(v) + " (expected 0, 1 or 2)");
      config.qkNorm = static_cast<hf::QKNorm>(v);
    }
    else if (key == "kv_lora_rank") config.kvLoraRank = v;
    else if (key == "q_lora_rank") config.qLoraRank = v;
    else
      return layoutError("moe.model_sizes: unknown size '" + key + "'");
  }
  if (auto list = sizes.getAs<DenseI64ArrayAttr>("moe_layers")) {
    config.moeLayers.assign(static_cast<size_t>(config.numLayers), false);
    for (int64_t l : list.asArrayRef()) {
      if (l < 0 || l >= config.numLayers)
        return layoutError("moe.model_sizes: moe layer " + llvm::Twine(l) + " of " +
                           llvm::Twine(config.numLayers));
      config.moeLayers[static_cast<size_t>(l)] = true;
    }
  }
  return llvm::Error::success();
}

llvm::Expected<moe::hf::ModelConfig> moe::moduleConfig(ModuleOp module) {
  auto source = module->getAttrOfType<StringAttr>("moe.source");
  auto text = module->getAttrOfType<StringAttr>("moe.config");
  if (!text && !source)
    return layoutError("expected moe.config or moe.source (the config.json the module was "
                       "imported from)");
  llvm::Expected<hf::ModelConfig> config =
      text ? hf::parseModelConfig(text.getValue(), source ? source.getValue() : "moe.config")
           : hf::loadModelConfig(source.getValue());
  if (!config)
    return config.takeError();
  llvm::Expected<DictionaryAttr> sizes = modelSizes(module);
  if (!sizes)
    return llvm::make_error<llvm::StringError>(config->path + ": " + toString(sizes.takeError()),
                                               llvm::inconvertibleErrorCode());
  if (llvm::Error e = applyModelSizes(*sizes, *config))
    return std::move(e);
  return config;
}

llvm::Expected<moe::PlannedLayout> moe::planLayout(ModuleOp module,
                                                   const LayoutRequest &request) {
  auto workload = module->getAttrOfType<DictionaryAttr>("moe.workload");
  if (!workload)
    return layoutError("expected moe.workload (run moe-specialize-workload first)");
  auto integer = [&](StringRef key) -> int64_t {
    auto v = workload.getAs<IntegerAttr>(key);
    return v ? v.getInt() : 0;
  };
  llvm::Expected<hf::ModelConfig> config = moduleConfig(module);
  if (!config)
    return config.takeError();
  std::optional<sh::DType> dtype;
  if (!request.dtype.empty()) {
    dtype = sh::parseDType(request.dtype);
    if (!dtype)
      return layoutError("--dtype " + request.dtype + ": expected bf16, f16, f32 or fp8");
  }
  llvm::Expected<std::vector<hf::TensorSpec>> weights = modelWeights(module);
  if (!weights)
    return weights.takeError();
  llvm::Expected<sh::ModelInfo> model = sh::ModelInfo::build(*config, std::move(*weights), dtype);
  if (!model)
    return model.takeError();
  llvm::Expected<sh::Cluster> cluster =
      !request.cluster.empty()
          ? sh::loadClusterFile(request.cluster)
          : sh::makeCluster(request.gpu.empty() ? "cpu" : request.gpu,
                            request.worldSize ? request.worldSize : 1);
  if (cluster && !request.cluster.empty() && request.worldSize)
    cluster = sh::withWorldSize(*cluster, request.worldSize);
  if (!cluster)
    return cluster.takeError();
  sh::Workload w{integer("max_batch_tokens"), integer("max_seq_len"), integer("max_sequences")};
  sh::PlanOptions options;
  options.vocabPadTo = request.vocabPadTo;
  options.etpWithinTp = true; // the layout is partitioned (moe-partition)
  // moec compile --fp8-activations dynamic: rank layouts that keep every
  // FP8 input group whole.
  if (auto scheme = module->getAttrOfType<StringAttr>("moe.fp8_activations"))
    options.wholeFp8Groups = scheme.getValue() == "dynamic";
  sh::FixedDegrees fixed;
  auto set = [](std::optional<int64_t> &slot, int64_t v) {
    if (v)
      slot = v;
  };
  set(fixed.dp, request.dp);
  set(fixed.pp, request.pp);
  set(fixed.tp, request.tp);
  set(fixed.ep, request.ep);
  set(fixed.etp, request.etp);
  llvm::Expected<sh::PlanResult> result = sh::planSharding(*model, *cluster, w, options, fixed);
  if (!result)
    return result.takeError();
  return PlannedLayout{std::move(*model), std::move(*cluster), w, std::move(*result)};
}

void moe::setLayoutAttr(ModuleOp module, const LayoutRequest &request,
                        const sh::ShardingLayout &chosen) {
  Builder b(module.getContext());
  const sh::Degrees &d = chosen.degrees;
  SmallVector<NamedAttribute> entries = {
      b.getNamedAttr("world_size", b.getI64IntegerAttr(request.worldSize)),
      b.getNamedAttr("gpu", b.getStringAttr(request.gpu)),
      b.getNamedAttr("cluster", b.getStringAttr(request.cluster)),
      b.getNamedAttr("dtype", b.getStringAttr(request.dtype)),
      b.getNamedAttr("vocab_pad_to", b.getI64IntegerAttr(request.vocabPadTo)),
      b.getNamedAttr("dp", b.getI64IntegerAttr(d.dp)),
      b.getNamedAttr("pp", b.getI64IntegerAttr(d.pp)),
      b.getNamedAttr("tp", b.getI64IntegerAttr(d.tp)),
      b.getNamedAttr("ep", b.getI64IntegerAttr(d.ep)),
      b.getNamedAttr("etp", b.getI64IntegerAttr(d.etp)),
      b.getNamedAttr("stage_begin", b.getDenseI64ArrayAttr(chosen.stageBegin))};
  module->setAttr("moe.layout", b.getDictionaryAttr(entries));
}

llvm::Expected<std::unique_ptr<moe::PlannedLayout>> moe::recordedLayout(ModuleOp module) {
  auto layout = module->getAttrOfType<DictionaryAttr>("moe.layout");
  if (!layout)
    return nullptr;
  LayoutRequest request;
  auto integer = [&](StringRef key, int64_t &slot) -> llvm::Error {
    auto v = layout.getAs<IntegerAttr>(key);
    if (!v)
      return layoutError("moe.layout: expected an integer '" + key + "'");
    slot = v.getInt();
    return llvm::Error::success();
  };
  auto string = [&](StringRef key, std::string &slot) -> llvm::Error {
    auto v = layout.getAs<StringAttr>(key);
    if (!v)
      return layoutError("moe.layout: expected a string '" + key + "'");
    slot = v.getValue().str();
    return llvm::Error::success();
  };
  for (auto [key, slot] : {std::pair<StringRef, int64_t *>{"world_size", &request.worldSize},
                           {"vocab_pad_to", &request.vocabPadTo},
                           {"dp", &request.dp},
                           {"pp", &request.pp},
                           {"tp", &request.tp},
                           {"ep", &request.ep},
                           {"etp", &request.etp}})
    if (llvm::Error e = integer(key, *slot))
      return std::move(e);
  for (auto [key, slot] : {std::pair<StringRef, std::string *>{"gpu", &request.gpu},
                           {"cluster", &request.cluster},
                           {"dtype", &request.dtype}})
    if (llvm::Error e = string(key, *slot))
      return std::move(e);
  auto stages = layout.getAs<DenseI64ArrayAttr>("stage_begin");
  if (!stages)
    return layoutError("moe.layout: expected the stage_begin array");
  llvm::Expected<PlannedLayout> planned = planLayout(module, request);
  if (!planned)
    return planned.takeError();
  if (llvm::ArrayRef<int64_t>(planned->result.chosen().layout.stageBegin) != stages.asArrayRef())
    return layoutError("moe.layout: the planner no longer places the recorded stages");
  return std::make_unique<PlannedLayout>(std::move(*planned));
}

llvm::StringMap<Type> moe::logicalWeightTypes(ModuleOp module) {
  llvm::StringMap<Type> types;
  if (auto all = module->getAttrOfType<ArrayAttr>("moe.logical_weights"))
    for (auto entry : all.getAsRange<DictionaryAttr>())
      if (auto name = entry.getAs<StringAttr>("name"))
        if (auto type = entry.getAs<TypeAttr>("type"))
          types[name.getValue()] = type.getValue();
  return types;
}

ArrayAttr moe::logicalWeightsAttr(func::FuncOp forward) {
  Builder b(forward.getContext());
  SmallVector<Attribute> entries;
  forward.walk([&](Operation *op) {
    SmallVector<NamedAttribute> e;
    if (auto w = dyn_cast<moe::WeightOp>(op)) {
      e = {b.getNamedAttr("name", w.getNameAttr()), b.getNamedAttr("type", TypeAttr::get(w.getType()))};
      if (w.getRoleAttr())
        e.push_back(b.getNamedAttr("role", w.getRoleAttr()));
    } else if (auto w = dyn_cast<moe::ExpertWeightOp>(op)) {
      e = {b.getNamedAttr("name", w.getNameAttr()), b.getNamedAttr("type", TypeAttr::get(w.getType())),
           b.getNamedAttr("experts", b.getI64IntegerAttr(w.getNumExperts()))};
      if (w.getEtpDimAttr())
        e.push_back(b.getNamedAttr("etp_dim", w.getEtpDimAttr()));
    } else {
      return;
    }
    // The planner's inputs after partitioning (moe::modelWeights).
    if (auto layer = cast<moe::WeightOpInterface>(op).getDecoderLayer())
      e.push_back(b.getNamedAttr("layer", b.getI64IntegerAttr(*layer)));
    if (auto block = op->getAttrOfType<DenseI64ArrayAttr>("moe.fp8_block"))
      e.push_back(b.getNamedAttr("fp8_block", block));
    entries.push_back(b.getDictionaryAttr(e));
  });
  return b.getArrayAttr(entries);
}
