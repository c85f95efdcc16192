// Loading and validating a plan. Nothing in the file is trusted: the checks
// here are what make the executor's indexing safe.
#include "moert/Plan.h"
#include "moert/Checkpoint.h"
#include "moert/Error.h"

#include "JsonFields.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <unordered_set>
#include <sstream>

namespace moert {
namespace {

using nlohmann::json;

OpKind parseOp(const JsonFields &r, const std::string &name) {
  static const std::pair<const char *, OpKind> ops[] = {
      {"embedding", OpKind::Embedding}, {"rms_norm", OpKind::RMSNorm},
      {"layer_norm", OpKind::LayerNorm}, {"linear", OpKind::Linear},
      {"rope", OpKind::Rope},           {"attention", OpKind::Attention},
      {"mla_attention", OpKind::MLAttention}, {"split", OpKind::Split},
      {"add", OpKind::Add},             {"sigmoid_gate", OpKind::SigmoidGate},
      {"mlp", OpKind::MLP},             {"router", OpKind::Router},
      {"experts", OpKind::Experts}};
  for (auto &[spelling, kind] : ops)
    if (name == spelling)
      return kind;
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
  p.mscale = r.number("mscale");
  p.mscaleAllDim = r.number("mscale_all_dim");
  if (!(p.theta > 0) || !(p.factor > 0))
    r.fail("theta", "expected theta > 0 and factor > 0");
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

/// Shape checks of one step against its buffers and weights.
class StepChecker {
public:
  StepChecker(const Plan &plan, const PlanRank &rank, const PlanStep &step, size_t index)
      : plan(plan), rank(rank), step(step), index(index) {}

  [[noreturn]] void fail(const std::string &message) const {
    inputError("{}: ranks[{}].steps[{}] ({}): {}", plan.path, rank.rank, index,
               opName(step.op), message);
  }
  void arity(size_t in, size_t weightsMin, size_t weightsMax, size_t out) const {
    if (step.in.size() != in || step.out.size() != out || step.weights.size() < weightsMin ||
        step.weights.size() > weightsMax)
      fail(fmt::format("expected {} inputs, {}-{} weights and {} outputs but got {}, {} and {}",
                       in, weightsMin, weightsMax, out, step.in.size(), step.weights.size(),
                       step.out.size()));
  }
  int64_t width(int64_t buffer, DType dtype = DType::F32) const {
    const PlanBuffer &b = rank.buffers[buffer];
    if (b.dtype != dtype)
      fail(fmt::format("buffer {} holds {} but the op needs {}", buffer, dtypeName(b.dtype),
                       dtypeName(dtype)));
    return b.width;
  }
  const PlanWeight &weight(size_t i, size_t rankWanted) const {
    const PlanWeight &w = plan.weights[step.weights[i]];
    if (w.shape.size() != rankWanted)
      fail(fmt::format("weight '{}' has rank {} but the op needs rank {}", w.name,
                       w.shape.size(), rankWanted));
    return w;
  }
  void expect(bool ok, const std::string &message) const {
    if (!ok)
      fail(message);
  }
  const PlanCache &cache() const {
    if (step.kvCache < 0 || step.kvCache >= static_cast<int64_t>(rank.caches.size()))
      fail(fmt::format("kv_cache {} out of range", step.kvCache));
    return rank.caches[step.kvCache];
  }

  void check() const;

private:
  const Plan &plan;
  const PlanRank &rank;
  const PlanStep &step;
  size_t index;
};

void StepChecker::check() const {
  switch (step.op) {
  case OpKind::Embedding: {
    arity(1, 1, 1, 1);
    width(step.in[0], DType::I32);
    const PlanWeight &t = weight(0, 2);
    expect(width(step.out[0]) == t.shape[1], "output width differs from the table's");
    expect(t.shape[0] == plan.vocabSize, "embedding rows differ from vocab_size");
    break;
  }
  case OpKind::RMSNorm:
  case OpKind::LayerNorm: {
    arity(1, 1, step.op == OpKind::LayerNorm ? 2 : 1, 1);
    int64_t w = width(step.in[0]);
    const PlanWeight &g = weight(0, 1);
    expect(w % g.shape[0] == 0, "weight size does not divide the width");
    expect(step.op == OpKind::RMSNorm || g.shape[0] == w, "layer_norm weight must span the row");
    if (step.weights.size() == 2)
      expect(weight(1, 1).shape == g.shape, "bias and weight shapes differ");
    expect(width(step.out[0]) == w, "output width differs from the input's");
    expect(step.eps > 0, "eps must be > 0");
    break;
  }
  case OpKind::Linear: {
    arity(1, 1, 2, 1);
    const PlanWeight &w = weight(0, 2);
    expect(width(step.in[0]) == w.shape[1], fmt::format("input width differs from '{}' columns", w.name));
    expect(width(step.out[0]) == w.shape[0], fmt::format("output width differs from '{}' rows", w.name));
    if (step.weights.size() == 2)
      expect(weight(1, 1).shape[0] == w.shape[0], "bias size differs from the output width");
    break;
  }
  case OpKind::Rope: {
    arity(2, 0, 0, 1);
    int64_t w = width(step.in[0]);
    width(step.in[1], DType::I32);
    expect(step.headDim > 0 && w % step.headDim == 0, "head_dim does not divide the width");
    expect(step.rope.rotaryDim <= step.headDim, "rotary_dim exceeds head_dim");
    expect(width(step.out[0]) == w, "output width differs from the input's");
    break;
  }
  case OpKind::Attention: {
    arity(3, 0, 0, 1);
    int64_t q = width(step.in[0]), k = width(step.in[1]), v = width(step.in[2]);
    expect(step.heads > 0 && step.kvHeads > 0 && step.heads % step.kvHeads == 0,
           "kv_heads must divide heads");
    expect(q % step.heads == 0 && k % step.kvHeads == 0 && v % step.kvHeads == 0,
           "widths are not whole heads");
    expect(q / step.heads == k / step.kvHeads, "query and key head dims differ");
    expect(width(step.out[0]) == step.heads * (v / step.kvHeads), "output width is not heads x value dim");
    const PlanCache &c = cache();
    expect(c.keyWidth == k && c.valueWidth == v, "kv cache widths differ from key/value widths");
    break;
  }
  case OpKind::MLAttention: {
    arity(4, 0, 0, 1);
    int64_t q = width(step.in[0]), kv = width(step.in[1]), r = width(step.in[2]);
    width(step.in[3], DType::I32);
    expect(step.heads > 0 && q % step.heads == 0 && kv % step.heads == 0, "widths are not whole heads");
    int64_t nope = q / step.heads - r, vdim = kv / step.heads - nope;
    expect(r == step.rope.rotaryDim && nope > 0 && vdim > 0, "inconsistent MLA head dims");
    expect(width(step.out[0]) == step.heads * vdim, "output width is not heads x value dim");
    const PlanCache &c = cache();
    expect(c.keyWidth == step.heads * (nope + r) && c.valueWidth == step.heads * vdim,
           "kv cache widths differ from the MLA head dims");
    break;
  }
  case OpKind::Split: {
    expect(step.in.size() == 1 && step.out.size() == step.widths.size() && !step.out.empty(),
           "expected one input and one output per width");
    int64_t sum = 0;
    for (size_t i = 0; i < step.out.size(); ++i) {
      expect(width(step.out[i]) >= step.widths[i] && step.widths[i] > 0, "output narrower than its part");
      sum += step.widths[i];
    }
    expect(sum == width(step.in[0]), "widths do not add up to the input width");
    break;
  }
  case OpKind::Add:
    arity(2, 0, 0, 1);
    expect(width(step.in[0]) == width(step.in[1]) && width(step.out[0]) == width(step.in[0]),
           "operand widths differ");
    break;
  case OpKind::SigmoidGate:
    arity(2, 0, 0, 1);
    expect(width(step.in[1]) == 1 && width(step.out[0]) == width(step.in[0]), "expected a [T, 1] gate");
    break;
  case OpKind::MLP: {
    arity(1, 3, 3, 1);
    int64_t h = width(step.in[0]);
    const PlanWeight &g = weight(0, 2), &u = weight(1, 2), &d = weight(2, 2);
    expect(g.shape == u.shape && g.shape[1] == h && d.shape[0] == h && d.shape[1] == g.shape[0],
           "gate/up/down shapes do not form an MLP of the input width");
    expect(width(step.out[0]) == h, "output width differs from the input's");
    break;
  }
  case OpKind::Router: {
    arity(1, 1, 2, 2);
    const PlanWeight &g = weight(0, 2);
    int64_t experts = g.shape[0];
    expect(width(step.in[0]) == g.shape[1], "input width differs from the gate's columns");
    expect(step.routing.topK <= experts, "top_k exceeds the number of experts");
    expect(width(step.out[0]) == step.routing.topK && width(step.out[1], DType::I32) == step.routing.topK,
           "outputs must be top_k wide");
    expect(experts % step.routing.numGroups == 0, "num_groups does not divide the experts");
    expect(step.routing.topkGroups * (experts / step.routing.numGroups) >= step.routing.topK,
           "kept groups hold fewer than top_k experts");
    if (step.weights.size() == 2)
      expect(weight(1, 1).shape[0] == experts, "correction bias size differs from the experts");
    break;
  }
  case OpKind::Experts: {
    arity(3, 3, 3, 1);
    int64_t h = width(step.in[0]), k = width(step.in[1]);
    expect(width(step.in[2], DType::I32) == k, "weights and experts widths differ");
    const PlanWeight &g = weight(0, 3), &u = weight(1, 3), &d = weight(2, 3);
    expect(g.experts > 0 && u.experts == g.experts && d.experts == g.experts,
           "expected three expert stacks of the same size");
    expect(g.shape == u.shape && g.shape[2] == h && d.shape[1] == h && d.shape[2] == g.shape[1],
           "expert stacks do not form MLPs of the input width");
    expect(k <= g.experts, "more selected experts than experts");
    expect(width(step.out[0]) == h, "output width differs from the input's");
    break;
  }
  }
}

} // namespace

const char *opName(OpKind op) {
  switch (op) {
  case OpKind::Embedding: return "embedding";
  case OpKind::RMSNorm: return "rms_norm";
  case OpKind::LayerNorm: return "layer_norm";
  case OpKind::Linear: return "linear";
  case OpKind::Rope: return "rope";
  case OpKind::Attention: return "attention";
  case OpKind::MLAttention: return "mla_attention";
  case OpKind::Split: return "split";
  case OpKind::Add: return "add";
  case OpKind::SigmoidGate: return "sigmoid_gate";
  case OpKind::MLP: return "mlp";
  case OpKind::Router: return "router";
  case OpKind::Experts: return "experts";
  }
  return "?";
}

std::string PlanWeight::expertName(int64_t e) const {
  std::string n = name;
  size_t at = n.find("{e}");
  return at == std::string::npos ? n : n.replace(at, 3, std::to_string(e));
}

std::vector<int64_t> PlanWeight::tensorShape() const {
  if (experts == 0)
    return shape;
  return std::vector<int64_t>(shape.begin() + 1, shape.end());
}

Plan Plan::load(const std::string &path) {
  std::ifstream file(path);
  if (!file)
    inputError("{}: cannot read the plan", path);
  std::stringstream text;
  text << file.rdbuf();
  json root = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object())
    inputError("{}: not a plan (expected a JSON object written by moec compile)", path);

