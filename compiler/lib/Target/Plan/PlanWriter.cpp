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

#include <cerrno>
#include <cstring>

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
                {"truncate", rope.getTruncate()},
                {"attention_factor", rope.getAttentionFactor().convertToDouble()}};
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
      .Case([&](moe::AddNormOp o) {
        a["eps"] = o.getEpsilon().convertToDouble();
        a["norm"] = o.getLayer() ? "layer_norm" : "rms_norm";
      })
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
      .Case([&](moe::ExpertFFNOp o) {
        a["activation"] = moe::stringifyActivation(o.getActivation());
      })
      .Case([&](moe::DispatchOp o) {
        a["num_experts"] = o.getNumExperts();
        a["capacity"] = o.getCapacity();
        a["capacity_factor"] = o.getCapacityFactor().convertToDouble();
        a["top_k"] = o.getExperts().getType().getDimSize(1);
        a["row_parts"] = o.getRowParts();
        a["row_part_stride"] = o.getRowPartStride();
      })
      .Case([&](moe::EmbeddingOp o) {
        if (o->hasAttr("moe.vocab_shard"))
          a["vocab_shard"] = true;
      })
      .Case([&](moe::SendOp o) { a["stage"] = o.getStage(); })
      .Case([&](moe::RecvOp o) { a["stage"] = o.getStage(); })
      .Case([&](moe::ExpertsOp o) {
        a["activation"] = moe::stringifyActivation(o.getActivation());
      })
      .Case([&](moe::RouterOp o) { a["routing"] = routingJson(o.getRouting()); })
      .Case([&](moe::RouteOp o) { a["routing"] = routingJson(o.getRouting()); });
  return a;
}

} // namespace

