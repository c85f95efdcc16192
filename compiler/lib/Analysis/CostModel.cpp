//===- CostModel.cpp - per-rank memory and step time ------------*- C++ -*-===//
//
// See CostModel.h for the model; every figure here is per rank. Costs are
// computed once per layer kind (dense, MoE) and layout, so a layout costs
// O(layers + world size) whatever the number of tensors or ranks.
//
//===----------------------------------------------------------------------===//
#include "moe/Analysis/CostModel.h"
#include "moe/Analysis/Planner.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cmath>
#include <limits>

using namespace llvm;
using namespace moe::sharding;
namespace hf = moe::hf;

//===----------------------------------------------------------------------===//
// The cost model
//===----------------------------------------------------------------------===//

namespace {

/// Seconds by category, additive.
struct Cost {
  double gemm = 0, attention = 0, memoryBound = 0, allToAll = 0, allReduce = 0;
  double total() const {
    return gemm + attention + memoryBound + allToAll + allReduce;
  }
  Cost &operator+=(const Cost &o) {
    gemm += o.gemm;
    attention += o.attention;
    memoryBound += o.memoryBound;
    allToAll += o.allToAll;
    allReduce += o.allReduce;
    return *this;
  }
  Cost scaled(double f) const {
    Cost c = *this;
    c.gemm *= f;
    c.attention *= f;
    c.memoryBound *= f;
    c.allToAll *= f;
    c.allReduce *= f;
    return c;
  }
};

/// How the groups of one mesh axis sit on the nodes.
struct GroupLink {
  bool spans = false; ///< some group has ranks on two nodes
  double offNode = 0; ///< largest fraction of a member's peers off-node
  Link link;          ///< the link that bounds the group's collectives
};

/// The groups of `size` ranks `stride` apart: rank = outer * size * stride +
/// j * stride + inner. O(world).
GroupLink groupLink(const Cluster &c, int64_t world, int64_t size,
                    int64_t stride) {
  GroupLink g;
  g.link = c.intraNode;
  if (size <= 1)
    return g;
  int64_t outers = world / (size * stride);
  int64_t minRun = size;
  for (int64_t outer = 0; outer < outers; ++outer)
    for (int64_t inner = 0; inner < stride; ++inner) {
      int64_t base = outer * size * stride + inner;
      int64_t run = 0, node = c.nodeOf(base);
      for (int64_t j = 0; j < size; ++j) {
        int64_t n = c.nodeOf(base + j * stride);
        if (n != node) {
          minRun = std::min(minRun, run);
          run = 0;
          node = n;
          g.spans = true;
        }
        ++run;
      }
      minRun = std::min(minRun, run);
    }
  if (g.spans) {
    g.link = c.interNode;
    g.offNode = double(size - minRun) / double(size - 1);
  }
  return g;
}

struct Env {
  const ModelInfo &m;
  const hf::ModelConfig &c;
  const Cluster &cl;
  const Workload &w;
  const PlanOptions &o;
  Degrees d;
  int64_t world, wb, ab, paddedVocab, microbatches, tokens;
  double peak, bw;
  GroupLink tpG, epG, etpG, ppG;

  Env(const ModelInfo &m, const Cluster &cl, const Workload &w,
      const PlanOptions &o, const Degrees &d)
      : m(m), c(m.config), cl(cl), w(w), o(o), d(d) {
    world = d.world();
    wb = dtypeBytes(m.weightDtype);
    ab = dtypeBytes(m.activationDtype);
    peak = cl.peakFlops(m.weightDtype);
    bw = cl.memoryBandwidth;
    paddedVocab = paddedVocabSize(c.vocabSize, d.tp, o.vocabPadTo);
    microbatches = d.pp == 1 ? 1 : (o.microbatches > 0 ? o.microbatches : d.pp);
    microbatches = std::min(microbatches, w.maxBatchTokens);
    tokens = (w.maxBatchTokens + microbatches - 1) / microbatches;
    tpG = groupLink(cl, world, d.tp, 1);
    etpG = groupLink(cl, world, d.etp, 1);
    epG = groupLink(cl, world, d.ep, d.etp);
    ppG = groupLink(cl, world, d.pp, world / d.pp);
  }