  Plan plan;
  plan.path = path;
  JsonFields r(root, plan.path, "");
  if (r.string("format") != "moe-plan")
    r.fail("format", "expected \"moe-plan\"");
  int64_t version = r.integer("version");
  if (version != kPlanFormatVersion)
    r.fail("version", fmt::format("this moert reads plan format {} but the plan is format {}",
                                  kPlanFormatVersion, version));
  JsonFields model = r.child("model");
  plan.modelType = model.string("model_type");
  plan.vocabSize = model.integer("vocab_size", 1);
  plan.maxPositionEmbeddings = model.integer("max_position_embeddings", 1);
  plan.eosTokenIds = model.integers("eos_token_ids");
  if (model.has("unused_tensor_prefixes")) {
    const json &prefixes = model.get("unused_tensor_prefixes");
    if (!prefixes.is_array())
      model.fail("unused_tensor_prefixes", "expected an array of strings");
    for (const json &p : prefixes) {
      if (!p.is_string() || p.get<std::string>().empty())
        model.fail("unused_tensor_prefixes", "expected non-empty strings");
      plan.unusedTensorPrefixes.push_back(p.get<std::string>());
    }
  }
  JsonFields workload = r.child("workload");
  plan.maxBatchTokens = workload.integer("max_batch_tokens", 1);
  plan.maxSeqLen = workload.integer("max_seq_len", 1);
  plan.maxSequences = workload.integer("max_sequences", 1);
  plan.worldSize = r.integer("world_size", 1);
  if (plan.worldSize > 1)
    r.fail("world_size", fmt::format("a plan for {} ranks: this moert runs single-rank plans "
                                      "(partitioned execution is not supported yet)",
                                      plan.worldSize));

