//===- Planner.cpp - enumerate, estimate, choose ----------------*- C++ -*-===//
#include "moe/Analysis/Planner.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

using namespace llvm;
using namespace moe::sharding;

namespace moe::sharding {
// CostModel.cpp
std::string degreeProblem(const ModelInfo &m, StringRef axis, int64_t value);
LayoutEstimate estimateValidLayout(const ModelInfo &m, const Cluster &cluster,
                                   const Workload &w, const PlanOptions &o,
                                   const Degrees &d);
} // namespace moe::sharding

namespace {

Error makeError(const Twine &message) {
  return createStringError(inconvertibleErrorCode(), "%s",
                           message.str().c_str());
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      out.push_back(i);
      if (i != n / i)
        out.push_back(n / i);
    }
  llvm::sort(out);
  return out;
}

struct Given {
  StringRef axis;
  int64_t value;
};

/// "--pp 2 --tp 8" and "pp x tp".
std::string flags(ArrayRef<Given> g) {
  std::string s;
  for (const Given &x : g)
    s += formatv("{0}--{1} {2}", s.empty() ? "" : " ", x.axis, x.value).str();
  return s;
}
std::string names(ArrayRef<Given> g) {
  std::string s;
  for (const Given &x : g)
    s += (s.empty() ? "" : " x ") + x.axis.str();
  return s;
}
int64_t product(ArrayRef<Given> g) {
  int64_t p = 1;
  for (const Given &x : g)
    p *= x.value;
  return p;
}

bool agrees(const FixedDegrees &f, const Degrees &d) {
  return (!f.dp || *f.dp == d.dp) && (!f.pp || *f.pp == d.pp) &&
         (!f.tp || *f.tp == d.tp) && (!f.ep || *f.ep == d.ep) &&
         (!f.etp || *f.etp == d.etp);
}

std::string gib(int64_t bytes) {
  return formatv("{0:F1} GiB", double(bytes) / double(int64_t(1) << 30)).str();
}

std::string seconds(double s) {
  if (s >= 1)
    return formatv("{0:F2} s", s).str();
  if (s >= 1e-3)
    return formatv("{0:F2} ms", s * 1e3).str();
  return formatv("{0:F1} us", s * 1e6).str();
}

/// Log-quantized time per token: equal keys are ties (1e-6 relative).
int64_t speedKey(const LayoutEstimate &e) {
  double perToken = e.time.total / double(e.layout.degrees.dp);
  return std::llround(std::log(perToken) * 1e6);
}

bool better(const LayoutEstimate &a, const LayoutEstimate &b) {
  int64_t ka = speedKey(a), kb = speedKey(b);
  if (ka != kb)
    return ka < kb;
  const Degrees &x = a.layout.degrees, &y = b.layout.degrees;
  if (x.pp != y.pp)
    return x.pp < y.pp;
  if (x.tp != y.tp)
    return x.tp < y.tp;
  if (x.etp != y.etp)
    return x.etp < y.etp;
  return x.ep > y.ep;
}

} // namespace

Error moe::sharding::validateFixedDegrees(const ModelInfo &m, int64_t W,
                                          const FixedDegrees &f) {
  if (W <= 0)
    return makeError(
        formatv("--world-size {0}: expected a positive integer", W));
  std::pair<StringRef, const std::optional<int64_t> *> axes[] = {
      {"dp", &f.dp},
      {"pp", &f.pp},
      {"tp", &f.tp},
      {"ep", &f.ep},
      {"etp", &f.etp}};
  for (auto [axis, value] : axes) {
    if (!*value)
      continue;
    int64_t v = **value;
    std::string problem = degreeProblem(m, axis, v);
    if (problem.empty() && W % v)
      problem = formatv("does not divide the world size ({0})", W).str();
    if (!problem.empty())
      return makeError(formatv("--{0} {1}: {2}", axis, v, problem));
  }
  // The attention fold: dp x pp x tp = world.
  std::vector<Given> att;
  for (auto [axis, value] : ArrayRef(axes).take_front(3))
    if (*value)
      att.push_back({axis, **value});
  if (att.size() == 3 && product(att) != W)
    return makeError(
        formatv("{0}: dp x pp x tp = {1} but the world size is {2}", flags(att),
                product(att), W));
  if (att.size() == 2 && W % product(att))
    return makeError(formatv("{0}: {1} = {2} does not divide the world size "
                             "({3})",
                             flags(att), names(att), product(att), W));
  // The expert fold: edp x pp x ep x etp = world.
  std::vector<Given> exp;
  for (auto [axis, value] : axes)
    if (*value && (axis == "pp" || axis == "ep" || axis == "etp"))
      exp.push_back({axis, **value});
  if (exp.size() > 1 && W % product(exp))
    return makeError(formatv("{0}: {1} = {2} does not divide the world size "
                             "({3})",
                             flags(exp), names(exp), product(exp), W));
  // Folding: the experts of a stage use its dp x tp attention ranks.
  std::vector<Given> ept;
  for (auto [axis, value] : ArrayRef(axes).drop_front(3))
    if (*value)
      ept.push_back({axis, **value});
  int64_t stageRanks = 0;
  std::string stageRanksText;
  if (f.dp && f.tp) {
    stageRanks = *f.dp * *f.tp;
    stageRanksText = formatv("dp x tp = {0}", stageRanks);
  } else if (f.pp) {
    stageRanks = W / *f.pp;
    stageRanksText = formatv("dp x tp = {0} (world size {1} / pp {2})",
                             stageRanks, W, *f.pp);
  }
  if (stageRanks && !ept.empty() && stageRanks % product(ept))
    return makeError(formatv("{0}: {1} = {2} does not divide {3} (parallel "
                             "folding: the experts of a stage use its "
                             "attention ranks)",
                             flags(ept), names(ept), product(ept),
                             stageRanksText));
  return Error::success();
}