  // Primitive costs.
  double gemm(double rows, double in, double out) const {
    double flops = 2 * rows * in * out;
    double bytes = in * out * wb + rows * (in + out) * ab;
    return std::max(flops / peak, bytes / bw);
  }
  double mem(double bytes) const { return bytes / bw; }
  static double allReduce(double bytes, int64_t n, const GroupLink &g) {
    if (n <= 1)
      return 0;
    return 2.0 * double(n - 1) / double(n) * bytes / g.link.bandwidth +
           g.link.latency;
  }
  /// All-gather (or reduce-scatter) of `bytes` in all.
  static double allGather(double bytes, int64_t n, const GroupLink &g) {
    if (n <= 1)
      return 0;
    return double(n - 1) / double(n) * bytes / g.link.bandwidth +
           g.link.latency;
  }
  double allToAll(double bytesOut) const {
    if (d.ep <= 1)
      return 0;
    double intra = bytesOut * (1 - epG.offNode) / cl.intraNode.bandwidth;
    double inter = bytesOut * epG.offNode / cl.interNode.bandwidth;
    return std::max(intra, inter) +
           (epG.offNode > 0 ? cl.interNode.latency : cl.intraNode.latency);
  }

  // Workload shape.
  /// Mean context a token attends to, and KV rows read, in the modelled
  /// prefill step (see CostModel.h).
  void context(double &avgContext, double &kvRows) const {
    double T = double(tokens), L = double(w.maxSeqLen);
    if (T >= L) {
      avgContext = (L + 1) / 2;
      kvRows = T;
    } else {
      avgContext = L - T / 2;
      kvRows = L;
    }
    if (c.slidingWindow) {
      double win = double(*c.slidingWindow);
      avgContext = std::min(avgContext, win);
      kvRows = std::min(kvRows, T + win);
    }
  }
  int64_t dispatchedTokens() const { return (tokens + d.tp - 1) / d.tp; }
  int64_t localExperts() const { return c.numExperts / d.ep; }
  /// Expected routed rows an expert-fold rank computes per microbatch.
  double expertRows() const {
    return double(dispatchedTokens()) * c.expertsPerToken * d.etp;
  }

  Cost attention() const {
    Cost k;
    double T = double(tokens), h = double(c.hiddenSize), t = double(d.tp);
    double H = double(c.numHeads);
    double ctx, kvRows;
    context(ctx, kvRows);
    k.memoryBound += mem(2 * T * h * ab + h * wb); // input norm
    if (!c.isMLA()) {
      double KV = double(c.numKVHeads), hd = double(c.headDim);
      k.gemm += gemm(T, h, (H + 2 * KV) * hd / t);
      double qk = T * (H + KV) * hd / t;
      k.memoryBound +=
          mem(2 * qk * ab * (c.qkNorm != hf::QKNorm::None ? 2 : 1));
      double flops = 4 * T * ctx * hd * H / t;
      double bytes = (kvRows * 2 * KV * hd / t + T * 2 * KV * hd / t +
                      2 * T * H * hd / t) *
                     ab;
      k.attention += std::max(flops / peak, bytes / bw);
      k.gemm += gemm(T, H * hd / t, h);
    } else {
      double qh = double(c.qkNopeHeadDim + c.qkRopeHeadDim);
      double vh = double(c.vHeadDim), nope = double(c.qkNopeHeadDim);
      double rope = double(c.qkRopeHeadDim), kr = double(c.kvLoraRank);
      if (c.qLoraRank > 0) {
        double qr = double(c.qLoraRank);
        k.gemm += gemm(T, h, qr); // replicated in the TP group
        k.memoryBound += mem(2 * T * qr * ab);
        k.gemm += gemm(T, qr, H * qh / t);
      } else {
        k.gemm += gemm(T, h, H * qh / t);
      }
      k.gemm += gemm(T, h, kr + rope); // replicated
      k.memoryBound += mem(2 * T * kr * ab + 2 * T * (H / t + 1) * rope * ab);
      double flops = 2 * T * ctx * (H / t) * (qh + vh);
      double bytes;
      if (o.mlaLatentCache) {
        // Prefill decompresses the context's latents (kv_b_proj) and runs
        // ordinary attention over them.
        k.gemm += gemm(kvRows, kr, H * (nope + vh) / t);
        bytes = (kvRows * (kr + rope) + kvRows * (H / t) * (nope + vh) +
                 kvRows * rope + 2 * T * H * qh / t) *
                ab;
      } else {
        k.gemm += gemm(T, kr, H * (nope + vh) / t);
        bytes = (kvRows * (H / t) * (qh + vh) + 2 * T * H * qh / t) * ab;
      }
      k.attention += std::max(flops / peak, bytes / bw);
      k.gemm += gemm(T, H * vh / t, h);
    }
    k.allReduce += allReduce(T * h * ab, d.tp, tpG);
    k.memoryBound += mem(3 * T * h * ab); // residual
    return k;
  }

