//===- CudaMoEGradKernels.cpp - the MoE layer's training kernels -*- C++ -*-===//
//
// Step lowerings and kernel builders of the CUDA emitter (Emitter.h) for the
// MoE layer of a training program (docs/training.md): router_stats (the
// balancing and z-losses' statistics), route_grad, router_stats_grad and the
// routed experts' backward, experts_grad (experts_saved, the forward that
// keeps its intermediates, is lowerExperts'). They compute as the CPU
// kernels (runtime/src/cpu/Loss.cpp, Gradients.cpp) do: per token in f64,
// sums over tokens in token order by one thread per expert or column, the
// experts' products as GEMMs over [E, C, .] blocks (C = max_batch_tokens)
// bounded by each expert's count, so an expert that no token reached gets
// exactly 0.
//
//===----------------------------------------------------------------------===//
#include "Emitter.h"

namespace moe::cuda::detail {

namespace {

/// Thread 0's top-k of v[0..E) (larger first, ties to the lower index) into
/// `chosen` (k ints), `taken` E flags (shared arrays).
const char *kSerialTopK = R"(    for (int e = 0; e < @E@; ++e) taken[e] = 0;
    for (int j = 0; j < @K@; ++j) {
      int best = -1;
      for (int e = 0; e < @E@; ++e)
        if (!taken[e] && (best < 0 || v[e] > v[best])) best = e;
      taken[best] = 1;
      chosen[j] = best;
    }
)";

} // namespace

/// router_stats: per token (one block, thread 0) the softmax of the router
/// logits, its top-k and logsumexp^2 (and with `sequences`, the sigmoid
/// scores' share s / sum(s) and their top-k) into scratch; then one thread
/// per expert adds them in token order, as cpu::routerStats.
llvm::Error Emitter::lowerRouterStats(const Step &s, Array &launches, std::string &) {
  const int64_t E = width(s.in[0]), k = s.constants.integer("top_k");
  const int64_t sequences = s.constants.integerOr("sequences", 0);
  if (llvm::Error e = constantsRead(s))
    return e;
  if (k < 1 || k > E || rows(s.out[0]) != 3 + 2 * sequences || width(s.out[0]) != E)
    return stepError(s, llvm::formatv("expected top_k in [1, {0}] and an output of {1} rows of "
                                      "{0}",
                                      E, 3 + 2 * sequences));
  // Per token: p [E] and s' [E] (f64), the two top-k's membership [E] (i32),
  // lse^2.
  const std::string probs = addScratch(maxTokens, 2 * E), shares = addScratch(maxTokens, 2 * E),
                    picked = addScratch(maxTokens, E, "I32"),
                    seqPicked = addScratch(maxTokens, E, "I32"), z = addScratch(maxTokens, 2);
  // The top-k text first: it uses @E@ and @K@ itself.
  std::string perToken = subst(subst(R"(  __shared__ double v[@E@];
  __shared__ unsigned char taken[@E@];
  __shared__ int chosen[@K@];
  const long long t = blockIdx.x;
  if (t >= T || threadIdx.x != 0) return;
  const float *row = logits + t * @E@;
  {
    float peak = -INFINITY;
    for (int e = 0; e < @E@; ++e) peak = fmaxf(peak, row[e]);
    double sum = 0.0;
    for (int e = 0; e < @E@; ++e) sum += exp(static_cast<double>(row[e]) - peak);
    const double lse = static_cast<double>(peak) + log(sum);
    z[t] = lse * lse;
    for (int e = 0; e < @E@; ++e) v[e] = probs[t * @E@ + e] = exp(static_cast<double>(row[e]) - lse);
@TOPK@    for (int e = 0; e < @E@; ++e) picked[t * @E@ + e] = 0;
    for (int j = 0; j < @K@; ++j) picked[t * @E@ + chosen[j]] = 1;
  }
  if (@SEQUENCES@ > 0) {
    double total = 0.0;
    for (int e = 0; e < @E@; ++e)
      total += (v[e] = 1.0 / (1.0 + exp(-static_cast<double>(row[e]))));
    for (int e = 0; e < @E@; ++e) shares[t * @E@ + e] = v[e] / total;
@TOPK@    for (int e = 0; e < @E@; ++e) seqPicked[t * @E@ + e] = 0;
    for (int j = 0; j < @K@; ++j) seqPicked[t * @E@ + chosen[j]] = 1;
  }
)",
                                     {{"TOPK", kSerialTopK}}),
                               {{"E", str(E)},
                                {"K", str(k)},
                                {"SEQUENCES", str(sequences)}});
  launches.push_back(kernel(s.index, "router_stats_rows",
                            {{"const float *__restrict__ logits", buf(s.in[0])},
                             {"double *__restrict__ probs", probs},
                             {"double *__restrict__ shares", shares},
                             {"int *__restrict__ picked", picked},
                             {"int *__restrict__ seqPicked", seqPicked},
                             {"double *__restrict__ z", z},
                             {"long long T", "T"}},
                            perToken, grid1(dim(1)), target.warpSize));
  const int64_t B = blockFor(E);
  std::string sums = subst(R"(  const int e = threadIdx.x;
  if (e < @E@) {
    double p = 0.0, c = 0.0;
    for (long long t = 0; t < T; ++t) {
      p += probs[t * @E@ + e];
      c += picked[t * @E@ + e];
    }
    out[e] = static_cast<float>(p);
    out[@E@ + e] = static_cast<float>(c);
    if (@SEQUENCES@ > 0) {
      const long long L = T / @SEQ1@;
      for (int b = 0; b < @SEQUENCES@; ++b) {
        double sh = 0.0, sc = 0.0;
        for (long long t = b * L; t < (b + 1) * L; ++t) {
          sh += shares[t * @E@ + e];
          sc += seqPicked[t * @E@ + e];
        }
        out[3 * @E@ + b * @E@ + e] = static_cast<float>(sh);
        out[(3 + @SEQUENCES@) * @E@ + b * @E@ + e] = static_cast<float>(sc);
      }
    }
    if (e >= 3) out[2 * @E@ + e] = 0.0f;
  }
  if (threadIdx.x == 0) {
    double zs = 0.0;
    for (long long t = 0; t < T; ++t) zs += z[t];
    out[2 * @E@] = static_cast<float>(zs);
    out[2 * @E@ + 1] = static_cast<float>(T);
    if (@E@ >= 3) out[2 * @E@ + 2] = @SEQUENCES@ > 0 ? static_cast<float>(@K@) : 0.0f;
  }
)",
                           {{"E", str(E)},
                            {"K", str(k)},
                            {"SEQUENCES", str(sequences)},
                            {"SEQ1", str(std::max<int64_t>(sequences, 1))}});
  launches.push_back(kernel(s.index, "router_stats_sum",
                            {{"const double *__restrict__ probs", probs},
                             {"const double *__restrict__ shares", shares},
                             {"const int *__restrict__ picked", picked},
                             {"const int *__restrict__ seqPicked", seqPicked},
                             {"const double *__restrict__ z", z},
                             {"float *__restrict__ out", buf(s.out[0])},
                             {"long long T", "T"}},
                            sums, grid1(dim(0, 1, 1)), B));
  return llvm::Error::success();
}

