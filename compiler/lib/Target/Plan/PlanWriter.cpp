//===- PlanWriter.cpp - the plan manifest -----------------------*- C++ -*-===//
#include "moe/Target/PlanWriter.h"
#include "moe/Dialect/Exec/IR/ExecOps.h"

#include "llvm/ADT/StringSet.h"
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

} // namespace

JsonValue moe::attributeJson(Attribute a) {
  if (auto b = dyn_cast<BoolAttr>(a))
    return b.getValue();
  if (isa<UnitAttr>(a))
    return true;
  if (auto i = dyn_cast<IntegerAttr>(a))
    return i.getValue().getSExtValue();
  if (auto f = dyn_cast<FloatAttr>(a))
    return f.getValueAsDouble();
  if (auto s = dyn_cast<StringAttr>(a))
    return s.getValue();
  if (auto array = dyn_cast<ArrayAttr>(a)) {
    Array out;
    for (Attribute e : array)
      out.push_back(attributeJson(e));
    return out;
  }
  Object out;
  for (NamedAttribute n : cast<DictionaryAttr>(a))
    out[n.getName().getValue()] = attributeJson(n.getValue());
  return out;
}

// One step per launch or collective, declarations numbered in order. Knows
// no kernel: the constants are the launch's.
llvm::Expected<Object> moe::programPlan(moe::exec::ProgramOp program, int64_t maxSeqLen,
                                        int64_t maxSequences) {
  Array weights, buffers, caches, steps;
  int64_t weightBytes = 0, bufferBytes = 0, cacheBytes = 0, stateBytes = 0;
  DenseMap<Value, int64_t> bufferId, weightId;
  // The step that last wrote each buffer: every input of a step names it
  // ("in_from"), so moert sees a step dropped, duplicated or moved.
  DenseMap<Value, int64_t> writer;
  std::optional<int64_t> tokens, positions;
  int64_t logits = -1;
  std::optional<int64_t> labels, loss, step, stats;
  bool inputs = false;
  Array gradients;
  auto ids = [](ValueRange values, const DenseMap<Value, int64_t> &of) {
    Array out;
    for (Value v : values)
      out.push_back(of.lookup(v));
    return out;
  };
  for (Operation &op : program.getBody().front()) {
    if (auto b = dyn_cast<moe::exec::BufferOp>(op)) {
      int64_t rows = b.getRowsAttr().getInt(), width = b.getWidthAttr().getInt();
      int64_t bytes = rows * width * 4;
      bufferId[b] = int64_t(buffers.size());
      buffers.push_back(Object{{"rows", rows},
                               {"width", width},
                               {"dtype", b.getElementType().isInteger(32) ? "I32" : "F32"},
                               {"bytes", bytes}});
      // A state buffer persists between runs (gradient sums, moments).
      if (auto state = b.getStateAttr()) {
        (*buffers.back().getAsObject())["state"] = state.getValue();
        if (auto logical = b.getLogicalRowsAttr()) // a ZeRO shard
          (*buffers.back().getAsObject())["logical_rows"] = logical.getInt();
        if (auto group = b.getShardGroupAttr(); group && group.getValue() == "edp")
          (*buffers.back().getAsObject())["shard_group"] = "edp";
        stateBytes += bytes;
      } else {
        bufferBytes += bytes;
      }
    } else if (auto w = dyn_cast<moe::exec::WeightOp>(op)) {
      auto type = cast<RankedTensorType>(w.getTensorType());
      int64_t bytes = type.getNumElements() * (type.getElementTypeBitWidth() / 8);
      auto int8Block = w->getAttrOfType<IntegerAttr>("moe.int8_block");
      if (int8Block) { // held as int8 values and an f32 scale per block
        const int64_t cols = type.getShape().back(), block = int8Block.getInt();
        bytes = type.getNumElements() +
                type.getNumElements() / cols * ((cols + block - 1) / block) * 4;
      }
      Object entry{{"name", w.getTensor()},
                   {"shape", shapeOf(type)},
                   {"dtype", dtypeName(type.getElementType())},
                   {"bytes", bytes}};
      if (int8Block)
        entry["int8_block"] = int8Block.getInt();
      if (auto experts = w.getExpertsAttr())
        entry["experts"] = experts.getInt();
      weightId[w] = int64_t(weights.size());
      weights.push_back(std::move(entry));
      weightBytes += bytes;
    } else if (auto kv = dyn_cast<moe::exec::KVCacheOp>(op)) {
      int64_t keyWidth = kv.getKeyWidthAttr().getInt(),
              valueWidth = kv.getValueWidthAttr().getInt();
      int64_t bytes = maxSequences * maxSeqLen * (keyWidth + valueWidth) * 4;
      caches.push_back(Object{{"key_width", keyWidth},
                              {"value_width", valueWidth},
                              {"bytes", bytes}});
      cacheBytes += bytes;
    } else if (auto in = dyn_cast<moe::exec::InputsOp>(op)) {
      inputs = true;
      if (in.getTokens()) {
        tokens = bufferId.lookup(in.getTokens());
        positions = bufferId.lookup(in.getPositions());
      }
      if (in.getLabels())
        labels = bufferId.lookup(in.getLabels());
      if (in.getStep())
        step = bufferId.lookup(in.getStep());
    } else if (auto ret = dyn_cast<moe::exec::ReturnOp>(op)) {
      if (ret.getLogits())
        logits = bufferId.lookup(ret.getLogits());
      if (ret.getLoss())
        loss = bufferId.lookup(ret.getLoss());
      if (ret.getStats())
        stats = bufferId.lookup(ret.getStats());
      for (auto [buffer, weight] : llvm::zip(ret.getGradients(), ret.getGradientOf()))
        gradients.push_back(
            Object{{"weight", weightId.lookup(weight)}, {"buffer", bufferId.lookup(buffer)}});
    } else if (isa<moe::exec::LaunchOp, moe::exec::CollectiveOp>(op)) {
      // (exec.kernels and the launches' kernels regions are the target's.)
      StringRef name;
      ValueRange ins, ws, outs;
      Object attrs;
      if (auto launch = dyn_cast<moe::exec::LaunchOp>(op)) {
        name = launch.getKernel();
        ins = launch.getIns();
        ws = launch.getWeights();
        outs = launch.getOuts();
        attrs = std::move(*attributeJson(launch.getConstants()).getAsObject());
      } else {
        auto c = cast<moe::exec::CollectiveOp>(op);
        name = c.getKind();
        ins = c.getIns();
        ws = c.getWeights();
        outs = c.getOuts();
        attrs = std::move(*attributeJson(c.getConstants()).getAsObject());
        if (c.getMesh()) {
          attrs["mesh"] = *c.getMesh();
          attrs["axis"] = *c.getAxis();
        }
      }
      Array inFrom;
      for (Value v : ins) {
        auto w = writer.find(v);
        inFrom.push_back(w == writer.end() ? -1 : w->second);
      }
      for (Value v : outs)
        writer[v] = int64_t(steps.size());
      steps.push_back(Object{{"op", name},
                             {"in", ids(ins, bufferId)},
                             {"in_from", std::move(inFrom)},
                             {"weights", ids(ws, weightId)},
                             {"out", ids(outs, bufferId)},
                             {"attrs", std::move(attrs)}});
    }
  }
  if (!inputs)
    return planError(llvm::formatv("@{0}: no exec.inputs", program.getSymName()));
  // An optimizer program reads its step number instead of tokens.
  Object inputMembers;
  if (tokens) {
    inputMembers["tokens"] = *tokens;
    inputMembers["positions"] = *positions;
  }
  if (step)
    inputMembers["step"] = *step;
  Object plan{{"stage", program.getStageAttr().getInt()},
                {"entry", program.getEntry()},
                {"weights", std::move(weights)},
                {"buffers", std::move(buffers)},
                {"kv_caches", std::move(caches)},
                {"inputs", std::move(inputMembers)},
                {"logits", logits},
                {"memory", Object{{"weights", weightBytes},
                                  {"activations", bufferBytes},
                                  {"kv_cache", cacheBytes},
                                  {"state", stateBytes},
                                  {"peak", weightBytes + bufferBytes + cacheBytes + stateBytes}}},
                {"steps", std::move(steps)}};
  // A training program's labels and loss (moe-append-loss).
  if (labels)
    (*plan.getObject("inputs"))["labels"] = *labels;
  if (loss)
    plan["loss"] = *loss;
  if (!gradients.empty())
    plan["gradients"] = std::move(gradients);
  if (stats)
    plan["stats"] = *stats;
  if (auto micro = program->getAttrOfType<IntegerAttr>("micro_batches"))
    plan["micro_batches"] = micro.getInt();
  // An entry compiled for another workload than the plan's (moe-join-entries).
  if (auto tokens = program->getAttrOfType<IntegerAttr>("max_batch_tokens"))
    plan["max_batch_tokens"] = tokens.getInt();
  return plan;
}

