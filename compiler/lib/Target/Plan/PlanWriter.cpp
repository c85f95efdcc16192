//===- PlanWriter.cpp - the plan manifest -----------------------*- C++ -*-===//
#include "moe/Target/PlanWriter.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Mesh/IR/MeshOps.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <fcntl.h>
#include <unistd.h>

using namespace mlir;
using llvm::json::Array;
using llvm::json::Object;
using JsonValue = llvm::json::Value;

namespace {

llvm::Error planError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

/// Checkpoint dtype spelling of an element type.
std::string dtypeName(Type type) {
  if (type.isF32()) return "F32";
  if (type.isBF16()) return "BF16";
  if (type.isF16()) return "F16";
  if (type.isInteger(32)) return "I32";
  return "?";
}

Array shapeOf(RankedTensorType type) {
  Array shape;
  for (int64_t d : type.getShape())
    shape.push_back(d);
  return shape;
}

Object ropeJson(moe::RopeAttr rope) {
  return Object{{"kind", moe::stringifyRopeKind(rope.getKind())},
                {"theta", rope.getTheta().convertToDouble()},
                {"rotary_dim", rope.getRotaryDim()},
                {"interleaved", rope.getInterleaved()},
                {"factor", rope.getFactor().convertToDouble()},
                {"original_max_position", rope.getOriginalMaxPosition()},
                {"low_freq_factor", rope.getLowFreqFactor().convertToDouble()},
                {"high_freq_factor", rope.getHighFreqFactor().convertToDouble()},
                {"beta_fast", rope.getBetaFast().convertToDouble()},
                {"beta_slow", rope.getBetaSlow().convertToDouble()},
                {"mscale", rope.getMscale().convertToDouble()},
                {"mscale_all_dim", rope.getMscaleAllDim().convertToDouble()}};
}

Object routingJson(moe::RoutingAttr r) {
  return Object{{"scoring", moe::stringifyScoringFunc(r.getScoring())},
                {"top_k", r.getTopK()},
                {"topk_on", moe::stringifyTopKInput(r.getTopkOn())},
                {"normalize", r.getNormalize()},
                {"scaling_factor", r.getScalingFactor().convertToDouble()},
                {"num_groups", r.getNumGroups()},
                {"topk_groups", r.getTopkGroups()},
                {"group_score", moe::stringifyGroupScore(r.getGroupScore())},
                // Plans of format 1 compute every activation in f32, the
                // router's included, whatever the model's dtype (the IR keeps
                // the reference's compute_type for a later bf16 plan).
                {"compute_type", "F32"}};
}

/// The op-specific attributes of a step.
Object stepAttrs(Operation *op) {
  Object a;
  if (auto kv = op->getAttrOfType<IntegerAttr>("moe.kv_cache"))
    a["kv_cache"] = kv.getInt();
  llvm::TypeSwitch<Operation *>(op)
      .Case([&](moe::RMSNormOp o) { a["eps"] = o.getEpsilon().convertToDouble(); })
      .Case([&](moe::LayerNormOp o) { a["eps"] = o.getEpsilon().convertToDouble(); })
      .Case([&](moe::RopeOp o) {
        a["head_dim"] = o.getHeadDim();
        a["rope"] = ropeJson(o.getRope());
      })
      .Case([&](moe::AttentionOp o) {
        a["heads"] = o.getNumHeads();
        a["kv_heads"] = o.getNumKvHeads();
        a["scale"] = o.getScale().convertToDouble();
        a["sliding_window"] = o.getSlidingWindow() ? *o.getSlidingWindow() : 0;
      })
      .Case([&](moe::MLAttentionOp o) {
        a["heads"] = o.getNumHeads();
        a["scale"] = o.getScale().convertToDouble();
        a["rope"] = ropeJson(o.getRope());
      })
      .Case([&](moe::MLPOp o) { a["activation"] = moe::stringifyActivation(o.getActivation()); })
      .Case([&](moe::ExpertsOp o) {
        a["activation"] = moe::stringifyActivation(o.getActivation());
      })
      .Case([&](moe::RouterOp o) { a["routing"] = routingJson(o.getRouting()); });
  return a;
}

} // namespace