std::vector<Degrees> moe::sharding::enumerateLayouts(const ModelInfo &m,
                                                     int64_t W,
                                                     const FixedDegrees &f) {
  std::vector<Degrees> out;
  if (W <= 0)
    return out;
  std::vector<int64_t> ds = divisors(W);
  for (int64_t pp : ds) {
    if (!degreeProblem(m, "pp", pp).empty() || (f.pp && *f.pp != pp))
      continue;
    int64_t stage = W / pp;
    for (int64_t tp : divisors(stage)) {
      if ((f.tp && *f.tp != tp) || !degreeProblem(m, "tp", tp).empty())
        continue;
      int64_t dp = stage / tp;
      if (f.dp && *f.dp != dp)
        continue;
      for (int64_t ep : divisors(stage)) {
        if ((f.ep && *f.ep != ep) || !degreeProblem(m, "ep", ep).empty())
          continue;
        for (int64_t etp : divisors(stage / ep)) {
          if ((f.etp && *f.etp != etp) || !degreeProblem(m, "etp", etp).empty())
            continue;
          Degrees d{dp, pp, tp, ep, etp};
          if (agrees(f, d))
            out.push_back(d);
        }
      }
    }
  }
  return out;
}

Expected<PlanResult> moe::sharding::planSharding(const ModelInfo &m,
                                                 const Cluster &cluster,
                                                 const Workload &w,
                                                 const PlanOptions &o,
                                                 const FixedDegrees &fixed) {
  auto start = std::chrono::steady_clock::now();
  if (Error e = validateWorkload(w))
    return std::move(e);
  if (Error e = validateOptions(o))
    return std::move(e);
  const int64_t W = cluster.worldSize;
  if (Error e = validateFixedDegrees(m, W, fixed))
    return std::move(e);
  std::vector<Degrees> layouts = enumerateLayouts(m, W, fixed);
  if (layouts.empty()) {
    std::vector<Given> g;
    for (auto [axis, value] :
         {std::pair<StringRef, std::optional<int64_t>>{"dp", fixed.dp},
          {"pp", fixed.pp},
          {"tp", fixed.tp},
          {"ep", fixed.ep},
          {"etp", fixed.etp}})
      if (value)
        g.push_back({axis, *value});
    return makeError(formatv("{0}: no layout of {1} ranks has these degrees "
                             "together",
                             g.empty() ? std::string("layout") : flags(g), W));
  }
  PlanResult r;
  r.layoutsConsidered = int64_t(layouts.size());
  // fp8GroupCut depends only on (tp, etp): once per pair.
  std::map<std::pair<int64_t, int64_t>, std::optional<std::string>> cuts;
  for (const Degrees &d : layouts) {
    LayoutEstimate e = estimateValidLayout(m, cluster, w, o, d);
    Rejection::Rule rule = Rejection::Rule::None;
    std::string reason;
    if (e.fits && o.etpWithinTp && d.tp % d.etp) {
      rule = Rejection::Rule::EtpAcrossDp;
      reason = formatv("etp={0} does not divide tp={1}: expert tensor parallelism across "
                       "data-parallel replicas is not supported yet",
                       d.etp, d.tp);
    } else if (e.fits && o.wholeFp8Groups) {
      auto [at, added] = cuts.try_emplace({d.tp, d.etp});
      if (added)
        at->second = fp8GroupCut(m, d);
      if (const std::optional<std::string> &cut = at->second) {
        rule = Rejection::Rule::Fp8Group;
        reason = "dynamic FP8 activations: " + *cut;
      }
    }
    if (e.fits && rule == Rejection::Rule::None) {
      r.ranked.push_back(std::move(e));
    } else {
      if (rule == Rejection::Rule::None)
        reason = e.reason;
      r.rejected.push_back({d, std::move(reason), std::move(e), rule});
    }
  }
  std::stable_sort(r.ranked.begin(), r.ranked.end(), better);
  r.searchSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (r.ranked.empty()) {
    // Layouts that fit but break a rule: the fastest of them says which.
    const Rejection *fitting = nullptr;
    for (const Rejection &x : r.rejected)
      if (x.rule != Rejection::Rule::None &&
          (!fitting || better(x.estimate, fitting->estimate)))
        fitting = &x;
    if (fitting && fitting->rule == Rejection::Rule::Fp8Group)
      return makeError(formatv(
          "no layout of {0} x {1} both fits and keeps every FP8 input group whole, as "
          "dynamic FP8 activations (quantization_config.activation_scheme) need: {2}: {3}; "
          "choose other degrees (a smaller --tp or --etp), or compile with "
          "--fp8-activations none",
          W, cluster.name, fitting->degrees.str(), *fp8GroupCut(m, fitting->degrees)));
    if (fitting)
      return makeError(formatv("no layout of {0} x {1} both fits and can be partitioned: "
                               "{2}: {3}; choose an --etp that divides --tp",
                               W, cluster.name, fitting->degrees.str(), fitting->reason));
    const Rejection *closest = &r.rejected.front();
    for (const Rejection &x : r.rejected)
      if (x.estimate.memory.peak < closest->estimate.memory.peak)
        closest = &x;
    return makeError(formatv(
        "no layout of {0} x {1} fits: the smallest need is {2} per rank ({3}) "
        "> {4} usable ({5}% of {6}); add ranks or use a device with more "
        "memory",
        W, cluster.name, gib(closest->estimate.memory.peak),
        closest->degrees.str(), gib(closest->estimate.memoryBudget),
        int(std::lround(o.memoryUtilization * 100)), gib(cluster.memoryBytes)));
  }
  return r;
}