  /// A TP-split gated MLP of width `inter` on `T` rows (no collective).
  Cost mlp(double T, double inter) const {
    Cost k;
    double h = double(c.hiddenSize), t = double(d.tp);
    k.gemm += gemm(T, h, 2 * inter / t);
    k.memoryBound += mem(3 * T * inter / t * ab);
    k.gemm += gemm(T, inter / t, h);
    return k;
  }

  Cost denseLayer() const {
    Cost k = attention();
    double T = double(tokens), h = double(c.hiddenSize);
    k.memoryBound += mem(2 * T * h * ab + h * wb); // post-attention norm
    k += mlp(T, double(c.intermediateSize));
    k.allReduce += allReduce(T * h * ab, d.tp, tpG);
    k.memoryBound += mem(3 * T * h * ab);
    return k;
  }

  Cost moeLayer() const {
    Cost k = attention();
    double T = double(tokens), h = double(c.hiddenSize);
    double E = double(c.numExperts), topk = double(c.expertsPerToken);
    k.memoryBound += mem(2 * T * h * ab + h * wb);
    // Each TP rank routes and dispatches its 1/tp of the tokens.
    double td = double(dispatchedTokens());
    k.gemm += gemm(td, h, E);
    k.memoryBound += mem(2 * td * E * 4);
    double out = td * topk * h * ab * double(d.ep - 1) / double(d.ep);
    k.allToAll += 2 * allToAll(out); // dispatch + combine
    double R = expertRows();
    k.allReduce += 2 * allGather(R * h * ab, d.etp, etpG); // AG + RS in ETP
    k.memoryBound += mem(4 * R * h * ab); // permute / unpermute
    double local = double(localExperts());
    double active = local <= 1 ? (R > 0 ? 1.0 : 0.0)
                               : local * (1 - std::pow(1 - 1 / local, R));
    double I = double(c.moeIntermediateSize) / double(d.etp);
    k.gemm += std::max(2 * R * h * 2 * I / peak,
                       (active * h * 2 * I * wb + R * (h + 2 * I) * ab) / bw);
    k.memoryBound += mem(3 * R * I * ab);
    k.gemm += std::max(2 * R * I * h / peak,
                       (active * I * h * wb + R * (I + h) * ab) / bw);
    bool shared = c.sharedExpertIntermediateSize > 0;
    if (shared) {
      k += mlp(T, double(c.sharedExpertIntermediateSize));
      if (c.sharedExpertGate)
        k.gemm += gemm(T, h, 1);
    }
    // Back to every TP rank's full rows: all-gather of the routed part, an
    // all-reduce when a TP-split shared expert adds its partial sums.
    k.allReduce += shared ? allReduce(T * h * ab, d.tp, tpG)
                          : allGather(T * h * ab, d.tp, tpG);
    k.memoryBound += mem(3 * T * h * ab);
    return k;
  }

  Cost embedding() const {
    Cost k;
    double T = double(tokens), h = double(c.hiddenSize);
    k.memoryBound += mem(2 * T * h * ab);
    k.allReduce += allReduce(T * h * ab, d.tp, tpG); // vocab-parallel lookup
    return k;
  }