llvm::Expected<JsonValue> moe::buildPlan(ModuleOp module) {
  auto forward = module.lookupSymbol<func::FuncOp>("forward");
  auto workload = module->getAttrOfType<DictionaryAttr>("moe.workload");
  auto widths = module->getAttrOfType<DenseI64ArrayAttr>("moe.buffer_widths");
  auto types = module->getAttrOfType<ArrayAttr>("moe.buffer_types");
  auto argBuffers =
      forward ? forward->getAttrOfType<DenseI64ArrayAttr>("moe.arg_buffers")
              : DenseI64ArrayAttr();
  if (!forward || !workload || !widths || !types || !argBuffers)
    return planError("expected a module with @forward, moe.workload and "
                     "assigned buffers (run the whole pipeline)");
  auto get = [&](StringRef key) {
    return cast<IntegerAttr>(workload.get(key)).getInt();
  };
  int64_t maxTokens = get("max_batch_tokens"), maxSeqLen = get("max_seq_len"),
          maxSequences = get("max_sequences");

  // Weights: one entry per weight op, in order of appearance.
  Array weights;
  DenseMap<Value, int64_t> weightId;
  int64_t weightBytes = 0;
  auto addWeight = [&](Value v, StringRef name, int64_t experts) {
    auto type = cast<RankedTensorType>(v.getType());
    int64_t bytes = type.getNumElements() * (type.getElementTypeBitWidth() / 8);
    Object w{{"name", name},
             {"shape", shapeOf(type)},
             {"dtype", dtypeName(type.getElementType())},
             {"bytes", bytes}};
    if (experts)
      w["experts"] = experts;
    weightId[v] = static_cast<int64_t>(weights.size());
    weights.push_back(std::move(w));
    weightBytes += bytes;
  };

  // Buffers: activations are computed in f32 whatever the weights' type;
  // token ids and routing indices are i32.
  Array buffers;
  int64_t bufferBytes = 0;
  for (auto [width, type] : llvm::zip(widths.asArrayRef(), types)) {
    Type element = cast<TypeAttr>(type).getValue();
    std::string dtype = element.isInteger(32) ? "I32" : "F32";
    int64_t bytes = maxTokens * width * 4;
    buffers.push_back(Object{{"width", width}, {"dtype", dtype}, {"bytes", bytes}});
    bufferBytes += bytes;
  }

  Array steps, caches;
  int64_t cacheBytes = 0;
  DenseMap<Value, int64_t> bufferOf;
  Block &body = forward.getBody().front();
  for (auto [arg, id] : llvm::zip(body.getArguments(), argBuffers.asArrayRef()))
    bufferOf[arg] = id;
  int64_t logitsBuffer = -1;
  for (Operation &op : body) {
    if (auto w = dyn_cast<moe::WeightOp>(op)) {
      addWeight(w, w.getName(), 0);
      continue;
    }
    if (auto w = dyn_cast<moe::ExpertWeightOp>(op)) {
      addWeight(w, w.getName(), w.getNumExperts());
      continue;
    }
    if (auto shard = dyn_cast<mesh::ShardOp>(op)) {
      // A sharding annotation names the same weight.
      if (weightId.count(shard.getSrc()))
        weightId[shard.getResult()] = weightId[shard.getSrc()];
      continue;
    }
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      logitsBuffer = bufferOf.lookup(ret.getOperand(0));
      continue;
    }
    Array in, ws, out;
    for (Value operand : op.getOperands()) {
      if (weightId.count(operand))
        ws.push_back(weightId[operand]);
      else if (bufferOf.count(operand))
        in.push_back(bufferOf[operand]);
      else
        return planError(llvm::formatv("operand of '{0}' has no buffer",
                                       op.getName().getStringRef()));
    }
    auto ids = op.getAttrOfType<DenseI64ArrayAttr>("moe.buffers");
    if (!ids)
      return planError(llvm::formatv("'{0}' has no assigned buffers",
                                     op.getName().getStringRef()));
    for (auto [result, id] : llvm::zip(op.getResults(), ids.asArrayRef())) {
      bufferOf[result] = id;
      out.push_back(id);
    }
    Object step{{"op", op.getName().stripDialect()},
                {"in", std::move(in)},
                {"weights", std::move(ws)},
                {"out", std::move(out)},
                {"attrs", stepAttrs(&op)}};
    if (isa<moe::SplitOp>(op)) {
      Array splitWidths;
      for (Value r : op.getResults())
        splitWidths.push_back(cast<RankedTensorType>(r.getType()).getDimSize(1));
      step.getObject("attrs")->try_emplace("widths", std::move(splitWidths));
    }
    if (op.hasAttr("moe.kv_cache")) {
      int64_t keyWidth, valueWidth;
      if (auto a = dyn_cast<moe::AttentionOp>(op)) {
        keyWidth = a.getKey().getType().getDimSize(1);
        valueWidth = a.getValue().getType().getDimSize(1);
      } else {
        auto m = cast<moe::MLAttentionOp>(op);
        keyWidth = m.getNumHeads() * (m.getNopeHeadDim() + m.getRopeHeadDim());
        valueWidth = m.getNumHeads() * m.getValueHeadDim();
      }
      int64_t bytes = maxSequences * maxSeqLen * (keyWidth + valueWidth) * 4;
      caches.push_back(Object{{"key_width", keyWidth},
                              {"value_width", valueWidth},
                              {"bytes", bytes}});
      cacheBytes += bytes;
    }
    steps.push_back(std::move(step));
  }
  if (logitsBuffer < 0)
    return planError("@forward returns no logits");

  auto str = [&](StringRef key) {
    auto a = module->getAttrOfType<StringAttr>(key);
    return a ? a.getValue().str() : std::string();
  };
  auto integer = [&](StringRef key) {
    auto a = module->getAttrOfType<IntegerAttr>(key);
    return a ? a.getInt() : int64_t(0);
  };
  Array unused;
  if (auto prefixes = module->getAttrOfType<ArrayAttr>("moe.unused_tensor_prefixes"))
    for (Attribute prefix : prefixes)
      unused.push_back(cast<StringAttr>(prefix).getValue());
  Array eos;
  if (auto ids = module->getAttrOfType<DenseI64ArrayAttr>("moe.eos_token_ids"))
    for (int64_t id : ids.asArrayRef())
      eos.push_back(id);

  Object rank{{"rank", 0},
              {"coords", Object{{"dp", 0}, {"pp", 0}, {"tp", 0}, {"ep", 0}, {"etp", 0}}},
              {"buffers", std::move(buffers)},
              {"kv_caches", std::move(caches)},
              {"inputs", Object{{"tokens", argBuffers[0]}, {"positions", argBuffers[1]}}},
              {"logits", logitsBuffer},
              {"memory", Object{{"weights", weightBytes},
                                {"activations", bufferBytes},
                                {"kv_cache", cacheBytes},
                                {"peak", weightBytes + bufferBytes + cacheBytes}}},
              {"steps", std::move(steps)}};
  Array ranks;
  ranks.push_back(std::move(rank));
  return JsonValue(Object{
      {"format", "moe-plan"},
      {"version", kPlanFormatVersion},
      {"producer", "moec"},
      {"model", Object{{"model_type", str("moe.model_type")},
                       {"source", str("moe.source")},
                       {"vocab_size", integer("moe.vocab_size")},
                       {"max_position_embeddings", integer("moe.max_position_embeddings")},
                       {"eos_token_ids", std::move(eos)},
                       {"unused_tensor_prefixes", std::move(unused)}}},
      {"workload", Object{{"max_batch_tokens", maxTokens},
                          {"max_seq_len", maxSeqLen},
                          {"max_sequences", maxSequences}}},
      {"world_size", 1},
      {"degrees", Object{{"dp", 1}, {"pp", 1}, {"tp", 1}, {"ep", 1}, {"etp", 1}}},
      {"weights", std::move(weights)},
      {"ranks", std::move(ranks)}});
}