/// router_stats_grad: per token (one block, thread 0) the balancing loss's
/// and the z-loss's gradient through the softmax (counts constant), plus the
/// sequence-wise loss's through s / sum(s) with the per-sequence top-k
/// counts of the step's statistics, as cpu::routerStatsGrad.
llvm::Error Emitter::lowerRouterStatsGrad(const Step &s, Array &launches, std::string &) {
  const int64_t E = width(s.in[0]), layers = static_cast<int64_t>(s.in.size()) - 1;
  const int64_t sequences = s.constants.integerOr("sequences", 0);
  const double auxCoef = s.constants.number("aux_coef"), zCoef = s.constants.number("z_coef");
  if (llvm::Error e = constantsRead(s))
    return e;
  if (layers < 1 || width(s.in[1]) != E)
    return stepError(s, "expected the logits and one router statistics buffer per layer");
  std::vector<Param> params = {{"const float *__restrict__ logits", buf(s.in[0])}};
  std::string list;
  for (int64_t l = 0; l < layers; ++l) {
    params.push_back({"const float *__restrict__ stats" + str(l), buf(s.in[l + 1])});
    list += (l ? ", stats" : "stats") + str(l);
  }
  params.push_back({"float *__restrict__ out", buf(s.out[0])});
  params.push_back({"long long T", "T"});
  std::string body = subst(R"(  __shared__ double p[@E@], g[@E@], seqG[@E@];
  __shared__ unsigned char taken[@E@];
  const long long t = blockIdx.x;
  if (t >= T || threadIdx.x != 0) return;
  const float *stats[@LAYERS@] = {@LIST@};
  double rows = 0.0;
  for (int e = 0; e < @E@; ++e) g[e] = 0.0;
  for (int l = 0; l < @LAYERS@; ++l) {
    rows += stats[l][2 * @E@ + 1];
    for (int e = 0; e < @E@; ++e) g[e] += stats[l][@E@ + e];
  }
  for (int e = 0; e < @E@; ++e)
    g[e] = @AUX@ > 0 && rows > 0 && @SEQUENCES@ <= 0 ? @AUX@ * @E@ * g[e] / (rows * rows) : 0.0;
  const float *l = logits + t * @E@;
  float peak = -INFINITY;
  for (int e = 0; e < @E@; ++e) peak = fmaxf(peak, l[e]);
  double sum = 0.0;
  for (int e = 0; e < @E@; ++e) sum += (p[e] = exp(static_cast<double>(l[e]) - peak));
  const double lse = static_cast<double>(peak) + log(sum);
  double dot = 0.0;
  for (int e = 0; e < @E@; ++e) dot += (p[e] /= sum) * g[e];
  const double zs = 2.0 * @Z@ * lse / static_cast<double>(T);
  for (int e = 0; e < @E@; ++e)
    out[t * @E@ + e] = static_cast<float>(p[e] * (g[e] - dot) + zs * p[e]);
  if (@SEQUENCES@ > 0 && @AUX@ > 0) {
    // f of token t's sequence: the top-k counts of the sigmoid scores over
    // its tokens (as cpu::sequenceTopKCounts), scaled as the CPU scales them.
    const long long L = T / @SEQ1@, b = t / L;
    const int k = static_cast<int>(stats[0][2 * @E@ + 2]);
    for (int e = 0; e < @E@; ++e) seqG[e] = 0.0;
    for (long long u = b * L; u < (b + 1) * L; ++u) {
      double *v = p;
      for (int e = 0; e < @E@; ++e) v[e] = 1.0 / (1.0 + exp(-static_cast<double>(logits[u * @E@ + e])));
      for (int e = 0; e < @E@; ++e) taken[e] = 0;
      for (int j = 0; j < k; ++j) {
        int best = -1;
        for (int e = 0; e < @E@; ++e)
          if (!taken[e] && (best < 0 || v[e] > v[best])) best = e;
        taken[best] = 1;
        seqG[best] += 1.0;
      }
    }
    for (int e = 0; e < @E@; ++e)
      seqG[e] = @AUX@ * (seqG[e] * @E@ / (static_cast<double>(L) * k)) /
                (static_cast<double>(@SEQUENCES@) * L);
    double total = 0.0, weighted = 0.0;
    for (int e = 0; e < @E@; ++e) {
      p[e] = 1.0 / (1.0 + exp(-static_cast<double>(l[e])));
      total += p[e];
      weighted += seqG[e] * p[e];
    }
    for (int e = 0; e < @E@; ++e)
      out[t * @E@ + e] += static_cast<float>(p[e] * (1.0 - p[e]) *
                                             (seqG[e] / total - weighted / (total * total)));
  }
)",
                           {{"E", str(E)},
                            {"LAYERS", str(layers)},
                            {"LIST", list},
                            {"SEQUENCES", str(sequences)},
                            {"SEQ1", str(std::max<int64_t>(sequences, 1))},
                            {"AUX", doubleLit(auxCoef)},
                            {"Z", doubleLit(zCoef)}});
  launches.push_back(kernel(s.index, "router_stats_grad", params, body, grid1(dim(1)),
                            target.warpSize));
  return llvm::Error::success();
}