int64_t moe::stashSlots(ModuleOp module, int64_t stage) {
  auto schedule = module->getAttrOfType<ArrayAttr>("moe.pipeline_schedule");
  if (!schedule || stage < 0 || stage >= int64_t(schedule.size()))
    return 1;
  int64_t held = 0, most = 1;
  for (auto step : cast<ArrayAttr>(schedule[stage]).getAsRange<StringAttr>()) {
    held += step.getValue().ltrim('+').starts_with("B") ? -1 : 1;
    most = std::max(most, held);
  }
  return most;
}

llvm::Expected<moe::RankProgramMemory> moe::rankProgramMemory(ModuleOp module, int64_t stage) {
  auto workload = module->getAttrOfType<DictionaryAttr>("moe.workload");
  auto value = [&](StringRef key) {
    auto a = workload ? workload.getAs<IntegerAttr>(key) : IntegerAttr();
    return a ? a.getInt() : int64_t(0);
  };
  RankProgramMemory memory;
  bool first = true;
  llvm::StringSet<> states;
  const bool pipelined = module->hasAttr("moe.pipeline_schedule");
  for (auto program : module.getOps<moe::exec::ProgramOp>()) {
    if (pipelined && program.getStageAttr().getInt() != stage)
      continue;
    if (program.getStageAttr().getInt() != stage)
      return planError("rankProgramMemory: expected the programs of one stage");
    llvm::Expected<Object> plan =
        programPlan(program, value("max_seq_len"), value("max_sequences"));
    if (!plan)
      return plan.takeError();
    const Object *figures = plan->getObject("memory");
    if (first) { // the weights and caches a rank's entries share
      memory.weights = *figures->getInteger("weights");
      memory.kvCache = *figures->getInteger("kv_cache");
    }
    first = false;
    memory.buffers += *figures->getInteger("activations");
    for (const llvm::json::Value &b : *plan->getArray("buffers")) {
      const Object &buffer = *b.getAsObject();
      std::optional<StringRef> state = buffer.getString("state");
      if (!state || !states.insert(*state).second)
        continue;
      const std::string kind = state->split(':').first.str();
      // (A pipeline stage's kept values: one slot per micro-batch in flight.)
      if (kind == "stash") {
        memory.kept += *buffer.getInteger("bytes") * stashSlots(module, stage);
        continue;
      }
      auto it = llvm::find_if(memory.state, [&](const auto &k) { return k.first == kind; });
      if (it == memory.state.end())
        it = memory.state.insert(memory.state.end(), {kind, 0});
      it->second += *buffer.getInteger("bytes");
    }
  }
  return memory;
}