void moe::mergeDistribution(Object &plan, Object distribution) {
  for (StringRef key : {"world_size", "degrees", "vocab", "stage_begin"})
    plan[key] = std::move(*distribution.get(key));
  Array *ranks = distribution.getArray("ranks");
  if (ranks->size() == 1) {
    Object *program = (*plan.getArray("ranks"))[0].getAsObject();
    Object *rank = (*ranks)[0].getAsObject();
    (*program)["coords"] = std::move(*rank->get("coords"));
    (*program)["planned_memory"] = std::move(*rank->get("memory"));
    (*program)["weights"] = std::move(*rank->get("weights"));
    return;
  }
  plan["ranks"] = std::move(*distribution.get("ranks"));
}

static llvm::Error writeAtomically(llvm::StringRef path,
                                   llvm::function_ref<void(llvm::raw_ostream &)> write);

llvm::Error moe::writePlanFile(const JsonValue &plan, llvm::StringRef path) {
  return writeAtomically(path, [&](llvm::raw_ostream &os) {
    os << llvm::formatv("{0:2}", plan) << "\n";
  });
}

llvm::Error moe::writePlanFile(const Object &plan, llvm::StringRef path,
                               llvm::function_ref<void(llvm::json::OStream &)> more) {
  return writeAtomically(path, [&](llvm::raw_ostream &os) {
    llvm::json::OStream J(os);
    J.object([&] {
      for (const auto &[key, value] : plan)
        J.attribute(key, value);
      more(J);
    });
    os << "\n";
  });
}

static llvm::Error writeAtomically(llvm::StringRef path,
                                   llvm::function_ref<void(llvm::raw_ostream &)> write) {
  llvm::SmallString<256> temp;
  int fd;
  llvm::SmallString<256> model(path);
  model += ".tmp-%%%%%%";
  if (std::error_code ec = llvm::sys::fs::createUniqueFile(model, fd, temp))
    return planError(llvm::formatv("{0}: cannot create a temporary file: {1}",
                                   path, ec.message()));
  {
    llvm::raw_fd_ostream os(fd, /*shouldClose=*/false);
    write(os);
    os.flush();
    if (os.has_error() || ::fsync(fd) != 0) {
      ::close(fd);
      llvm::sys::fs::remove(temp);
      return planError(llvm::formatv("{0}: cannot write the plan", path));
    }
  }
  ::close(fd);
  if (std::error_code ec = llvm::sys::fs::rename(temp, path)) {
    llvm::sys::fs::remove(temp);
    return planError(llvm::formatv("{0}: cannot rename the plan into place: {1}",
                                   path, ec.message()));
  }
  return llvm::Error::success();
}