namespace {

const char *axisName(StringRef mesh, int64_t axis) {
  static const char *attention[] = {"pp", "dp", "tp"};
  static const char *experts[] = {"pp", "edp", "ep", "etp"};
  if (mesh == "experts")
    return axis < 4 ? experts[axis] : "?";
  return axis < 3 ? attention[axis] : "?";
}

/// The LM head: the linear whose result the program returns, directly or
/// through the all_gather / split that join its vocabulary parts.
Operation *headOf(func::FuncOp fn) {
  auto ret = cast<func::ReturnOp>(fn.getBody().front().getTerminator());
  if (ret.getNumOperands() != 1)
    return nullptr;
  Value v = ret.getOperand(0);
  while (Operation *def = v.getDefiningOp()) {
    if (isa<moe::LinearOp>(def))
      return def;
    if (!isa<moe::AllGatherOp, moe::SplitOp>(def))
      return nullptr;
    v = def->getOperand(0);
  }
  return nullptr;
}

/// One program (a stage's function) as the plan's JSON.
llvm::Expected<Object> programJson(func::FuncOp fn, int64_t stage, int64_t maxTokens,
                                   int64_t maxSeqLen, int64_t maxSequences) {
  auto rows = fn->getAttrOfType<DenseI64ArrayAttr>("moe.buffer_rows");
  auto widths = fn->getAttrOfType<DenseI64ArrayAttr>("moe.buffer_widths");
  auto types = fn->getAttrOfType<ArrayAttr>("moe.buffer_types");
  auto argBuffers = fn->getAttrOfType<DenseI64ArrayAttr>("moe.arg_buffers");
  if (!rows || !widths || !types || !argBuffers)
    return planError(llvm::formatv("@{0} has no assigned buffers (run "
                                   "moe-assign-buffers)",
                                   fn.getSymName()));

  // Weights: one entry per weight op, in order of appearance, with the
  // program's (rank-local) shapes.
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
  // token ids, routing indices, slots and counts are i32.
  Array buffers;
  int64_t bufferBytes = 0;
  for (auto [r, width, type] : llvm::zip(rows.asArrayRef(), widths.asArrayRef(), types)) {
    Type element = cast<TypeAttr>(type).getValue();
    std::string dtype = element.isInteger(32) ? "I32" : "F32";
    int64_t n = r < 0 ? maxTokens : r;
    int64_t bytes = n * width * 4;
    buffers.push_back(Object{{"rows", n}, {"width", width}, {"dtype", dtype}, {"bytes", bytes}});
    bufferBytes += bytes;
  }

  Array steps, caches;
  int64_t cacheBytes = 0;
  DenseMap<Value, int64_t> bufferOf;
  // The step that computes each value: every input of a step names it
  // ("in_from"), so moert sees a step dropped, duplicated or moved.
  DenseMap<Value, int64_t> producerOf;
  Block &body = fn.getBody().front();
  for (auto [arg, id] : llvm::zip(body.getArguments(), argBuffers.asArrayRef()))
    bufferOf[arg] = id;
  int64_t logitsBuffer = -1;
  Operation *head = headOf(fn);
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
      if (ret.getNumOperands())
        logitsBuffer = bufferOf.lookup(ret.getOperand(0));
      continue;
    }
    Array in, inFrom, ws, out;
    for (Value operand : op.getOperands()) {
      if (weightId.count(operand))
        ws.push_back(weightId[operand]);
      else if (bufferOf.count(operand)) {
        in.push_back(bufferOf[operand]);
        auto producer = producerOf.find(operand);
        inFrom.push_back(producer == producerOf.end() ? -1 : producer->second);
      } else
        return planError(llvm::formatv("operand of '{0}' has no buffer",
                                       op.getName().getStringRef()));
    }
    auto ids = op.getAttrOfType<DenseI64ArrayAttr>("moe.buffers");
    if (!ids && op.getNumResults())
      return planError(llvm::formatv("'{0}' has no assigned buffers",
                                     op.getName().getStringRef()));
    if (ids)
      for (auto [result, id] : llvm::zip(op.getResults(), ids.asArrayRef())) {
        bufferOf[result] = id;
        producerOf[result] = static_cast<int64_t>(steps.size());
        out.push_back(id);
      }
    Object attrs = stepAttrs(&op);
    if (auto mesh = op.getAttrOfType<FlatSymbolRefAttr>("mesh")) {
      int64_t axis = op.getAttrOfType<IntegerAttr>("axis").getInt();
      attrs["mesh"] = mesh.getValue();
      attrs["axis"] = axisName(mesh.getValue(), axis);
    }
    if (&op == head)
      attrs["head"] = true;
    Object step{{"op", op.getName().stripDialect()},
                {"in", std::move(in)},
                {"in_from", std::move(inFrom)},
                {"weights", std::move(ws)},
                {"out", std::move(out)},
                {"attrs", std::move(attrs)}};
    // split: the parts' widths (its results'); concat: its inputs'.
    if (isa<moe::SplitOp, moe::ConcatOp>(op)) {
      Array partWidths;
      for (Value v : isa<moe::SplitOp>(op) ? ValueRange(op.getResults()) : op.getOperands())
        partWidths.push_back(cast<RankedTensorType>(v.getType()).getDimSize(1));
      step.getObject("attrs")->try_emplace("widths", std::move(partWidths));
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
  // Weights are numbered in the order the steps first bind them; moert
  // checks that order (a weight id swapped for another of the same shape is
  // then out of order).
  std::vector<int64_t> bound(weights.size(), -1);
  Array ordered;
  for (llvm::json::Value &step : steps)
    for (llvm::json::Value &id : *step.getAsObject()->getArray("weights")) {
      int64_t old = *id.getAsInteger();
      if (bound[old] < 0) {
        bound[old] = static_cast<int64_t>(ordered.size());
        ordered.push_back(weights[old]);
      }
      id = bound[old];
    }
  for (auto [old, id] : llvm::enumerate(bound))
    if (id < 0)
      return planError(llvm::formatv("@{0}: weight '{1}' is bound by no op", fn.getSymName(),
                                     *weights[old].getAsObject()->getString("name")));
  return Object{{"stage", stage},
                {"weights", std::move(ordered)},
                {"buffers", std::move(buffers)},
                {"kv_caches", std::move(caches)},
                {"inputs", Object{{"tokens", argBuffers[0]}, {"positions", argBuffers[1]}}},
                {"logits", logitsBuffer},
                {"memory", Object{{"weights", weightBytes},
                                  {"activations", bufferBytes},
                                  {"kv_cache", cacheBytes},
                                  {"peak", weightBytes + bufferBytes + cacheBytes}}},
                {"steps", std::move(steps)}};
}

} // namespace

llvm::json::Array moe::logicalWeights(ModuleOp module) {
  Array weights;
  auto add = [&](StringRef name, RankedTensorType type, int64_t experts) {
    Object w{{"name", name},
             {"shape", shapeOf(type)},
             {"dtype", dtypeName(type.getElementType())},
             {"bytes", type.getNumElements() * (type.getElementTypeBitWidth() / 8)}};
    if (experts)
      w["experts"] = experts;
    weights.push_back(std::move(w));
  };
  auto forward = module.lookupSymbol<func::FuncOp>("forward");
  if (!forward) {
    // A partitioned module: moe-partition kept them.
    if (auto kept = module->getAttrOfType<ArrayAttr>("moe.logical_weights"))
      for (Attribute a : kept) {
        auto entry = cast<DictionaryAttr>(a);
        auto experts = entry.getAs<IntegerAttr>("experts");
        add(entry.getAs<StringAttr>("name").getValue(),
            cast<RankedTensorType>(entry.getAs<TypeAttr>("type").getValue()),
            experts ? experts.getInt() : 0);
      }
    return weights;
  }
  forward.walk([&](Operation *op) {
    if (auto w = dyn_cast<moe::WeightOp>(op))
      add(w.getName(), cast<RankedTensorType>(w.getType()), 0);
    else if (auto w = dyn_cast<moe::ExpertWeightOp>(op))
      add(w.getName(), cast<RankedTensorType>(w.getType()), w.getNumExperts());
  });
  return weights;
}