/// route_grad: per token (one block, thread 0), the routing weights'
/// gradient through the scaling, renormalisation and the softmax (over all
/// experts or the selected ones) or sigmoid scores, as cpu::routeGrad.
llvm::Error Emitter::lowerRouteGrad(const Step &s, Array &launches, std::string &) {
  const Constants r = s.constants.object("routing");
  const int64_t E = width(s.in[1]), k = r.integer("top_k");
  const bool sigmoid = r.string("scoring") == "sigmoid";
  const bool selectedSoftmax = !sigmoid && r.string("topk_on") == "logits";
  const bool normalize = r.boolean("normalize");
  const double c = r.number("scaling_factor");
  if (llvm::Error e = constantsRead(s))
    return e;
  if (k < 1 || k > E || width(s.in[0]) != k || width(s.in[2]) != k || width(s.out[0]) != E)
    return stepError(s, "dw and the experts are not top_k wide or dlogits not as the logits");
  std::string body = subst(R"(  __shared__ double p[@E@];
  const long long t = blockIdx.x;
  if (t >= T || threadIdx.x != 0) return;
  const float *l = logits + t * @E@;
  const int *sel = experts + t * @K@;
  const float *g = dw + t * @K@;
  float *o = out + t * @E@;
  for (int j = 0; j < @K@; ++j)
    if (sel[j] < 0 || sel[j] >= @E@) return;
  if (@SIGMOID@) {
    for (int e = 0; e < @E@; ++e) p[e] = 1.0 / (1.0 + exp(-static_cast<double>(l[e])));
  } else if (@SELECTED@) {
    double peak = -INFINITY, sum = 0.0;
    for (int j = 0; j < @K@; ++j) peak = fmax(peak, static_cast<double>(l[sel[j]]));
    for (int j = 0; j < @K@; ++j) sum += exp(l[sel[j]] - peak);
    for (int e = 0; e < @E@; ++e) p[e] = 0.0;
    for (int j = 0; j < @K@; ++j) p[sel[j]] = exp(l[sel[j]] - peak) / sum;
  } else {
    double peak = -INFINITY, sum = 0.0;
    for (int e = 0; e < @E@; ++e) peak = fmax(peak, static_cast<double>(l[e]));
    for (int e = 0; e < @E@; ++e) sum += (p[e] = exp(l[e] - peak));
    for (int e = 0; e < @E@; ++e) p[e] /= sum;
  }
  double total = 0.0, weighted = 0.0;
  for (int j = 0; j < @K@; ++j) total += p[sel[j]];
  const double S = total + 1e-20;
  for (int j = 0; j < @K@; ++j) weighted += g[j] * p[sel[j]];
  for (int e = 0; e < @E@; ++e) o[e] = 0.0f;
  double dot = 0.0;
  for (int j = 0; j < @K@; ++j) {
    const double draw = @NORMALIZE@ ? @C@ * (g[j] / S - weighted / (S * S)) : @C@ * g[j];
    dot += p[sel[j]] * draw;
    if (@SIGMOID@) o[sel[j]] = static_cast<float>(draw * p[sel[j]] * (1.0 - p[sel[j]]));
  }
  if (@SIGMOID@) return;
  for (int e = 0; e < @E@; ++e) o[e] = static_cast<float>(-p[e] * dot);
  for (int j = 0; j < @K@; ++j) {
    const double draw = @NORMALIZE@ ? @C@ * (g[j] / S - weighted / (S * S)) : @C@ * g[j];
    o[sel[j]] += static_cast<float>(p[sel[j]] * draw);
  }
)",
                           {{"E", str(E)},
                            {"K", str(k)},
                            {"SIGMOID", sigmoid ? "1" : "0"},
                            {"SELECTED", selectedSoftmax ? "1" : "0"},
                            {"NORMALIZE", normalize ? "1" : "0"},
                            {"C", doubleLit(c)}});
  launches.push_back(kernel(s.index, "route_grad",
                            {{"const float *__restrict__ dw", buf(s.in[0])},
                             {"const float *__restrict__ logits", buf(s.in[1])},
                             {"const int *__restrict__ experts", buf(s.in[2])},
                             {"float *__restrict__ out", buf(s.out[0])},
                             {"long long T", "T"}},
                            body, grid1(dim(1)), target.warpSize));
  return llvm::Error::success();
}