  const json &weights = r.array("weights");
  for (size_t i = 0; i < weights.size(); ++i) {
    JsonFields w = r.element("weights", i);
    PlanWeight pw;
    pw.name = w.string("name");
    pw.shape = w.integers("shape", 1);
    if (!parseDType(w.string("dtype"), pw.dtype) || pw.dtype == DType::I32 || pw.dtype == DType::I64)
      w.fail("dtype", "expected F32, BF16 or F16");
    pw.experts = w.has("experts") ? w.integer("experts", 1) : 0;
    if (pw.experts && (pw.shape.empty() || pw.shape[0] != pw.experts ||
                       pw.name.find("{e}") == std::string::npos))
      w.fail("experts", "an expert stack needs shape[0] == experts and '{e}' in its name");
    pw.bytes = w.integer("bytes", 0);
    TensorView view{pw.dtype, pw.shape, nullptr};
    if (static_cast<size_t>(pw.bytes) != view.bytes())
      w.fail("bytes", fmt::format("expected {} for {} {}", view.bytes(), dtypeName(pw.dtype),
                                  shapeString(pw.shape)));
    plan.weights.push_back(std::move(pw));
  }

  const json &ranks = r.array("ranks");
  if (static_cast<int64_t>(ranks.size()) != plan.worldSize)
    r.fail("ranks", fmt::format("expected {} ranks (world_size) but found {}", plan.worldSize,
                                ranks.size()));
  for (size_t ri = 0; ri < ranks.size(); ++ri) {
    JsonFields rr = r.element("ranks", ri);
    PlanRank rank;
    rank.rank = rr.integer("rank", 0);
    const json &buffers = rr.array("buffers");
    for (size_t i = 0; i < buffers.size(); ++i) {
      JsonFields b = rr.element("buffers", i);
      PlanBuffer pb;
      pb.width = b.integer("width", 1);
      if (!parseDType(b.string("dtype"), pb.dtype) || (pb.dtype != DType::F32 && pb.dtype != DType::I32))
        b.fail("dtype", "expected F32 or I32");
      pb.bytes = b.integer("bytes", 0);
      if (pb.bytes != plan.maxBatchTokens * pb.width * 4)
        b.fail("bytes", "expected max_batch_tokens x width x 4");
      rank.buffers.push_back(pb);
    }
    const json &caches = rr.array("kv_caches");
    for (size_t i = 0; i < caches.size(); ++i) {
      JsonFields c = rr.element("kv_caches", i);
      rank.caches.push_back({c.integer("key_width", 1), c.integer("value_width", 1),
                             c.integer("bytes", 0)});
    }
    auto bufferId = [&](const JsonFields &reader, const std::string &field, int64_t id) {
      if (id < 0 || id >= static_cast<int64_t>(rank.buffers.size()))
        reader.fail(field, fmt::format("buffer {} out of range", id));
      return id;
    };
    JsonFields inputs = rr.child("inputs");
    rank.tokensBuffer = bufferId(inputs, "tokens", inputs.integer("tokens"));
    rank.positionsBuffer = bufferId(inputs, "positions", inputs.integer("positions"));
    rank.logitsBuffer = bufferId(rr, "logits", rr.integer("logits"));
    if (rank.buffers[rank.logitsBuffer].width != plan.vocabSize)
      rr.fail("logits", "the logits buffer is not vocab_size wide");
    rank.predictedPeakBytes = rr.child("memory").integer("peak", 0);

    const json &steps = rr.array("steps");
    for (size_t i = 0; i < steps.size(); ++i) {
      JsonFields s = rr.element("steps", i);
      PlanStep step;
      step.op = parseOp(s, s.string("op"));
      step.in = s.integers("in", 0);
      step.out = s.integers("out", 0);
      step.weights = s.integers("weights", 0);
      for (int64_t id : step.in)
        bufferId(s, "in", id);
      for (int64_t id : step.out)
        bufferId(s, "out", id);
      for (int64_t id : step.weights)
        if (id >= static_cast<int64_t>(plan.weights.size()))
          s.fail("weights", fmt::format("weight {} out of range", id));
      JsonFields a = s.child("attrs");
      if (a.has("eps")) step.eps = a.number("eps");
      if (a.has("scale")) step.scale = a.number("scale");
      if (a.has("head_dim")) step.headDim = a.integer("head_dim", 1);
      if (a.has("heads")) step.heads = a.integer("heads", 1);
      if (a.has("kv_heads")) step.kvHeads = a.integer("kv_heads", 1);
      if (a.has("sliding_window")) step.slidingWindow = a.integer("sliding_window", 0);
      if (a.has("kv_cache")) step.kvCache = a.integer("kv_cache", 0);
      if (a.has("rope")) step.rope = parseRope(a.child("rope"));
      if (a.has("routing")) step.routing = parseRouting(a.child("routing"));
      if (a.has("activation")) step.activation = parseActivation(a);
      if (a.has("widths")) step.widths = a.integers("widths", 1);
      rank.steps.push_back(std::move(step));
      StepChecker(plan, rank, rank.steps.back(), i).check();
    }
    plan.ranks.push_back(std::move(rank));
  }
  return plan;
}

void checkNoUnexpectedTensors(const Plan &plan, const Checkpoint &checkpoint) {
  std::unordered_set<std::string> known;
  for (const PlanWeight &w : plan.weights) {
    if (w.experts == 0)
      known.insert(w.name);
    for (int64_t e = 0; e < w.experts; ++e)
      known.insert(w.expertName(e));
  }
  for (const std::string &name : checkpoint.names()) {
    if (known.count(name))
      continue;
    bool unused = false;
    for (const std::string &prefix : plan.unusedTensorPrefixes)
      unused |= name.rfind(prefix, 0) == 0;
    // Older checkpoints store RoPE's inverse frequencies, a derived buffer.
    const std::string suffix = ".rotary_emb.inv_freq";
    unused |= name.size() > suffix.size() &&
              name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    if (!unused)
      inputError("{}: unexpected tensor '{}': the plan's model has no such weight (a checkpoint "
                 "of another model?)",
                 checkpoint.fileOf(name), name);
  }
}

} // namespace moert