llvm::json::Array moe::logicalWeights(ModuleOp module) {
  // moe-partition or moe-lower-to-exec kept them when @forward went away.
  Array weights;
  if (auto kept = module->getAttrOfType<ArrayAttr>("moe.logical_weights"))
    for (Attribute a : kept) {
      auto entry = cast<DictionaryAttr>(a);
      auto type = cast<RankedTensorType>(entry.getAs<TypeAttr>("type").getValue());
      Object w{{"name", entry.getAs<StringAttr>("name").getValue()},
               {"shape", shapeOf(type)},
               {"dtype", dtypeName(type.getElementType())},
               {"bytes", type.getNumElements() * (type.getElementTypeBitWidth() / 8)}};
      if (auto experts = entry.getAs<IntegerAttr>("experts"))
        w["experts"] = experts.getInt();
      weights.push_back(std::move(w));
    }
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

  // The programs (moe-lower-to-exec): the first entry's, one per pipeline
  // stage in order (a rank's "program" is its stage), then each other
  // entry's, the same stages in the same order (moe-join-entries).
  SmallVector<moe::exec::ProgramOp> programs(module.getOps<moe::exec::ProgramOp>());
  if (programs.empty())
    return planError("expected exec.program ops (run moe-lower-to-exec)");
  const StringRef primary = programs.front().getEntry();
  const int64_t stages = llvm::count_if(
      programs, [&](moe::exec::ProgramOp p) { return p.getEntry() == primary; });
  // Block b (programs b * stages ..) is one entry's, each entry once.
  llvm::StringSet<> entries;
  for (auto [i, program] : llvm::enumerate(programs)) {
    const int64_t stage = int64_t(i) % stages;
    if (program.getStageAttr().getInt() != stage)
      return planError(llvm::formatv("@{0}: expected the stages in order",
                                     program.getSymName()));
    const StringRef entry = programs[i - stage].getEntry();
    if (program.getEntry() != entry || (stage == 0 && !entries.insert(entry).second) ||
        programs.size() % stages)
      return planError(llvm::formatv("@{0}: expected each entry's programs together, one per "
                                     "stage, entry '{1}' first",
                                     program.getSymName(), primary));
  }
  // Which entry runs each phase of generation (absent: the first, always).
  Object schedule;
  if (auto phases = module->getAttrOfType<DictionaryAttr>("moe.schedule"))
    for (NamedAttribute phase : phases) {
      auto entry = dyn_cast<StringAttr>(phase.getValue());
      if (!entry || !entries.contains(entry.getValue()))
        return planError(llvm::formatv("moe.schedule: phase '{0}' names no entry of the "
                                       "programs",
                                       phase.getName().getValue()));
      schedule[phase.getName().getValue()] = entry.getValue();
    }
  Array programsJson;
  for (auto program : programs) {
    llvm::Expected<Object> p = programPlan(program, maxSeqLen, maxSequences);
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
  JsonValue plan(Object{
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
  if (!schedule.empty())
    (*plan.getAsObject())["schedule"] = std::move(schedule);
  // A pipelined training plan's order of steps per stage
  // (moe-schedule-pipeline).
  if (auto stages = module->getAttrOfType<ArrayAttr>("moe.pipeline_schedule")) {
    Array pipeline;
    for (auto steps : stages.getAsRange<ArrayAttr>()) {
      Array list;
      for (auto step : steps.getAsRange<StringAttr>())
        list.push_back(step.getValue());
      pipeline.push_back(std::move(list));
    }
    (*plan.getAsObject())["pipeline_schedule"] = std::move(pipeline);
  }
  return plan;
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
    // In key order, as llvm::json prints an object (a json::Object's own
    // order depends on its insertion history).
    std::vector<llvm::StringRef> keys;
    for (const auto &entry : plan)
      keys.push_back(entry.first);
    llvm::sort(keys);
    J.object([&] {
      for (llvm::StringRef key : keys)
        J.attribute(key, *plan.get(key));
      more(J);
    });
    os << "\n";
  });
}

static llvm::Error writeAtomically(llvm::StringRef path,
                                   llvm::function_ref<void(llvm::raw_ostream &)> write) {
  // The plan, then its integrity seal (moe/PlanSchema.h, shared with moert):
  // `,"integrity":"fnv1a64:<hex>"` before the last '}', the 64-bit FNV-1a
  // hash of every other byte.
  std::string text;
  {
    llvm::raw_string_ostream buffer(text);
    write(buffer);
  }
  size_t brace = text.rfind('}');
  uint64_t hash = moe::plan::fnv1a64(text.data(), text.size());
  text.insert(brace, (moe::plan::kSealPrefix + llvm::formatv("{0:x-16}\"", hash)).str());
  return moe::writeFileAtomically(path, text, "the plan");
}

llvm::Error moe::writeFileAtomically(llvm::StringRef path, llvm::StringRef text,
                                     llvm::StringRef what) {
  llvm::SmallString<256> temp;
  int fd;
  llvm::SmallString<256> model(path);
  model += ".tmp-%%%%%%";
  if (std::error_code ec = llvm::sys::fs::createUniqueFile(model, fd, temp))
    return planError(llvm::formatv("{0}: cannot create a temporary file: {1}",
                                   path, ec.message()));
  {
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
      return planError(llvm::formatv("{0}: cannot write {1}: {2} (nothing was written)",
                                     path, what, why));
    }
  }
  ::close(fd);
  if (std::error_code ec = llvm::sys::fs::rename(temp, path)) {
    llvm::sys::fs::remove(temp);
    return planError(llvm::formatv("{0}: cannot rename {1} into place: {2}",
                                   path, what, ec.message()));
  }
  return llvm::Error::success();
}
