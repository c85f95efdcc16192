// Reading one program of a plan (Plan::load reads the rest): its weights
// against the plan's logical ones, its buffers, KV caches and inputs, and
// every step against them (its op, weights, buffers and attributes). Nothing
// in the plan is trusted: these checks make the executor's indexing safe.
#include "moert/Plan.h"
#include "moert/Error.h"

#include "JsonFields.h"
#include "PlanChecks.h"
#include "PlanReaders.h"
#include "moe/PlanSchema.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <set>
#include <string>
#include <unordered_set>

namespace moert {
namespace {
using moe::plan::kMaxWidth;

using nlohmann::json;

const OpDef *parseOp(const JsonFields &r) {
  const std::string name = r.string("op");
  if (const OpDef *op = findOp(name))
    return op;
  r.fail("op", "unknown op '" + name + "'");
}

cpu::RopeParams parseRope(const JsonFields &r) {
  cpu::RopeParams p;
  std::string kind = r.string("kind");
  if (kind == "default") p.kind = cpu::RopeParams::Kind::Default;
  else if (kind == "linear") p.kind = cpu::RopeParams::Kind::Linear;
  else if (kind == "dynamic") p.kind = cpu::RopeParams::Kind::Dynamic;
  else if (kind == "llama3") p.kind = cpu::RopeParams::Kind::Llama3;
  else if (kind == "yarn") p.kind = cpu::RopeParams::Kind::Yarn;
  else r.fail("kind", "unknown rope kind '" + kind + "'");
  p.theta = r.number("theta");
  p.rotaryDim = r.integer("rotary_dim", 2);
  if (p.rotaryDim % 2)
    r.fail("rotary_dim", "expected an even value");
  p.interleaved = r.boolean("interleaved");
  p.factor = r.number("factor");
  p.originalMaxPosition = r.integer("original_max_position", 0);
  p.lowFreqFactor = r.number("low_freq_factor");
  p.highFreqFactor = r.number("high_freq_factor");
  p.betaFast = r.number("beta_fast");
  p.betaSlow = r.number("beta_slow");
  p.truncate = r.boolean("truncate");
  p.attentionFactor = r.number("attention_factor");
  if (!(p.theta > 0) || !(p.factor > 0))
    r.fail("theta", "expected theta > 0 and factor > 0");
  if (!(p.attentionFactor > 0) || !std::isfinite(p.attentionFactor))
    r.fail("attention_factor", "expected a finite value > 0");
  return p;
}

cpu::RoutingParams parseRouting(const JsonFields &r) {
  cpu::RoutingParams p;
  std::string scoring = r.string("scoring");
  if (scoring != "softmax" && scoring != "sigmoid")
    r.fail("scoring", "expected softmax or sigmoid");
  p.sigmoid = scoring == "sigmoid";
  p.topK = r.integer("top_k", 1);
  p.topkOnLogits = r.string("topk_on") == "logits";
  p.normalize = r.boolean("normalize");
  p.scalingFactor = r.number("scaling_factor");
  p.numGroups = r.integer("num_groups", 1);
  p.topkGroups = r.integer("topk_groups", 1);
  if (p.topkGroups > p.numGroups)
    r.fail("topk_groups", "expected at most num_groups");
  p.groupScoreMax = r.string("group_score") == "max";
  std::string compute = r.string("compute_type");
  if (compute != "F32" && compute != "BF16" && compute != "F16")
    r.fail("compute_type", "expected F32, BF16 or F16");
  p.computeBf16 = compute == "BF16";
  return p;
}

cpu::Activation parseActivation(const JsonFields &r) {
  std::string a = r.string("activation");
  if (a == "silu") return cpu::Activation::Silu;
  if (a == "gelu") return cpu::Activation::Gelu;
  if (a == "gelu_tanh") return cpu::Activation::GeluTanh;
  if (a == "relu") return cpu::Activation::Relu;
  r.fail("activation", "unknown activation '" + a + "'");
}

/// A collective's "mesh" and "axis"; the axis must be one of the mesh's.
CollectiveGroup parseGroup(const JsonFields &a) {
  CollectiveGroup g;
  std::string mesh = a.string("mesh"), axis = a.string("axis");
  if (mesh == "mesh") g.mesh = CollectiveGroup::Mesh::Attention;
  else if (mesh == "experts") g.mesh = CollectiveGroup::Mesh::Experts;
  else a.fail("mesh", "expected \"mesh\" or \"experts\" but got \"" + mesh + "\"");
  static const std::pair<const char *, CollectiveGroup::Axis> axes[] = {
      {"pp", CollectiveGroup::Axis::PP}, {"dp", CollectiveGroup::Axis::DP},
      {"tp", CollectiveGroup::Axis::TP}, {"edp", CollectiveGroup::Axis::EDP},
      {"ep", CollectiveGroup::Axis::EP}, {"etp", CollectiveGroup::Axis::ETP}};
  bool found = false;
  for (auto &[spelling, value] : axes)
    if (axis == spelling) {
      g.axis = value;
      found = true;
    }
  bool attention = g.axis == CollectiveGroup::Axis::PP || g.axis == CollectiveGroup::Axis::DP ||
                   g.axis == CollectiveGroup::Axis::TP;
  bool experts = g.axis == CollectiveGroup::Axis::PP || g.axis == CollectiveGroup::Axis::EDP ||
                 g.axis == CollectiveGroup::Axis::EP || g.axis == CollectiveGroup::Axis::ETP;
  if (!found || (g.mesh == CollectiveGroup::Mesh::Attention ? !attention : !experts))
    a.fail("axis", fmt::format("\"{}\" is not an axis of @{} ({})", axis, mesh,
                               g.mesh == CollectiveGroup::Mesh::Attention ? "pp, dp, tp"
                                                                         : "pp, edp, ep, etp"));
  return g;
}

} // namespace

PlanWeight readWeight(const JsonFields &w) {
  PlanWeight pw;
  pw.name = w.string("name");
  pw.shape = w.shape("shape");
  if (pw.shape.empty())
    w.fail("shape", "expected at least one dimension");
  if (!parseDType(w.string("dtype"), pw.dtype) || pw.dtype == DType::I32 || pw.dtype == DType::I64 ||
      pw.dtype == DType::I8 || pw.dtype == DType::F8E4M3)
    w.fail("dtype", "expected F32, BF16 or F16");
  pw.experts = w.has("experts") ? w.integer("experts", 1) : 0;
  if (pw.experts && (pw.shape[0] != pw.experts || pw.name.find("{e}") == std::string::npos))
    w.fail("experts", "an expert stack needs shape[0] == experts and '{e}' in its name");
  if (w.has("int8_block")) {
    // (The int8 GEMV's int32 block sums are exact up to 4096 columns.)
    pw.int8Block = w.bounded("int8_block", 1, 4096);
    if (pw.tensorShape().size() != 2)
      w.fail("int8_block", "int8 weights are matrices (or stacks of them)");
  }
  pw.bytes = w.integer("bytes", 0);
  const int64_t expected = pw.heldBytes();
  if (pw.bytes != expected)
    w.fail("bytes", fmt::format("expected {} for {} {}{}", expected, dtypeName(pw.dtype),
                                shapeString(pw.shape), pw.int8Block ? " in int8 blocks" : ""));
  return pw;
}

PlanProgram readProgram(const Plan &plan, const JsonFields &pr, size_t index) {
  namespace members = moe::plan::members;
  pr.onlyMembers(members::kProgram);
  PlanProgram program;
  program.stage = pr.integer("stage", 0);
  if (program.stage >= plan.degrees.pp)
    pr.fail("stage", fmt::format("expected a stage below pp = {}", plan.degrees.pp));
  if (pr.has("entry")) {
    program.entry = pr.string("entry");
    if (program.entry != "forward" && program.entry != "prefill" && program.entry != "decode" &&
        program.entry != "train" && program.entry != "train_forward" &&
        program.entry != "optimizer")
      pr.fail("entry", fmt::format("'{}': not supported yet (this moert runs forward, prefill, "
                                   "decode, train and optimizer programs)",
                                   program.entry));
  }
  program.maxBatchTokens = pr.has("max_batch_tokens")
                               ? pr.bounded("max_batch_tokens", 1, plan.maxBatchTokens)
                               : plan.maxBatchTokens;
  const bool last = program.stage == plan.degrees.pp - 1;
  const bool optimizer = program.entry == "optimizer";

  const json &weights = pr.array("weights");
  for (size_t i = 0; i < weights.size(); ++i) {
    JsonFields w = pr.element("weights", i);
    w.onlyMembers(members::kWeight);
    PlanWeight pw = readWeight(w);
    auto global = std::find_if(plan.weights.begin(), plan.weights.end(),
                               [&](const PlanWeight &g) { return g.name == pw.name; });
    if (global == plan.weights.end())
      w.fail("name", fmt::format("'{}' is not among the plan's weights", pw.name));
    if (global->dtype != pw.dtype || (global->experts > 0) != (pw.experts > 0) ||
        global->shape.size() != pw.shape.size())
      w.fail("shape", fmt::format("{} {} does not have the dtype, rank and kind of the plan's "
                                  "weight ({} {})", dtypeName(pw.dtype), shapeString(pw.shape),
                                  dtypeName(global->dtype), shapeString(global->shape)));
    if (pw.experts > global->experts)
      w.fail("experts", fmt::format("{} local experts of a stack of {}", pw.experts,
                                    global->experts));
    program.weights.push_back(std::move(pw));
  }

  const json &buffers = pr.array("buffers");
  for (size_t i = 0; i < buffers.size(); ++i) {
    JsonFields b = pr.element("buffers", i);
    b.onlyMembers(members::kBuffer);
    PlanBuffer pb;
    pb.rows = b.integer("rows", 1);
    pb.width = b.integer("width", 1);
    if (!parseDType(b.string("dtype"), pb.dtype) || (pb.dtype != DType::F32 && pb.dtype != DType::I32))
      b.fail("dtype", "expected F32 or I32");
    pb.bytes = b.integer("bytes", 0);
    if (pb.rows > (int64_t(1) << 40) / pb.width || pb.bytes != pb.rows * pb.width * 4)
      b.fail("bytes", "expected rows x width x 4");
    if (b.has("state")) {
      pb.state = b.string("state");
      // (A pipeline stage's kept values, "stash:<i>", may be ids.)
      const bool kept = pb.kept();
      if (pb.state.empty() || (pb.dtype != DType::F32 && !kept))
        b.fail("state", "expected the name of an F32 state buffer");
      if (kept && (plan.degrees.pp == 1 ||
                   (program.entry != "train" && program.entry != "train_forward")))
        b.fail("state", "only a pipeline stage's train programs keep values (stash)");
      for (const PlanBuffer &other : program.buffers)
        if (other.state == pb.state)
          b.fail("state", fmt::format("'{}' is declared twice", pb.state));
    }
    if (b.has("shard_group")) {
      const std::string group = b.string("shard_group");
      if (group != "edp" || !b.has("logical_rows"))
        b.fail("shard_group", "expected \"edp\", of a ZeRO shard (logical_rows)");
      pb.shardOverEdp = true;
    }
    if (b.has("logical_rows")) {
      // A ZeRO shard: ceil(logical_rows / n) rows each, n = dp (or edp).
      pb.logicalRows = b.integer("logical_rows", 1);
      const int64_t n = pb.shardOverEdp ? plan.degrees.edp : plan.degrees.dp;
      const char *group = pb.shardOverEdp ? "edp" : "dp";
      if (pb.state.empty() || pb.logicalRows > pb.rows * n || pb.logicalRows <= (pb.rows - 1) * n)
        b.fail("logical_rows", fmt::format("expected a state buffer of ceil({} / {}) = {} rows "
                                           "(a shard of each of the {} members of the {} group)",
                                           pb.logicalRows, group, (pb.logicalRows + n - 1) / n, n,
                                           group));
    }
    program.buffers.push_back(pb);
  }
  const json &caches = pr.array("kv_caches");
  for (size_t i = 0; i < caches.size(); ++i) {
    JsonFields c = pr.element("kv_caches", i);
    c.onlyMembers(members::kKVCache);
    program.caches.push_back({c.bounded("key_width", 1, kMaxWidth),
                              c.bounded("value_width", 1, kMaxWidth), c.integer("bytes", 0)});
    // max_sequences x max_seq_len rows of keys and values, f32: at most
    // 2^16 x 2^24 x 2^21 x 4 bytes, no overflow in int64.
    const PlanCache &kv = program.caches.back();
    const int64_t bytes =
        plan.maxSequences * plan.maxSeqLen * (kv.keyWidth + kv.valueWidth) * 4;
    if (kv.bytes != bytes)
      c.fail("bytes", fmt::format("expected max_sequences x max_seq_len x (key_width + "
                                  "value_width) x 4 = {}", bytes));
  }
  auto bufferId = [&](const JsonFields &reader, const std::string &field, int64_t id) {
    if (id < 0 || id >= static_cast<int64_t>(program.buffers.size()))
      reader.fail(field, fmt::format("buffer {} out of range", id));
    return id;
  };
  // Token ids and positions: -1 where the stage reads none.
  JsonFields inputs = pr.child("inputs");
  inputs.onlyMembers(members::kInputs);
  // A training program also reads its labels and gives its loss (instead
  // of logits).
  const bool training =
      program.entry == "train" || program.entry == "train_forward" || optimizer;
  for (auto [field, target] : {std::pair<const char *, int64_t *>{"tokens", &program.tokensBuffer},
                               {"positions", &program.positionsBuffer},
                               {"labels", &program.labelsBuffer}}) {
    // (-1: a stage that reads none; labels are absent but in a train
    // program, tokens and positions in an optimizer program.)
    int64_t id = (target == &program.labelsBuffer || optimizer) && !inputs.has(field)
                     ? -1
                     : inputs.integer(field, -1);
    if (id >= 0) {
      bufferId(inputs, field, id);
      const PlanBuffer &b = program.buffers[id];
      if (b.dtype != DType::I32 || b.rows < program.maxBatchTokens)
        inputs.fail(field, "expected an I32 buffer of max_batch_tokens rows");
    }
    *target = id;
  }
  readTrainingOutputs(pr, inputs, program, last, plan.degrees.pp > 1);
  readOptimizerMembers(pr, inputs, program);
  program.logitsBuffer = pr.integer("logits", -1);
  if ((!last || training) && program.logitsBuffer != -1)
    pr.fail("logits", fmt::format("expected -1 on stage {} (logits come from the last stage, {})",
                                  program.stage, plan.degrees.pp - 1));
  if (last && !training) {
    bufferId(pr, "logits", program.logitsBuffer);
    const PlanBuffer &b = program.buffers[program.logitsBuffer];
    if (b.dtype != DType::F32 || b.width != plan.vocabSize)
      pr.fail("logits", "the logits buffer is not an F32 buffer vocab_size wide");
  }
  JsonFields memory = pr.child("memory");
  memory.onlyMembers(members::kProgramMemory);
  program.activationBytes = memory.integer("activations", 0);
  program.cacheBytes = memory.integer("kv_cache", 0);
  program.weightBytes = memory.integer("weights", 0);

  const json &steps = pr.array("steps");
  int64_t heads = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    JsonFields s = pr.element("steps", i);
    s.onlyMembers(members::kStep);
    PlanStep step;
    step.op = parseOp(s);
    step.in = s.integers("in", 0);
    step.inFrom = s.integers("in_from", -1);
    if (step.inFrom.size() != step.in.size())
      s.fail("in_from", fmt::format("expected one entry per input ({}) but got {}", step.in.size(),
                                    step.inFrom.size()));
    step.out = s.integers("out", 0);
    step.weights = s.integers("weights", 0);
    for (int64_t id : step.in)
      bufferId(s, "in", id);
    for (int64_t id : step.out)
      bufferId(s, "out", id);
    for (int64_t id : step.weights)
      if (id >= static_cast<int64_t>(program.weights.size()))
        s.fail("weights", fmt::format("weight {} out of range", id));
    JsonFields a = s.child("attrs");
    if (a.has("eps")) {
      step.eps = a.number("eps");
      // A norm's epsilon: positive and small (transformers' are 1e-5..1e-6;
      // 1e308 would turn every norm into a constant).
      if (!(step.eps > 0 && step.eps <= 1))
        a.fail("eps", fmt::format("expected a value in (0, 1] but got {}", step.eps));
    }
    if (a.has("scale")) step.scale = a.number("scale");
    if (a.has("head_dim")) step.headDim = a.integer("head_dim", 1);
    if (a.has("heads")) step.heads = a.integer("heads", 1);
    if (a.has("kv_heads")) step.kvHeads = a.integer("kv_heads", 1);
    if (a.has("sliding_window")) step.slidingWindow = a.integer("sliding_window", 0);
    if (a.has("kv_cache")) step.kvCache = a.integer("kv_cache", 0);
    if (a.has("recompute")) step.recompute = a.boolean("recompute");
    if (a.has("rope")) step.rope = parseRope(a.child("rope"));
    if (a.has("routing")) step.routing = parseRouting(a.child("routing"));
    if (a.has("activation")) step.activation = parseActivation(a);
    if (a.has("widths")) step.widths = a.integers("widths", 1);
    if (a.has("vocab_shard")) step.vocabShard = a.boolean("vocab_shard");
    if (a.has("head")) step.head = a.boolean("head");
    if (step.op->has(OpDef::InGroup))
      step.group = parseGroup(a);
    if (step.op->parse)
      step.op->parse(a, step);
    if (step.vocabShard && !step.op->has(OpDef::VocabShard))
      a.fail("vocab_shard", "only an embedding is vocab-sharded");
    if (step.head) {
      if (!step.op->has(OpDef::Head) || !last || heads > 0)
        a.fail("head", "expected one LM head (a linear) on the last stage");
      ++heads;
    }
    program.steps.push_back(std::move(step));
    checkStep(plan, program, index, i);
  }
  // (A pipeline stage's backward program has none: its forward one has.)
  if (last && heads == 0 && !optimizer && !(plan.degrees.pp > 1 && program.entry == "train"))
    pr.fail("steps", "the last stage has no LM head (a linear with \"head\": true)");
  checkDataFlow(program, pr, plan.degrees.pp > 1);
  checkWeightBinding(program, pr, plan.degrees.pp > 1);
  if (pr.has("cuda"))
    program.cuda = readKernelTable(program, pr.child("cuda"));
  return program;
}

} // namespace moert