  Cost head() const {
    Cost k;
    double T = double(tokens), h = double(c.hiddenSize);
    k.memoryBound += mem(2 * T * h * ab + h * wb); // final norm
    k.gemm += gemm(T, h, double(paddedVocab / d.tp));
    k.allReduce += allGather(T * double(paddedVocab) * 4, d.tp, tpG); // logits
    return k;
  }

  // Memory.
  int64_t vocabRows0() const {
    return std::min(paddedVocab / d.tp, c.vocabSize);
  }
  int64_t layerWeights(int64_t l) const {
    const ModelInfo::LayerBytes &b = m.layerBytes[l];
    return b.replicated + b.tpSplit / d.tp + b.experts / (d.ep * d.etp);
  }
  int64_t kvRowsCached() const {
    int64_t rows = w.maxSeqLen;
    if (c.slidingWindow)
      rows = std::min(rows, *c.slidingWindow);
    return rows;
  }
  int64_t layerKV() const {
    int64_t perToken;
    if (!c.isMLA())
      perToken = 2 * c.numKVHeads * c.headDim / d.tp;
    else if (o.mlaLatentCache)
      perToken = c.kvLoraRank + c.qkRopeHeadDim;
    else
      perToken =
          c.numHeads / d.tp * (c.qkNopeHeadDim + c.qkRopeHeadDim + c.vHeadDim);
    return w.maxSequences * kvRowsCached() * perToken * ab;
  }
  int64_t firstExtraWeights() const {
    return vocabRows0() * m.embeddingBytesPerRow;
  }
  int64_t lastExtraWeights() const {
    int64_t b = m.finalNormBytes + vocabRows0() * m.headBytesPerRow;
    if (c.tieWordEmbeddings && d.pp > 1)
      b += vocabRows0() * m.embeddingBytesPerRow;
    return b;
  }
  /// Live activations of one microbatch in the widest layer of the kinds
  /// present (flash attention: no T x context scores).
  int64_t activations(bool dense, bool moe, bool last) const {
    int64_t T = tokens, h = c.hiddenSize, t = d.tp;
    double ctx, kvRows;
    context(ctx, kvRows);
    int64_t attn;
    if (!c.isMLA()) {
      attn = T * ((c.numHeads + 2 * c.numKVHeads) * c.headDim / t +
                  c.numHeads * c.headDim / t);
    } else {
      int64_t qh = c.qkNopeHeadDim + c.qkRopeHeadDim;
      attn = T * (c.qLoraRank + c.numHeads / t * qh + c.kvLoraRank +
                  c.qkRopeHeadDim + c.numHeads / t * c.vHeadDim);
      if (o.mlaLatentCache)
        attn += int64_t(kvRows) * c.numHeads / t *
                (c.qkNopeHeadDim + c.vHeadDim + c.qkRopeHeadDim);
    }
    int64_t ffn = 0;
    if (dense)
      ffn = std::max(ffn, T * 3 * c.intermediateSize / t);
    if (moe) {
      int64_t shared = T * 3 * c.sharedExpertIntermediateSize / t;
      int64_t router = dispatchedTokens() * c.numExperts * 4 / ab;
      ffn = std::max(ffn, shared + router);
    }
    int64_t bytes = (2 * T * h + std::max(attn, ffn)) * ab;
    if (last) {
      bytes += T * (paddedVocab / t) * 4; // f32 logits
      if (t > 1)
        bytes += T * paddedVocab * 4; // gathered
    }
    if (d.pp > 1)
      bytes += T * h * ab; // the next microbatch's activations arriving
    return bytes;
  }
  int64_t workspace(bool moe) const {
    int64_t peers = (d.tp - 1) + (d.pp > 1 ? 2 : 0);
    int64_t bytes = o.gemmWorkspaceBytes;
    if (moe) {
      peers += (d.ep - 1) + (d.etp - 1);
      int64_t td = dispatchedTokens(), k = c.expertsPerToken, h = c.hiddenSize;
      int64_t I = c.moeIntermediateSize / d.etp;
      int64_t rows = o.capacityFactor > 0
                         ? int64_t(std::ceil(o.capacityFactor * expertRows()))
                         : std::min(localExperts(), k) * td * d.ep * d.etp;
      bytes += 2 * td * k * h * ab;             // dispatch / combine sends
      bytes += rows * (h + 2 * I + I + h) * ab; // received, gate/up, act, out
    }
    return bytes + peers * o.commBytesPerPeer + fp8Dequantised();
  }
  /// A GPU rank's FP8 weights are dequantised for each GEMM into one
  /// scratch (runtime/src/cuda: the largest weight, or as many of a stack's
  /// experts as 256 MiB of f32 holds, at least one), in the GEMM's dtype.
  /// The CPU dequantises a few rows a thread at a time: nothing to count.
  int64_t fp8Dequantised() const {
    if (!m.fp8Blocks || cl.name == "cpu")
      return 0;
    const int64_t dense = std::max(m.fp8Replicated, m.fp8TpSplit / d.tp);
    const int64_t expert = m.fp8Expert / d.etp;
    const int64_t chunk =
        expert ? std::clamp<int64_t>((int64_t(256) << 20) / (4 * expert), 1, localExperts()) : 0;
    return std::max(dense, chunk * expert) * ab;
  }
};

std::string gib(int64_t bytes) {
  return formatv("{0:F1} GiB", double(bytes) / double(int64_t(1) << 30)).str();
}

/// Contiguous pipeline stages over per-layer costs (the embedding folded
/// into layer 0, the final norm and LM head into the last layer), each stage
/// also paying `fixedMem`.
class StagePlacer {
public:
  StagePlacer(int64_t pp, std::vector<double> time, std::vector<int64_t> mem,
              int64_t fixedMem)
      : pp(pp), L(int64_t(time.size())), time(std::move(time)),
        mem(std::move(mem)), fixedMem(fixedMem) {
    prefix.assign(L + 1, 0);
    for (int64_t l = 0; l < L; ++l)
      prefix[l + 1] = prefix[l] + this->time[l];
  }