//===----------------------------------------------------------------------===//
// Explanations
//===----------------------------------------------------------------------===//

namespace {

std::string memoryLine(const MemoryEstimate &m) {
  return formatv("weights {0}, KV cache {1}, activations {2}, workspace {3}; "
                 "peak {4}",
                 gib(m.weights), gib(m.kvCache), gib(m.activations),
                 gib(m.workspace), gib(m.peak));
}

std::string timeLine(const TimeEstimate &t) {
  return formatv("gemm {0}, attention {1}, memory-bound {2}, all-to-all {3}, "
                 "all-reduce {4}, p2p {5}, bubble {6}; total {7}",
                 seconds(t.gemm), seconds(t.attention), seconds(t.memoryBound),
                 seconds(t.allToAll), seconds(t.allReduce), seconds(t.p2p),
                 seconds(t.bubble), seconds(t.total));
}

/// 989.4e12 -> "989.4 T".
std::string si(double v) {
  const char *prefixes[] = {"", " k", " M", " G", " T", " P", " E"};
  int i = 0;
  while (v >= 1000 && i < 6) {
    v /= 1000;
    ++i;
  }
  return formatv("{0}{1}",
                 formatv(v < 10    ? "{0:F2}"
                         : v < 100 ? "{0:F1}"
                                   : "{0:F0}",
                         v)
                     .str(),
                 prefixes[i])
      .str();
}

std::string degreesLine(const Degrees &d) {
  return formatv("{0} (edp={1})", d.str(), d.edp());
}

} // namespace