llvm::Expected<JsonValue> moe::buildPlan(ModuleOp module) {
  auto workload = module->getAttrOfType<DictionaryAttr>("moe.workload");
  if (!workload)
    return planError("expected a module with moe.workload and assigned buffers "
                     "(run the whole pipeline)");
  auto get = [&](StringRef key) {
    return cast<IntegerAttr>(workload.get(key)).getInt();
  };
  int64_t maxTokens = get("max_batch_tokens"), maxSeqLen = get("max_seq_len"),
          maxSequences = get("max_sequences");

  // The programs: @forward, or one @stage<s> per pipeline stage.
  SmallVector<func::FuncOp> programs;
  if (auto forward = module.lookupSymbol<func::FuncOp>("forward")) {
    programs.push_back(forward);
  } else {
    for (auto fn : module.getOps<func::FuncOp>())
      if (auto stage = fn->getAttrOfType<IntegerAttr>("moe.stage")) {
        if (stage.getInt() != int64_t(programs.size()))
          return planError(llvm::formatv("@{0}: expected the stages in order",
                                         fn.getSymName()));
        programs.push_back(fn);
      }
  }
  if (programs.empty())
    return planError("expected @forward or @stage0.. programs");
  Array programsJson;
  for (auto [stage, fn] : llvm::enumerate(programs)) {
    llvm::Expected<Object> p = programJson(fn, int64_t(stage), maxTokens, maxSeqLen,
                                           maxSequences);
    if (!p)
      return p.takeError();
    programsJson.push_back(std::move(*p));
  }
  // The logical tensors, whole: the program of an unpartitioned module has
  // them all; a partitioned one records them per rank (its slices).
  Array weights = *(*programsJson[0].getAsObject()).getArray("weights");
  Object *first = programsJson[0].getAsObject();

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
              {"program", 0},
              {"coords", Object{{"dp", 0}, {"pp", 0}, {"tp", 0}, {"edp", 0}, {"ep", 0}, {"etp", 0}}},
              {"memory", JsonValue(Object(*first->getObject("memory")))}};
  Array ranks;
  ranks.push_back(std::move(rank));
  return JsonValue(Object{
      {"format", moe::plan::kFormat},
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
      {"degrees", Object{{"dp", 1}, {"pp", 1}, {"tp", 1}, {"ep", 1}, {"etp", 1}, {"edp", 1}}},
      {"weights", std::move(weights)},
      {"programs", std::move(programsJson)},
      {"ranks", std::move(ranks)}});
}

void moe::mergeDistribution(Object &plan, Object distribution) {
  for (StringRef key : {"world_size", "degrees", "vocab", "stage_begin"})
    plan[key] = std::move(*distribution.get(key));
  // The distribution's ranks (coords, the planner's memory estimate, slices)
  // replace the placeholder rank of buildPlan.
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
    // The plan, then its integrity seal (moe/PlanSchema.h, shared with
    // moert): `,"integrity":"fnv1a64:<hex>"` before the last '}', the 64-bit
    // FNV-1a hash of every other byte.
    std::string text;
    {
      llvm::raw_string_ostream buffer(text);
      write(buffer);
    }
    size_t brace = text.rfind('}');
    uint64_t hash = moe::plan::fnv1a64(text.data(), text.size());
    text.insert(brace, (moe::plan::kSealPrefix + llvm::formatv("{0:x-16}\"", hash)).str());
    llvm::raw_fd_ostream os(fd, /*shouldClose=*/false);
    os << text;
    os.flush();
    std::string why;
    if (os.has_error()) {
      why = os.error().message();
      os.clear_error(); // else the stream's destructor aborts the process
    } else if (::fsync(fd) != 0) {
      why = std::strerror(errno);
    }
    if (!why.empty()) {
      ::close(fd);
      llvm::sys::fs::remove(temp);
      return planError(llvm::formatv("{0}: cannot write the plan: {1} (nothing was written)",
                                     path, why));
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
