//===- ReportModel.cpp - the figures a plan report draws -------------------===//
//
// Reads a plan (docs/plan-format.md) and a moert --report-json file into
// report::Model. A missing or mistyped field is an error naming the file
// and the field. nlohmann/json (as moert's plan reader): a plan of 2,048
// ranks is 11 MB of JSON, which llvm::json's tree takes seconds to build and
// free, nlohmann's a fraction of one.
//
//===----------------------------------------------------------------------===//
#include "ReportModel.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"

#include <nlohmann/json.hpp>

using namespace llvm;
using Json = nlohmann::json;

namespace moe::report {

/// "dp 2 x tp 2 x ep 2" (axes of degree > 1; "1 rank" when none).
std::string degreesText(const Json &degrees);

namespace {

/// Typed access that remembers the first problem ("FILE: where: message").
class Reader {
public:
  explicit Reader(std::string file) : file(std::move(file)) {}
  const Json *get(const Json &o, StringRef key) {
    if (!o.is_object())
      return nullptr;
    auto it = o.find(key.str());
    return it == o.end() ? nullptr : &*it;
  }
  int64_t integer(const Json &o, StringRef key, StringRef where) {
    if (const Json *v = get(o, key); v && v->is_number_integer())
      return v->get<int64_t>();
    fail(where, key, "expected an integer");
    return 0;
  }
  double number(const Json &o, StringRef key, StringRef where) {
    if (const Json *v = get(o, key); v && v->is_number())
      return v->get<double>();
    fail(where, key, "expected a number");
    return 0;
  }
  std::string string(const Json &o, StringRef key, StringRef where) {
    if (const Json *v = get(o, key); v && v->is_string())
      return v->get<std::string>();
    fail(where, key, "expected a string");
    return "";
  }
  const Json &object(const Json &o, StringRef key, StringRef where) {
    if (const Json *v = get(o, key); v && v->is_object())
      return *v;
    fail(where, key, "expected an object");
    return empty;
  }
  const Json &array(const Json &o, StringRef key, StringRef where) {
    if (const Json *v = get(o, key); v && v->is_array())
      return *v;
    fail(where, key, "expected an array");
    return emptyArray;
  }
  std::vector<int64_t> integers(const Json &o, StringRef key, StringRef where) {
    std::vector<int64_t> out;
    for (const Json &v : array(o, key, where)) {
      if (v.is_number_integer())
        out.push_back(v.get<int64_t>());
      else
        fail(where, key, "expected integers");
    }
    return out;
  }
  Memory memory(const Json &o, StringRef where) {
    const Json &m = object(o, "memory", where);
    std::string at = (where + "memory.").str();
    Memory out;
    out.weights = integer(m, "weights", at);
    out.kvCache = integer(m, "kv_cache", at);
    out.activations = integer(m, "activations", at);
    out.workspace = get(m, "workspace") ? integer(m, "workspace", at) : 0;
    out.peak = integer(m, "peak", at);
    return out;
  }
  void fail(StringRef where, StringRef key, StringRef message) {
    if (problem.empty())
      problem = formatv("{0}: {1}{2}: {3}", file, where, key, message).str();
  }
  Error error() const {
    return problem.empty() ? Error::success()
                           : createStringError(inconvertibleErrorCode(), problem);
  }

private:
  std::string file, problem;
  Json empty = Json::object(), emptyArray = Json::array();
};

Expected<Json> parseFile(StringRef path, StringRef what) {
  auto buffer = MemoryBuffer::getFile(path);
  if (!buffer)
    return createStringError(buffer.getError(), "%s: cannot read %s: %s", path.str().c_str(),
                             what.str().c_str(), buffer.getError().message().c_str());
  Json value = Json::parse((*buffer)->getBuffer().begin(), (*buffer)->getBuffer().end(),
                           nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded())
    return createStringError(inconvertibleErrorCode(), "%s: not valid JSON", path.str().c_str());
  if (!value.is_object())
    return createStringError(inconvertibleErrorCode(), "%s: expected a JSON object",
                             path.str().c_str());
  return value;
}

void readPlanner(Reader &r, const Json &p, Model &m) {
  m.hasPlanner = true;
  m.layoutsConsidered = r.integer(p, "layouts_considered", "planner.");
  m.fitting = r.integer(p, "fitting", "planner.");
  if (const Json *c = r.get(p, "cluster")) {
    m.cluster = r.string(*c, "name", "planner.cluster.");
    m.clusterDescription = r.string(*c, "description", "planner.cluster.");
    m.devicesPerNode = std::max<int64_t>(1, r.integer(*c, "devices_per_node", "planner.cluster."));
    m.memoryBytes = r.integer(*c, "memory_bytes", "planner.cluster.");
  }
  auto alternative = [&](const Json &a, StringRef where) {
    Alternative out;
    out.degrees = degreesText(r.object(a, "degrees", where));
    if (const Json *fits = r.get(a, "fits")) {
      out.fits = fits->is_boolean() && fits->get<bool>();
      out.peak = r.integer(r.object(a, "memory", where), "peak", (where + "memory.").str());
      out.tokensPerSecond = r.number(a, "tokens_per_second", where);
    } else {
      out.fits = false;
      out.reason = r.string(a, "reason", where);
    }
    return out;
  };
  if (const Json *chosen = r.get(p, "chosen")) {
    m.tokensPerSecond = r.number(*chosen, "tokens_per_second", "planner.chosen.");
    m.memoryBudget = r.integer(*chosen, "memory_budget", "planner.chosen.");
    const Json &time = r.object(*chosen, "time", "planner.chosen.");
    m.stepSeconds = r.number(time, "total", "planner.chosen.time.");
    m.bubbleSeconds = r.number(time, "bubble", "planner.chosen.time.");
    if (const Json *links = r.get(*chosen, "links"); links && links->is_object())
      for (auto it = links->begin(); it != links->end(); ++it)
        if (it->is_string())
          m.links[it.key()] = it->get<std::string>();
    m.alternatives.push_back(alternative(*chosen, "planner.chosen."));
    const Json &stages = r.array(*chosen, "stages", "planner.chosen.");
    for (size_t i = 0; i < stages.size(); ++i) {
      std::string where = formatv("planner.chosen.stages[{0}].", i);
      const Json &s = stages[i];
      StageTime st;
      std::vector<int64_t> layers = r.integers(s, "layers", where);
      if (layers.size() == 2) {
        st.firstLayer = layers[0];
        st.endLayer = layers[1];
      }
      const Json &t = r.object(s, "microbatch_time", where);
      for (const char *part : kTimeParts)
        st.parts.push_back({part, r.number(t, part, where + "microbatch_time.")});
      st.memory = r.memory(s, where);
      m.stages.push_back(std::move(st));
    }
  }
  const Json &alts = r.array(p, "alternatives", "planner.");
  for (size_t i = 0; i < alts.size(); ++i)
    m.alternatives.push_back(alternative(alts[i], formatv("planner.alternatives[{0}].", i).str()));
  const Json &rejected = r.array(p, "rejected", "planner.");
  for (size_t i = 0; i < rejected.size(); ++i)
    m.rejected.push_back(alternative(rejected[i], formatv("planner.rejected[{0}].", i).str()));
}

void readRank(Reader &r, const Json &o, size_t i, Model &m) {
  std::string where = formatv("ranks[{0}].", i);
  Rank k;
  k.rank = r.integer(o, "rank", where);
  k.program = r.integer(o, "program", where);
  const Json &c = r.object(o, "coords", where);
  std::string at = where + "coords.";
  k.dp = r.integer(c, "dp", at);
  k.pp = r.integer(c, "pp", at);
  k.tp = r.integer(c, "tp", at);
  k.edp = r.integer(c, "edp", at);
  k.ep = r.integer(c, "ep", at);
  k.etp = r.integer(c, "etp", at);
  k.memory = r.memory(o, where);
  k.slicesOf = k.rank;
  if (r.get(o, "weights_of_rank")) {
    k.slicesOf = r.integer(o, "weights_of_rank", where);
  } else {
    std::vector<Slice> &slices = m.slices[k.rank];
    const Json &list = r.array(o, "weights", where);
    slices.reserve(list.size());
    for (size_t j = 0; j < list.size(); ++j) {
      const Json &s = list[j];
      std::string sw = formatv("{0}weights[{1}].", where, j);
      Slice slice;
      slice.name = r.string(s, "name", sw);
      slice.dtype = r.string(s, "dtype", sw);
      slice.offset = r.integers(s, "offset", sw);
      slice.shape = r.integers(s, "shape", sw);
      slice.globalShape = r.integers(s, "global_shape", sw);
      slice.bytes = r.integer(s, "bytes", sw);
      const Json *primary = r.get(s, "primary");
      k.primaryBytes += !primary || (primary->is_boolean() && primary->get<bool>()) ? slice.bytes : 0;
      slices.push_back(std::move(slice));
    }
  }
  if (k.rank < 0 || k.rank != static_cast<int64_t>(i))
    r.fail(where, "rank", "expected the ranks in order");
  m.ranks.push_back(k);
}

/// Slice totals and expert ranges, once every rank is read.
void summarizeRanks(Reader &r, Model &m) {
  for (Rank &k : m.ranks) {
    auto found = m.slices.find(k.slicesOf);
    if (found == m.slices.end()) {
      r.fail(formatv("ranks[{0}].", k.rank).str(), "weights_of_rank",
             "names a rank that lists no slices");
      continue;
    }
    k.slices = static_cast<int64_t>(found->second.size());
    k.sliceBytes = 0;
    // The stack's experts on this rank: per-expert tensors ("...experts.{e}.w1")
    // by their index, a fused stack by its box's first dimension.
    const size_t hole = m.expertStack.find("{e}");
    const std::string prefix = m.expertStack.substr(0, hole);
    const std::string suffix = hole == std::string::npos ? "" : m.expertStack.substr(hole + 3);
    int64_t lo = INT64_MAX, hi = -1, count = 0;
    for (const Slice &s : found->second) {
      k.sliceBytes += s.bytes;
      if (m.expertStack.empty())
        continue;
      if (hole == std::string::npos) {
        if (s.name == m.expertStack && !s.offset.empty() && !s.shape.empty()) {
          lo = s.offset[0];
          hi = s.offset[0] + s.shape[0] - 1;
          count = s.shape[0];
        }
      } else if (s.name.size() > prefix.size() + suffix.size() &&
                 StringRef(s.name).starts_with(prefix) && StringRef(s.name).ends_with(suffix)) {
        int64_t e;
        if (!StringRef(s.name)
                 .substr(prefix.size(), s.name.size() - prefix.size() - suffix.size())
                 .getAsInteger(10, e)) {
          lo = std::min(lo, e);
          hi = std::max(hi, e);
          ++count;
        }
      }
    }
    if (count > 0) {
      if (hi - lo + 1 != count)
        r.fail(formatv("ranks[{0}].", k.rank).str(), "weights",
               "the expert stack's experts are not one range");
      k.firstExpert = lo;
      k.experts = count;
    }
    if (k.slicesOf != k.rank)
      k.primaryBytes = 0; // another rank's slices: read, not owned
  }
}

} // namespace

std::string degreesText(const Json &degrees) {
  std::string out;
  for (const char *axis : {"dp", "pp", "tp", "ep", "etp"}) {
    auto it = degrees.is_object() ? degrees.find(axis) : degrees.end();
    if (it != degrees.end() && it->is_number_integer() && it->get<int64_t>() > 1)
      out += formatv("{0}{1} {2}", out.empty() ? "" : " x ", axis, it->get<int64_t>()).str();
  }
  return out.empty() ? "1 rank" : out;
}

Expected<Model> readModel(StringRef planPath, StringRef measuredPath) {
  Expected<Json> plan = parseFile(planPath, "the plan");
  if (!plan)
    return plan.takeError();
  const Json &root = *plan;
  Reader r(planPath.str());
  Model m;
  m.planPath = planPath.str();
  const Json &model = r.object(root, "model", "");
  m.modelType = r.string(model, "model_type", "model.");
  if (const Json *source = r.get(model, "source"); source && source->is_string())
    m.source = source->get<std::string>();
  const Json &workload = r.object(root, "workload", "");
  m.maxBatchTokens = r.integer(workload, "max_batch_tokens", "workload.");
  m.maxSeqLen = r.integer(workload, "max_seq_len", "workload.");
  m.maxSequences = r.integer(workload, "max_sequences", "workload.");
  m.worldSize = r.integer(root, "world_size", "");
  m.devicesPerNode = m.worldSize;
  for (const char *axis : {"dp", "pp", "tp", "ep", "etp", "edp"})
    m.degrees[axis] = r.integer(r.object(root, "degrees", ""), axis, "degrees.");
  const Json &vocab = r.object(root, "vocab", "");
  m.vocabSize = r.integer(vocab, "size", "vocab.");
  m.padded = r.integer(vocab, "padded", "vocab.");
  m.padTo = r.integer(vocab, "pad_to", "vocab.");
  m.stageBegin = r.integers(root, "stage_begin", "");
  for (const Json &w : r.array(root, "weights", ""))
    if (const Json *experts = r.get(w, "experts");
        experts && experts->is_number_integer() && m.expertStack.empty()) {
      m.expertStack = r.string(w, "name", "weights[].");
      m.numExperts = experts->get<int64_t>();
    }
  if (const Json *planner = r.get(root, "planner"))
    readPlanner(r, *planner, m);
  std::vector<int64_t> programPeaks;
  const Json &programs = r.array(root, "programs", "");
  for (size_t i = 0; i < programs.size(); ++i)
    programPeaks.push_back(r.integer(r.object(programs[i], "memory", formatv("programs[{0}].", i).str()),
                                     "peak", formatv("programs[{0}].memory.", i).str()));
  const Json &ranks = r.array(root, "ranks", "");
  for (size_t i = 0; i < ranks.size(); ++i)
    readRank(r, ranks[i], i, m);
  if (static_cast<int64_t>(m.ranks.size()) != m.worldSize)
    r.fail("", "ranks", formatv("{0} entries for world_size {1}", m.ranks.size(), m.worldSize).str());
  if (Error e = r.error())
    return std::move(e);
  summarizeRanks(r, m);
  for (Rank &k : m.ranks) {
    if (k.program < 0 || k.program >= static_cast<int64_t>(programPeaks.size()))
      r.fail(formatv("ranks[{0}].", k.rank).str(), "program", "names no program of the plan");
    else
      k.programPeak = programPeaks[k.program];
  }
  if (Error e = r.error())
    return std::move(e);
  if (measuredPath.empty())
    return m;

  Expected<Json> measured = parseFile(measuredPath, "the measured figures");
  if (!measured)
    return measured.takeError();
  Reader mr(measuredPath.str());
  const Json &mo = *measured;
  if (mr.string(mo, "format", "") != "moert-measured")
    mr.fail("", "format", "expected \"moert-measured\" (moert run --report-json)");
  if (mr.integer(mo, "world_size", "") != m.worldSize)
    mr.fail("", "world_size", formatv("does not match the plan's {0}", m.worldSize).str());
  const Json &mranks = mr.array(mo, "ranks", "");
  for (size_t i = 0; i < mranks.size(); ++i) {
    std::string where = formatv("ranks[{0}].", i);
    int64_t rank = mr.integer(mranks[i], "rank", where);
    if (rank < 0 || rank >= m.worldSize) {
      mr.fail(where, "rank", "out of the plan's ranks");
      continue;
    }
    m.ranks[rank].measuredWeights = mr.integer(mranks[i], "weights_loaded", where);
    m.ranks[rank].measuredPeak = mr.integer(mranks[i], "peak", where);
  }
  const Json &gen = mr.object(mo, "generation", "");
  m.measuredTokens = mr.integer(gen, "tokens", "generation.");
  m.measuredSeconds = mr.number(gen, "seconds", "generation.");
  m.measuredTokensPerSecond = mr.number(gen, "tokens_per_second", "generation.");
  if (Error e = mr.error())
    return std::move(e);
  m.measured = true;
  m.measuredPath = measuredPath.str();
  return m;
}

} // namespace moe::report