/// Rows of (token, slot) pairs to or from expert blocks by the dispatch's
/// slots (one block per token): `pairs` [T, k * W] and `blocks` [E * C, W];
/// to blocks, a dropped pair (slot -1) is skipped; from blocks it gets 0.
/// With `weights` (to blocks only), the row is scaled by its routing weight
/// (the experts' output gradient w dy, from a token row: `fromToken`).
Object Emitter::pairRows(int64_t i, llvm::StringRef what, std::string pairs,
                         std::string slotsRef, std::string blocks, int64_t W, int64_t k,
                         bool toBlocks, bool fromToken, std::string weights) {
  std::string body = subst(R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  for (int j = 0; j < @K@; ++j) {
    const long long p = t * @K@ + j;
    const int slot = slots[p];
    if (@TO@ && slot < 0) continue;
    const float scale = @WEIGHTED@ ? weights[p] : 1.0f;
    float *dst = @TO@ ? blocks + static_cast<long long>(slot) * @W@ : pairs + p * @W@;
    const float *src = @TO@ ? pairs + (@FROMTOKEN@ ? t : p) * @W@
                            : blocks + static_cast<long long>(slot < 0 ? 0 : slot) * @W@;
    for (int c = threadIdx.x; c < @W@; c += 128)
      dst[c] = !@TO@ && slot < 0 ? 0.0f : @WEIGHTED@ ? __fmul_rn(scale, src[c]) : src[c];
  }
)",
                           {{"K", str(k)},
                            {"W", str(W)},
                            {"TO", toBlocks ? "true" : "false"},
                            {"FROMTOKEN", fromToken ? "true" : "false"},
                            {"WEIGHTED", weights == "null" ? "false" : "true"}});
  // `pairs` is written when gathering from the blocks, `blocks` otherwise.
  return kernel(i, what,
                {{"float *__restrict__ pairs", pairs},
                 {"const int *__restrict__ slots", slotsRef},
                 {"float *__restrict__ blocks", blocks},
                 {"const float *__restrict__ weights", weights},
                 {"long long T", "T"}},
                body, grid1(dim(1)), 128);
}