  /// Stage boundaries (pp + 1 of them) whose slowest stage is as fast as
  /// possible under the memory bound, levelled so that every stage ends
  /// near its share of the total; nullopt when the memory bound cannot be
  /// met.
  std::optional<std::vector<int64_t>> place(int64_t boundM) const {
    const double inf = std::numeric_limits<double>::infinity();
    if (stagesNeeded(0, inf, boundM) > pp)
      return std::nullopt;
    double lo = 0, hi = prefix[L];
    for (double t : time)
      lo = std::max(lo, t);
    if (pp == 1)
      return std::vector<int64_t>{0, L};
    // Bisection on the slowest stage's time (greedy packing is optimal for
    // "fewest stages under a bound").
    if (stagesNeeded(0, lo, boundM) > pp)
      for (int iter = 0; iter < 64 && hi - lo > 1e-12 * hi; ++iter) {
        double mid = (lo + hi) / 2;
        (stagesNeeded(0, mid, boundM) <= pp ? hi : lo) = mid;
      }
    else
      hi = lo;
    return level(hi, boundM);
  }

private:
  /// Fewest stages greedy packing needs for layers [from, L).
  int64_t stagesNeeded(int64_t from, double boundT, int64_t boundM) const {
    int64_t stages = 0;
    for (int64_t i = from; i < L;) {
      double t = 0;
      int64_t m = fixedMem;
      int64_t j = i;
      while (j < L && t + time[j] <= boundT && m + mem[j] <= boundM) {
        t += time[j];
        m += mem[j];
        ++j;
      }
      if (j == i)
        return std::numeric_limits<int64_t>::max() / 2;
      ++stages;
      i = j;
    }
    return stages;
  }

