// Loading and validating a plan (one program's reading: PlanProgram.cpp).
// Nothing in the file is trusted: the checks here are what make the
// executor's indexing safe.
#include "moert/Plan.h"
#include "moert/PlanSeal.h"
#include "moert/Checkpoint.h"
#include "moert/Error.h"

#include "JsonFields.h"
#include "PlanReaders.h"
#include "moe/PlanSchema.h"
#include "InputFile.h"
#include "PlanChecks.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <tuple>
#include <unordered_set>

namespace moert {
namespace {
// Limits on the sizes a plan may ask for (moe/PlanSchema.h, docs/plan-format.md).
using moe::plan::kMaxBatchTokens;
using moe::plan::kMaxSeqLen;
using moe::plan::kMaxSequences;
using moe::plan::kMaxWorldSize;

using nlohmann::json;

/// The widths of `program`'s sends (or recvs) to (from) stage `peer`, in
/// order.
std::vector<int64_t> transfers(const PlanProgram &program, Collective op, int64_t peer) {
  std::vector<int64_t> widths;
  for (const PlanStep &s : program.steps)
    if (s.op->collective == op && peerStage(s, program.stage) == peer)
      widths.push_back(program.buffers[op == Collective::Send ? s.in[0] : s.out[0]].width);
  return widths;
}

/// What the rank's FP8 weights hold beyond the program's figure, which
/// counts them in their compute dtype: minus the bytes they save, plus their
/// block scales (negative for a plan with FP8 weights).
int64_t storedWeightBytesDelta(const Plan &plan, int64_t rank);

} // namespace

std::string PlanWeight::expertName(int64_t e) const {
  std::string n = name;
  size_t at = n.find("{e}");
  return at == std::string::npos ? n : n.replace(at, 3, std::to_string(e));
}

int64_t PlanWeight::heldBytes() const {
  const int64_t n = TensorView{dtype, shape, nullptr}.numel();
  if (!int8Block)
    return n * static_cast<int64_t>(dtypeSize(dtype));
  const int64_t cols = shape.back(), rows = n / std::max<int64_t>(cols, 1);
  return n + rows * ((cols + int8Block - 1) / int8Block) * static_cast<int64_t>(sizeof(float));
}

std::vector<int64_t> PlanWeight::tensorShape() const {
  if (experts == 0)
    return shape;
  return std::vector<int64_t>(shape.begin() + 1, shape.end());
}

Plan Plan::load(const std::string &path) {
  const PlanDocument doc = readPlanDocument(path);
  const json &root = doc.root;
  Plan plan;
  plan.path = path;
  JsonFields r(root, plan.path, "");
  plan.layout = std::make_shared<const PlanLayout>(readPlanLayout(r, path));
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
  workload.onlyMembers(moe::plan::members::kWorkload);
  // Limits keep every size computed from them far from overflow
  // (docs/plan-format.md).
  plan.maxBatchTokens = workload.bounded("max_batch_tokens", 1, kMaxBatchTokens);
  plan.maxSeqLen = workload.bounded("max_seq_len", 1, kMaxSeqLen);
  plan.maxSequences = workload.bounded("max_sequences", 1, kMaxSequences);
  plan.worldSize = r.bounded("world_size", 1, kMaxWorldSize);
  if (r.has("ranks_per_process")) {
    plan.ranksPerProcess = r.bounded("ranks_per_process", 1, plan.worldSize);
    if (plan.worldSize % plan.ranksPerProcess)
      r.fail("ranks_per_process", fmt::format("expected a divisor of world_size ({}) but got {}",
                                              plan.worldSize, plan.ranksPerProcess));
  }

  if (r.has("fp8_activations")) {
    if (r.string("fp8_activations") != "dynamic")
      r.fail("fp8_activations", fmt::format("expected \"dynamic\" but got \"{}\"",
                                            r.string("fp8_activations")));
    plan.fp8DynamicActivations = true;
  }

  // Degrees: absent ones are 1; edp follows from the others when absent
  // (both folds cover the same ranks: dp x tp = edp x ep x etp).
  Degrees &d = plan.degrees;
  if (r.has("degrees") || plan.worldSize > 1) {
    JsonFields degrees = r.child("degrees");
    using Field = std::pair<const char *, int64_t *>;
    for (auto [field, value] : std::initializer_list<Field>{
             {"dp", &d.dp}, {"pp", &d.pp}, {"tp", &d.tp}, {"ep", &d.ep}, {"etp", &d.etp}})
      if (degrees.has(field))
        *value = degrees.integer(field, 1);
    if ((d.dp * d.tp) % (d.ep * d.etp))
      degrees.fail("ep", fmt::format("ep x etp = {} does not divide dp x tp = {}", d.ep * d.etp,
                                     d.dp * d.tp));
    d.edp = d.dp * d.tp / (d.ep * d.etp);
    if (degrees.has("edp") && degrees.integer("edp", 1) != d.edp)
      degrees.fail("edp", fmt::format("expected dp x tp / (ep x etp) = {}", d.edp));
    if (d.dp * d.pp * d.tp != plan.worldSize)
      degrees.fail("dp", fmt::format("dp x pp x tp = {} but world_size is {}",
                                     d.dp * d.pp * d.tp, plan.worldSize));
  }

  // The vocabulary: padded to a multiple of tp (and pad_to) for the sharded
  // embedding and head; absent in unpadded plans.
  plan.paddedVocab = plan.vocabSize;
  if (r.has("vocab")) {
    JsonFields vocab = r.child("vocab");
    vocab.onlyMembers(moe::plan::members::kVocab);
    if (vocab.integer("size", 1) != plan.vocabSize)
      vocab.fail("size", fmt::format("expected model.vocab_size ({})", plan.vocabSize));
    plan.paddedVocab = vocab.integer("padded", 1);
    int64_t padTo = vocab.integer("pad_to", 1);
    if (plan.paddedVocab < plan.vocabSize || plan.paddedVocab % d.tp || plan.paddedVocab % padTo)
      vocab.fail("padded", fmt::format("expected a multiple of tp ({}) and pad_to ({}) of at "
                                       "least size ({}) but got {}", d.tp, padTo,
                                       plan.vocabSize, plan.paddedVocab));
  }
  // Each stage's first layer (moec also writes the end: pp + 1 entries).
  if (r.has("stage_begin")) {
    std::vector<int64_t> begins = r.integers("stage_begin", 0);
    int64_t n = static_cast<int64_t>(begins.size());
    if ((n != d.pp && n != d.pp + 1) || !std::is_sorted(begins.begin(), begins.end()))
      r.fail("stage_begin", fmt::format("expected pp = {} (or pp + 1) increasing layer indices",
                                        d.pp));
  }

  const json &weights = r.array("weights");
  for (size_t i = 0; i < weights.size(); ++i)
    plan.weights.push_back(readWeight(r.element("weights", i)));

  const json &programs = r.array("programs");
  if (programs.empty())
    r.fail("programs", "expected at least one program");
  for (size_t i = 0; i < programs.size(); ++i)
    plan.programs.push_back(readProgram(plan, r.element("programs", i), i));
  readEntries(r, plan);
  // What stage s sends stage t (s + 1, or s - 1 in a pipelined backward
  // program), stage t receives from s, in the same order and widths.
  for (size_t i = 0; i < plan.programs.size(); ++i)
    for (size_t j = 0; j < plan.programs.size(); ++j) {
      const PlanProgram &from = plan.programs[i], &to = plan.programs[j];
      if (std::abs(to.stage - from.stage) != 1 || to.entry != from.entry)
        continue;
      const std::vector<int64_t> sent = transfers(from, Collective::Send, to.stage),
                                 received = transfers(to, Collective::Recv, from.stage);
      if (sent != received)
        r.fail(fmt::format("programs[{}]", j),
               fmt::format("its recvs from stage {} (widths {}) differ from the sends of "
                           "programs[{}] (widths {})",
                           from.stage, shapeString(received), i, shapeString(sent)));
    }

  const json &ranks = r.array("ranks");
  if (static_cast<int64_t>(ranks.size()) != plan.worldSize)
    r.fail("ranks", fmt::format("expected {} ranks (world_size) but found {}", plan.worldSize,
                                ranks.size()));
  for (size_t ri = 0; ri < ranks.size(); ++ri) {
    JsonFields rr = r.element("ranks", ri);
    PlanRank rank;
    rank.rank = rr.integer("rank", 0);
    if (rank.rank != static_cast<int64_t>(ri))
      rr.fail("rank", fmt::format("expected {}", ri));
    rank.program = rr.integer("program", 0);
    if (rank.program >= static_cast<int64_t>(plan.programs.size()))
      rr.fail("program", fmt::format("program {} out of range (the plan has {})", rank.program,
                                     plan.programs.size()));
    // Coordinates: on both folds they must give back the rank itself.
    RankCoords &c = rank.coords;
    if (rr.has("coords") || plan.worldSize > 1) {
      JsonFields coords = rr.child("coords");
      coords.onlyMembers(moe::plan::members::kCoords);
      using Field = std::tuple<const char *, int64_t *, int64_t>;
      for (auto [field, value, degree] : std::initializer_list<Field>{
               {"dp", &c.dp, d.dp}, {"pp", &c.pp, d.pp}, {"tp", &c.tp, d.tp},
               {"edp", &c.edp, d.edp}, {"ep", &c.ep, d.ep}, {"etp", &c.etp, d.etp}}) {
        *value = coords.integer(field, 0);
        if (*value >= degree)
          coords.fail(field, fmt::format("expected a value below the degree {} but got {}",
                                         degree, *value));
      }
      if (attentionRank(d, c) != rank.rank || expertRank(d, c) != rank.rank)
        rr.fail("coords", fmt::format("they fold to rank {} on @mesh and {} on @experts but "
                                      "this is rank {}", attentionRank(d, c), expertRank(d, c),
                                      rank.rank));
    }
    if (plan.programs[rank.program].stage != c.pp)
      rr.fail("program", fmt::format("program {} is of stage {} but the rank is on stage {}",
                                     rank.program, plan.programs[rank.program].stage, c.pp));
    if (plan.programs[rank.program].entry != plan.programs[0].entry)
      rr.fail("program", fmt::format("program {} is of entry '{}', not the first entry ('{}')",
                                     rank.program, plan.programs[rank.program].entry,
                                     plan.programs[0].entry));
    JsonFields memory = rr.child("memory");
    memory.onlyMembers(moe::plan::members::kRankMemory);
    // The planner's estimate of the rank's slices is exact; its peak is a
    // model of any program. The prediction the runtime is held to is the
    // compiled programs': their (local) weights and KV caches, which a
    // rank's entries share, and each entry's buffers.
    rank.predictedWeightBytes = memory.integer("weights", 0);
    const PlanProgram &program = plan.programs[rank.program];
    rank.predictedPeakBytes = program.weightBytes + program.cacheBytes +
                              storedWeightBytesDelta(plan, static_cast<int64_t>(ri));
    plan.ranks.push_back(std::move(rank));
    // Each entry's buffers; a state buffer once however many entries name it
    // (a pipeline stage's kept value once per micro-batch in flight).
    std::set<std::string> states;
    for (const PlanProgram *entry : plan.entriesOf(static_cast<int64_t>(ri))) {
      plan.ranks.back().predictedPeakBytes += entry->activationBytes;
      for (const PlanBuffer &b : entry->buffers)
        if (!b.state.empty() && states.insert(b.state).second)
          plan.ranks.back().predictedPeakBytes +=
              b.bytes * (b.kept() ? plan.stashSlots(program.stage) : 1);
    }
  }
  return plan;
}

std::vector<int> Plan::groupOf(int64_t rank, const CollectiveGroup &group) const {
  std::vector<int> members;
  RankCoords c = ranks.at(rank).coords;
  int64_t &coordinate = axisCoord(c, group.axis);
  for (int64_t q = 0; q < axisSize(degrees, group.axis); ++q) {
    coordinate = q;
    members.push_back(static_cast<int>(group.mesh == CollectiveGroup::Mesh::Attention
                                           ? attentionRank(degrees, c)
                                           : expertRank(degrees, c)));
  }
  return members;
}

std::vector<const PlanProgram *> Plan::entriesOf(int64_t rank) const {
  const PlanProgram &own = programOf(rank);
  std::vector<const PlanProgram *> entries{&own};
  for (const PlanProgram &p : programs)
    if (p.stage == own.stage && &p != &own)
      entries.push_back(&p);
  return entries;
}

int64_t Plan::maxBatchTokensOf(const std::string &entry) const {
  int64_t most = maxBatchTokens;
  for (const PlanProgram &p : programs)
    if (p.entry == entry)
      most = std::min(most, p.maxBatchTokens);
  return most;
}

int64_t Plan::stageRank(int64_t rank, int64_t stage) const {
  RankCoords c = ranks.at(rank).coords;
  c.pp = stage;
  return attentionRank(degrees, c);
}

namespace {
int64_t storedWeightBytesDelta(const Plan &plan, int64_t rank) {
  if (!plan.layout)
    return 0;
  const std::vector<PlanSlice> &slices = plan.layout->ranks.at(static_cast<size_t>(rank));
  // Most plans have no FP8 slice: nothing to index (a many-rank DeepSeek
  // plan has millions of expert tensors).
  std::unordered_map<std::string, const PlanSlice *> scalesOf;
  for (const PlanSlice &s : slices)
    if (s.name.size() > 10 && s.name.compare(s.name.size() - 10, 10, "_scale_inv") == 0)
      scalesOf.emplace(s.name.substr(0, s.name.size() - 10), &s);
  if (scalesOf.empty())
    return 0;
  std::unordered_map<std::string, DType> computeDtype;
  for (const PlanWeight &w : plan.weights)
    for (int64_t e = 0; e < std::max<int64_t>(w.experts, 1); ++e)
      computeDtype.emplace(w.experts ? w.expertName(e) : w.name, w.dtype);
  int64_t delta = 0;
  for (const PlanSlice &s : slices) {
    if (s.block.empty())
      continue;
    auto found = computeDtype.find(s.name);
    const int64_t n = TensorView{s.dtype, s.shape, nullptr}.numel();
    if (found != computeDtype.end())
      delta += n * (static_cast<int64_t>(dtypeSize(s.dtype)) -
                    static_cast<int64_t>(dtypeSize(found->second)));
    if (auto scales = scalesOf.find(s.name); scales != scalesOf.end())
      delta += TensorView{scales->second->dtype, scales->second->shape, nullptr}.bytes();
  }
  return delta;
}
} // namespace

void checkNoUnexpectedTensors(const Plan &plan, const Checkpoint &checkpoint) {
  std::unordered_set<std::string> known;
  for (const PlanWeight &w : plan.weights) {
    // A checkpoint with fused experts holds them under the fused names.
    auto add = [&](const std::string &name) {
      known.insert(name);
      const std::string stored = checkpoint.storedName(name);
      if (!stored.empty())
        known.insert(stored);
    };
    if (w.experts == 0)
      add(w.name);
    for (int64_t e = 0; e < w.experts; ++e)
      add(w.expertName(e));
  }
  // Tensors only the layout names: the block scales of FP8 weights.
  if (plan.layout)
    for (const std::vector<PlanSlice> &rank : plan.layout->ranks)
      for (const PlanSlice &s : rank)
        if (!s.block.empty())
          known.insert(s.name + "_scale_inv");
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
    // A tensor without elements carries nothing to compute with (transformers
    // saves DeepSeek's shared experts as [0, H] tensors when
    // n_shared_experts is 0).
    if (!unused) {
      const std::vector<int64_t> shape = checkpoint.shapeOf(name);
      unused = std::find(shape.begin(), shape.end(), 0) != shape.end();
    }
    if (!unused)
      inputError("{}: unexpected tensor '{}': the plan's model has no such weight (a checkpoint "
                 "of another model?)",
                 checkpoint.fileOf(name), name);
  }
}

} // namespace moert