/// experts_grad: the dispatch's slots again (its capacity factor: the same
/// drops), x and w dy scattered into [E, C, .] blocks, the gate and up
/// products from the saved ones (or recomputed), h = act(a) u, the routing
/// weights' gradient dy . y (y saved or recomputed), then per expert dDown
/// = (w dy)^T h, dh = (w dy) down, [da, du], dGate = da^T x, dUp = du^T x,
/// dx_pair = da gate + du up, and each token's dx the sum of its pairs' in
/// slot order.
llvm::Error Emitter::lowerExpertsGrad(const Step &s, Array &launches, std::string &) {
  const std::vector<int64_t> &in = s.in, &w = s.weights;
  if (in.size() != 4 && in.size() != 7)
    return stepError(s, "expected dy, x, the routing weights and experts, and none or three "
                        "saved activations");
  if (llvm::Error e = checkActivation(s))
    return e;
  for (size_t i = 0; i < 3; ++i)
    if (llvm::Error e = checkMatrix(s, i, 3))
      return e;
  const std::vector<int64_t> gs = shape(w[0]);
  const int64_t E = gs[0], I = gs[1], H = gs[2], C = maxTokens, k = width(in[3]);
  const bool saved = in.size() == 7;
  const double cf = s.constants.numberOr("capacity_factor", 0.0);
  const llvm::StringRef act = s.constants.string("activation");
  const std::string counts = addScratch(1, E, "I32"), slotsRef = addScratch(maxTokens, k, "I32");
  const std::string xb = addScratch(E * C, H), dyb = addScratch(E * C, H),
                    ab = addScratch(E * C, I), ub = addScratch(E * C, I),
                    hb = addScratch(E * C, I), dhb = addScratch(E * C, I),
                    dab = addScratch(E * C, I), dub = addScratch(E * C, I),
                    dxb = addScratch(E * C, H), yb = saved ? "" : addScratch(E * C, H);
  launches.push_back(slots(s.index, buf(in[3]), counts, slotsRef, E, k, C, cf, 1, 1));
  launches.push_back(scatter(s.index, buf(in[1]), slotsRef, xb, H, k));
  launches.push_back(pairRows(s.index, "experts_grad_dy", buf(in[0]), slotsRef, dyb, H, k,
                              /*toBlocks=*/true, /*fromToken=*/true, buf(in[2])));
  const std::string rowsRef = "const:" + str(E * C);
  const Array rowGrid = grid1(dim(0, 1, (E * C * I + 255) / 256));
  // Block GEMMs: C rows per expert, bounded by its count.
  auto blocks = [&](std::string a, std::string b, std::string c, int64_t m, int64_t n,
                    int64_t kk, int64_t lda, int64_t ldb, int64_t sa, int64_t sb, int64_t sc,
                    bool ta, bool tb, llvm::StringRef bDtype, bool acc = false) {
    Object g{{"a", a},          {"b", b},           {"c", c},         {"m", str(m)},
             {"n", n},          {"k", kk},          {"lda", lda},     {"ldb", ldb},
             {"ldc", n},        {"b_dtype", bDtype.str()}, {"transpose_b", tb}, {"batch", E},
             {"stride_a", sa},  {"stride_b", sb},   {"stride_c", sc}, {"rows_from_counts", counts}};
    if (ta)
      g["transpose_a"] = true;
    if (acc)
      g["accumulate"] = true;
    return Object{{"gemm", std::move(g)}};
  };
  if (saved) {
    launches.push_back(pairRows(s.index, "experts_grad_saved", buf(in[4]), slotsRef, ab, I, k,
                                true, false, "null"));
    launches.push_back(pairRows(s.index, "experts_grad_saved", buf(in[5]), slotsRef, ub, I, k,
                                true, false, "null"));
  } else {
    launches.push_back(blocks(xb, wref(w[0]), ab, C, I, H, H, H, C * H, I * H, C * I, false,
                              true, dtype(w[0])));
    launches.push_back(blocks(xb, wref(w[1]), ub, C, I, H, H, H, C * H, I * H, C * I, false,
                              true, dtype(w[1])));
  }
  launches.push_back(gatedProduct(s.index, ab, ub, hb, I, C, counts, act, rowsRef, rowGrid));
  std::string y = saved ? buf(in[6]) : yb;
  if (!saved)
    launches.push_back(blocks(hb, wref(w[2]), yb, C, H, I, I, I, C * I, H * I, C * H, false,
                              true, dtype(w[2])));
  // dweights[p] = dy[t] . y_p (f64), 0 for a dropped pair: one block per
  // pair (a block reduction inside a loop over the slots spills).
  std::string dwBody = subst(R"(  __shared__ double redd[32];
  const long long p = blockIdx.x, t = p / @K@;
  if (t >= T) return;
  const int slot = slots[p];
  const float *yr = @SAVED@ ? y + p * @H@ : y + static_cast<long long>(slot < 0 ? 0 : slot) * @H@;
  double d = 0.0;
  if (slot >= 0)
    for (int c = threadIdx.x; c < @H@; c += 128) d += static_cast<double>(dy[t * @H@ + c]) * yr[c];
  d = moe_block_sum_d(d, redd, 128);
  if (threadIdx.x == 0) dweights[p] = slot >= 0 ? static_cast<float>(d) : 0.0f;
)",
                             {{"K", str(k)}, {"H", str(H)}, {"SAVED", saved ? "true" : "false"}});
  launches.push_back(kernel(s.index, "experts_grad_weights",
                            {{"const float *__restrict__ dy", buf(in[0])},
                             {"const float *__restrict__ y", y},
                             {"const int *__restrict__ slots", slotsRef},
                             {"float *__restrict__ dweights", buf(s.out[1])},
                             {"long long T", "T"}},
                            dwBody, grid1(dim(k)), 128));
  // dDown[e] = dyb^T h; dh = dyb down[e]; [da, du]; dGate, dUp; dxb.
  launches.push_back(blocks(dyb, hb, buf(s.out[4]), H, I, C, H, I, C * H, C * I, H * I, true,
                            false, "F32"));
  launches.push_back(blocks(dyb, wref(w[2]), dhb, C, I, H, H, I, C * H, H * I, C * I, false,
                            false, dtype(w[2])));
  launches.push_back(
      gatedProductGrad(s.index, ab, ub, dhb, dab, dub, I, C, counts, act, rowsRef, rowGrid));
  launches.push_back(blocks(dab, xb, buf(s.out[2]), I, H, C, I, H, C * I, C * H, I * H, true,
                            false, "F32"));
  launches.push_back(blocks(dub, xb, buf(s.out[3]), I, H, C, I, H, C * I, C * H, I * H, true,
                            false, "F32"));
  launches.push_back(blocks(dab, wref(w[0]), dxb, C, H, I, I, H, C * I, I * H, C * H, false,
                            false, dtype(w[0])));
  launches.push_back(blocks(dub, wref(w[1]), dxb, C, H, I, I, H, C * I, I * H, C * H, false,
                            false, dtype(w[1]), /*acc=*/true));
  std::string dxBody = subst(R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  for (int c = threadIdx.x; c < @H@; c += 128) {
    float a = 0.0f;
    for (int j = 0; j < @K@; ++j) {
      const int slot = slots[t * @K@ + j];
      const float v = slot >= 0 ? dxb[static_cast<long long>(slot) * @H@ + c] : 0.0f;
      a = j == 0 ? v : __fadd_rn(a, v);
    }
    dx[t * @H@ + c] = a;
  }
)",
                             {{"K", str(k)}, {"H", str(H)}});
  launches.push_back(kernel(s.index, "experts_grad_dx",
                            {{"const float *__restrict__ dxb", dxb},
                             {"const int *__restrict__ slots", slotsRef},
                             {"float *__restrict__ dx", buf(s.out[0])},
                             {"long long T", "T"}},
                            dxBody, grid1(dim(1)), 128));
  return llvm::Error::success();
}

} // namespace moe::cuda::detail