  /// Exactly pp non-empty stages under the bounds, each ending as close as
  /// possible to its share s/pp of the total time.
  std::vector<int64_t> level(double boundT, int64_t boundM) const {
    std::vector<int64_t> need(L + 1, 0);
    for (int64_t j = 0; j < L; ++j)
      need[j] = stagesNeeded(j, boundT, boundM);
    std::vector<int64_t> begin{0};
    int64_t i = 0;
    for (int64_t s = 0; s + 1 < pp; ++s) {
      int64_t left = pp - 1 - s; // stages after this one
      double target = prefix[L] * double(s + 1) / double(pp);
      int64_t best = -1;
      double t = 0;
      int64_t m = fixedMem;
      for (int64_t j = i + 1; j <= L - left; ++j) {
        t += time[j - 1];
        m += mem[j - 1];
        if (t > boundT || m > boundM)
          break;
        if (need[j] > left)
          continue;
        if (best < 0 ||
            std::abs(prefix[j] - target) < std::abs(prefix[best] - target))
          best = j;
      }
      if (best < 0) // cannot happen after place()'s check; stay valid
        best = i + 1;
      begin.push_back(best);
      i = best;
    }
    begin.push_back(L);
    return begin;
  }

  int64_t pp, L;
  std::vector<double> time;
  std::vector<int64_t> mem;
  int64_t fixedMem;
  std::vector<double> prefix;
};

} // namespace