std::string moe::sharding::explainPlan(const ModelInfo &m,
                                       const Cluster &cluster,
                                       const Workload &w, const PlanResult &r,
                                       size_t alternatives) {
  std::string out;
  raw_string_ostream os(out);
  os << formatv("machine: {0} x {1} ({2} node(s) of {3}): {4} per device, "
                "{5}FLOP/s {6}, {7}B/s memory, {8}B/s intra-node, {9}B/s "
                "inter-node per device\n",
                cluster.worldSize, cluster.name, cluster.nodes,
                cluster.devicesPerNode, gib(cluster.memoryBytes),
                si(cluster.peakFlops(m.weightDtype)), dtypeName(m.weightDtype),
                si(cluster.memoryBandwidth), si(cluster.intraNode.bandwidth),
                si(cluster.interNode.bandwidth));
  os << formatv("workload: prefill of {0} tokens per DP rank at context {1}, "
                "KV cache for {2} sequences per DP rank; weights {3}{4}\n",
                w.maxBatchTokens, w.maxSeqLen, w.maxSequences,
                dtypeName(m.weightDtype),
                m.fp8Blocks ? " (FP8 blocks where the checkpoint stores them)" : "");
  os << formatv("search: {0} layouts, {1} fit, {2} rejected, {3}\n",
                r.layoutsConsidered, r.ranked.size(), r.rejected.size(),
                seconds(r.searchSeconds));
  if (r.ranked.empty())
    return out;
  const LayoutEstimate &c = r.chosen();
  const Degrees &d = c.layout.degrees;
  os << formatv("chosen: {0}: {1:F0} tokens/s, step {2}\n", degreesLine(d),
                c.tokensPerSecond, seconds(c.time.total));
  os << "  memory per rank (largest): " << memoryLine(c.memory) << " of "
     << gib(c.memoryBudget) << " usable\n";
  os << "  step time: " << timeLine(c.time) << "\n";
  os << formatv("  vocabulary: {0} padded to {1} ({2} rows per TP rank)\n",
                m.config.vocabSize, c.layout.paddedVocab,
                c.layout.vocabRowsPerRank());
  auto where = [](bool spans) { return spans ? "spans nodes" : "intra-node"; };
  os << formatv("  groups: tp {0}, ep {1} ({2:F0}% of peers off-node), etp "
                "{3}, pp {4}; {5} microbatch(es) of {6} tokens\n",
                where(c.tpSpansNodes), where(c.epSpansNodes),
                c.epOffNodeFraction * 100, where(c.etpSpansNodes),
                where(c.ppSpansNodes), c.microbatches, c.microbatchTokens);
  for (size_t s = 0; s < c.stages.size(); ++s) {
    const StageEstimate &st = c.stages[s];
    os << formatv("  stage {0}: layers {1}-{2} ({3} dense, {4} MoE){5}{6}: "
                  "{7} per microbatch, peak {8}\n",
                  s, st.firstLayer, st.firstLayer + st.numLayers - 1,
                  st.denseLayers, st.moeLayers,
                  st.embedding ? " + embedding" : "",
                  st.head ? " + final norm, LM head" : "",
                  seconds(st.microbatch.total), gib(st.memory.peak));
  }
  if (r.ranked.size() > 1) {
    os << "alternatives:\n";
    for (size_t i = 1; i < r.ranked.size() && i <= alternatives; ++i) {
      const LayoutEstimate &a = r.ranked[i];
      double pct = (a.tokensPerSecond / c.tokensPerSecond - 1) * 100;
      os << formatv("  {0}. {1}: {2:F0} tokens/s ({3}{4:F1}%), step {5}, "
                    "peak {6}\n",
                    i + 1, degreesLine(a.layout.degrees), a.tokensPerSecond,
                    pct >= 0 ? "+" : "", pct, seconds(a.time.total),
                    gib(a.memory.peak));
    }
    if (r.ranked.size() > alternatives + 1)
      os << formatv("  ... and {0} more\n", r.ranked.size() - alternatives - 1);
  }
  if (!r.rejected.empty()) {
    os << formatv("rejected ({0}):\n", r.rejected.size());
    for (size_t i = 0; i < r.rejected.size() && i < alternatives; ++i)
      os << "  " << degreesLine(r.rejected[i].degrees) << ": "
         << r.rejected[i].reason << "\n";
    if (r.rejected.size() > alternatives)
      os << formatv("  ... and {0} more\n", r.rejected.size() - alternatives);
  }
  return out;
}

json::Value moe::sharding::toJSON(const PlanResult &r, size_t alternatives) {
  json::Array alts, rejected;
  for (size_t i = 1; i < r.ranked.size() && i <= alternatives; ++i)
    alts.push_back(toJSON(r.ranked[i]));
  for (const Rejection &x : r.rejected)
    rejected.push_back(
        json::Object{{"degrees", toJSON(x.degrees)}, {"reason", x.reason}});
  json::Object o{{"layouts_considered", r.layoutsConsidered},
                 {"fitting", int64_t(r.ranked.size())},
                 {"search_seconds", r.searchSeconds},
                 {"alternatives", std::move(alts)},
                 {"rejected", std::move(rejected)}};
  if (!r.ranked.empty())
    o["chosen"] = toJSON(r.chosen());
  return o;
}