namespace moe::sharding {

/// estimateLayout without validation (the search enumerates valid layouts).
LayoutEstimate estimateValidLayout(const ModelInfo &m, const Cluster &cluster,
                                   const Workload &w, const PlanOptions &o,
                                   const Degrees &d) {
  Env env(m, cluster, w, o, d);
  const hf::ModelConfig &c = m.config;
  LayoutEstimate e;
  e.layout.degrees = d;
  e.layout.vocabPadTo = o.vocabPadTo;
  e.layout.paddedVocab = env.paddedVocab;
  e.microbatches = env.microbatches;
  e.microbatchTokens = env.tokens;
  e.memoryBudget = int64_t(o.memoryUtilization * double(cluster.memoryBytes));
  e.tpSpansNodes = env.tpG.spans;
  e.epSpansNodes = env.epG.spans;
  e.etpSpansNodes = env.etpG.spans;
  e.ppSpansNodes = env.ppG.spans;
  e.epOffNodeFraction = env.epG.offNode;

  const int64_t L = c.numLayers;
  bool anyDense = c.numMoELayers()<L, anyMoE = c.numMoELayers()> 0;
  Cost dense = anyDense ? env.denseLayer() : Cost();
  Cost moe = anyMoE ? env.moeLayer() : Cost();
  Cost embed = env.embedding(), head = env.head();
  int64_t kv = env.layerKV();

  std::vector<double> time(L);
  std::vector<int64_t> mem(L);
  for (int64_t l = 0; l < L; ++l) {
    time[l] = c.moeLayers[l] ? moe.total() : dense.total();
    mem[l] = env.layerWeights(l) + kv;
  }
  time.front() += embed.total();
  mem.front() += env.firstExtraWeights();
  time.back() += head.total();
  mem.back() += env.lastExtraWeights() + env.activations(false, false, true) -
                env.activations(false, false, false);
  // A conservative per-stage bound: the widest layer's activations and the
  // MoE workspace, wherever the stage is.
  StagePlacer placer(d.pp, time, mem,
                     env.activations(anyDense, anyMoE, false) +
                         env.workspace(anyMoE));

  auto estimateStages = [&](const std::vector<int64_t> &begin) {
    e.layout.stageBegin = begin;
    e.stages.assign(d.pp, {});
    for (int64_t s = 0; s < d.pp; ++s) {
      StageEstimate &st = e.stages[s];
      st.firstLayer = begin[s];
      st.numLayers = begin[s + 1] - begin[s];
      st.embedding = s == 0;
      st.head = s == d.pp - 1;
      Cost k;
      MemoryEstimate &mm = st.memory;
      for (int64_t l = begin[s]; l < begin[s + 1]; ++l) {
        bool isMoE = c.moeLayers[l];
        (isMoE ? st.moeLayers : st.denseLayers) += 1;
        k += isMoE ? moe : dense;
        mm.weights += env.layerWeights(l);
        mm.kvCache += kv;
      }
      if (st.embedding) {
        k += embed;
        mm.weights += env.firstExtraWeights();
      }
      if (st.head) {
        k += head;
        mm.weights += env.lastExtraWeights();
      }
      mm.activations =
          env.activations(st.denseLayers > 0, st.moeLayers > 0, st.head);
      mm.workspace = env.workspace(st.moeLayers > 0);
      mm.peak = mm.weights + mm.kvCache + mm.activations + mm.workspace;
      st.microbatch.gemm = k.gemm;
      st.microbatch.attention = k.attention;
      st.microbatch.memoryBound = k.memoryBound;
      st.microbatch.allToAll = k.allToAll;
      st.microbatch.allReduce = k.allReduce;
      st.microbatch.total = k.total();
    }
    e.memory = {};
    for (const StageEstimate &st : e.stages)
      if (st.memory.peak > e.memory.peak)
        e.memory = st.memory;
  };

  // Balance time alone; if the result does not fit, balance time under the
  // memory budget.
  estimateStages(*placer.place(std::numeric_limits<int64_t>::max() / 4));
  if (e.memory.peak > e.memoryBudget && d.pp > 1)
    if (std::optional<std::vector<int64_t>> p = placer.place(e.memoryBudget)) {
      LayoutEstimate saved = e;
      estimateStages(*p);
      if (e.memory.peak > e.memoryBudget)
        e = std::move(saved);
    }

  // The step: the slowest stage, pipelined.
  const StageEstimate *slow = &e.stages.front();
  for (const StageEstimate &st : e.stages)
    if (st.microbatch.total > slow->microbatch.total)
      slow = &st;
  double mb = double(e.microbatches);
  e.time.gemm = mb * slow->microbatch.gemm;
  e.time.attention = mb * slow->microbatch.attention;
  e.time.memoryBound = mb * slow->microbatch.memoryBound;
  e.time.allToAll = mb * slow->microbatch.allToAll;
  e.time.allReduce = mb * slow->microbatch.allReduce;
  if (d.pp > 1) {
    double send = double(env.tokens) * double(c.hiddenSize) * double(env.ab) /
                      env.ppG.link.bandwidth +
                  env.ppG.link.latency;
    e.time.p2p = double(e.microbatches + d.pp - 2) * send;
    e.time.bubble = double(d.pp - 1) * slow->microbatch.total;
  }
  e.time.total = e.time.gemm + e.time.attention + e.time.memoryBound +
                 e.time.allToAll + e.time.allReduce + e.time.p2p +
                 e.time.bubble;
  e.tokensPerSecond = double(d.dp * w.maxBatchTokens) / e.time.total;

  e.fits = e.memory.peak <= e.memoryBudget;
  if (!e.fits) {
    int64_t s = 0;
    for (int64_t i = 0; i < d.pp; ++i)
      if (e.stages[i].memory.peak == e.memory.peak) {
        s = i;
        break;
      }
    e.reason =
        formatv(
            "needs {0} per rank (weights {1}, KV cache {2}, activations "
            "{3}, workspace {4}{5}) > {6} usable ({7}% of {8})",
            gib(e.memory.peak), gib(e.memory.weights), gib(e.memory.kvCache),
            gib(e.memory.activations), gib(e.memory.workspace),
            d.pp > 1 ? formatv("; stage {0}", s).str() : std::string(),
            gib(e.memoryBudget), int(std::lround(o.memoryUtilization * 100)),
            gib(cluster.memoryBytes))
            .str();
  }
  return e;
}

} // namespace moe::sharding

Expected<LayoutEstimate> moe::sharding::estimateLayout(const ModelInfo &m,
                                                       const Cluster &cluster,
                                                       const Workload &w,
                                                       const PlanOptions &o,
                                                       const Degrees &d) {
  if (Error e = validateWorkload(w))
    return std::move(e);
  if (Error e = validateOptions(o))
    return std::move(e);
  if (Error e = validateDegrees(m, cluster.worldSize, d))
    return std::move(e);
  return estimateValidLayout(m, cluster, w, o, d);
}

MemoryEstimate moe::sharding::rankMemory(const ModelInfo &m,
                                         const LayoutEstimate &e,
                                         int64_t rank) {
  RankCoords rc = rankCoords(e.layout.degrees, rank);
  MemoryEstimate r = e.stages[rc.pp].memory;
  r.weights = rankWeightBytes(m, e.layout, rank);
  r.peak = r.weights + r.kvCache + r.activations + r.workspace;
  return r;
}
