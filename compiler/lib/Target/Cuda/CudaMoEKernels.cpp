//===- CudaMoEKernels.cpp - routing, dispatch, experts, combine -*- C++ -*-===//
//
// Step lowerings and kernel builders of the CUDA emitter (Emitter.h): the
// router (gate GEMM + routing epilogue) and route, dispatch into expert
// blocks, the experts' grouped GEMMs and activation, combine.
//
//===----------------------------------------------------------------------===//
#include "Emitter.h"

namespace moe::cuda::detail {

Object Emitter::activation(int64_t i, std::string g, std::string u, std::string counts,
                           int64_t I, int64_t C, llvm::StringRef act, std::string rowsRef,
                           Array grid) {
  std::string f;
  if (act == "silu")
    f = "v / (1.0f + expf(-v))";
  else if (act == "gelu")
    f = "0.5f * v * (1.0f + erff(v * 0.70710678118654752f))";
  else if (act == "gelu_tanh")
    f = "0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)))";
  else // relu (checkActivation)
    f = "v > 0.0f ? v : 0.0f";
  std::string body = subst(R"(  const long long idx = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;
  if (idx >= rows * @I@) return;
  const long long r = idx / @I@;
  if (@COUNTED@ && r % @C@ >= counts[r / @C@]) return;
  const float v = g[idx];
  g[idx] = (@F@) * u[idx];
)", {{"I", str(I)}, {"C", str(std::max<int64_t>(C, 1))}, {"COUNTED", counts == "null" ? "0" : "1"},
     {"F", f}});
  return kernel(i, "act_" + act.str(),
                {{"float *__restrict__ g", g},
                 {"const float *__restrict__ u", u},
                 {"const int *__restrict__ counts", counts},
                 {"long long rows", rowsRef}},
                body, std::move(grid), 256);
}

/// Capacity dispatch, positions: one thread per expert walks the (t, j)
/// assignments in order (the prefix count of its own assignments), keeps
/// the first c(T), writes the slots of its kept assignments of this part's
/// rows and its count. Ids outside [0, E) get slot -1.
Object Emitter::slots(int64_t i, std::string experts, std::string counts, std::string slotsOut,
                      int64_t E, int64_t k, int64_t C, double cf, int64_t parts,
                      int64_t stride) {
  const int64_t B = blockFor(E);
  std::string body = subst(R"(  const long long part = tp / @STRIDE@;
  const long long rowBegin = T * part / @P@, rowEnd = T * (part + 1) / @P@;
  long long c = T;
  if (@CF@ > 0.0) {
    const long long want = static_cast<long long>(ceil(@CF@ * static_cast<double>(T) *
                                                        static_cast<double>(@K@) /
                                                        static_cast<double>(@E@)));
    c = want < T ? want : T;
  }
  if (c > @C@) c = @C@;
  if (c < 0) c = 0;
  for (int e = threadIdx.x; e < @E@; e += @B@) {
    long long seen = 0;
    int count = 0;
    for (long long p = 0; p < T * @K@; ++p) {
      if (experts[p] != e) continue;
      const long long t = p / @K@;
      const bool kept = seen++ < c;
      if (kept && t >= rowBegin && t < rowEnd)
        slots[p] = e * @C@ + count++;
      else
        slots[p] = -1;
    }
    counts[e] = count;
  }
  for (long long p = threadIdx.x; p < T * @K@; p += @B@)
    if (experts[p] < 0 || experts[p] >= @E@) slots[p] = -1;
)", {{"STRIDE", str(stride)}, {"P", str(parts)}, {"CF", doubleLit(cf)}, {"K", str(k)},
     {"E", str(E)}, {"C", str(C)}, {"B", str(B)}});
  return kernel(i, "dispatch_slots",
                {{"const int *__restrict__ experts", experts},
                 {"int *__restrict__ counts", counts},
                 {"int *__restrict__ slots", slotsOut},
                 {"long long T", "T"},
                 {"long long tp", "coord:tp"}},
                body, grid1(dim(0, 1, 1)), B);
}

Object Emitter::scatter(int64_t i, std::string x, std::string slotsRef, std::string buf,
                        int64_t H, int64_t k) {
  // Each column of x read once and stored to the token's k slots (slots
  // outermost made ptxas spill at k = 8, H = 2048: OLMoE, Qwen3-30B-A3B).
  const bool v4 = H % 4 == 0;
  std::string body = subst(R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  const @VT@ *src = reinterpret_cast<const @VT@ *>(x + t * @H@);
  for (int c = threadIdx.x; c < @N@; c += 128) {
    const @VT@ v = src[c];
    for (int j = 0; j < @K@; ++j) {
      const int slot = slots[t * @K@ + j];
      if (slot >= 0) reinterpret_cast<@VT@ *>(buf + static_cast<long long>(slot) * @H@)[c] = v;
    }
  }
)",
                           {{"K", str(k)},
                            {"H", str(H)},
                            {"N", str(v4 ? H / 4 : H)},
                            {"VT", v4 ? "float4" : "float"}});
  return kernel(i, "dispatch_scatter",
                {{"const float *__restrict__ x", x},
                 {"const int *__restrict__ slots", slotsRef},
                 {"float *__restrict__ buf", buf},
                 {"long long T", "T"}},
                body, grid1(dim(1)), 128);
}

Object Emitter::combine(int64_t i, std::string y, std::string slotsRef, std::string w,
                        std::string out, int64_t H, int64_t k) {
  std::string body;
  if (H % 4 == 0)
    body = R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  float4 *dst = reinterpret_cast<float4 *>(out + t * @H@);
  for (int c = threadIdx.x; c < @H@ / 4; c += 128) {
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j = 0; j < @K@; ++j) {
      const int slot = slots[t * @K@ + j];
      if (slot < 0) continue;
      const float wj = weights[t * @K@ + j];
      const float4 v = reinterpret_cast<const float4 *>(y + static_cast<long long>(slot) * @H@)[c];
      a.x = __fadd_rn(a.x, __fmul_rn(wj, v.x));
      a.y = __fadd_rn(a.y, __fmul_rn(wj, v.y));
      a.z = __fadd_rn(a.z, __fmul_rn(wj, v.z));
      a.w = __fadd_rn(a.w, __fmul_rn(wj, v.w));
    }
    dst[c] = a;
  }
)";
  else
    body = R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  for (int c = threadIdx.x; c < @H@; c += 128) {
    float a = 0.0f;
    for (int j = 0; j < @K@; ++j) {
      const int slot = slots[t * @K@ + j];
      if (slot < 0) continue;
      a = __fadd_rn(a, __fmul_rn(weights[t * @K@ + j], y[static_cast<long long>(slot) * @H@ + c]));
    }
    out[t * @H@ + c] = a;
  }
)";
  body = subst(body, {{"H", str(H)}, {"K", str(k)}});
  return kernel(i, "combine",
                {{"const float *__restrict__ y", y},
                 {"const int *__restrict__ slots", slotsRef},
                 {"const float *__restrict__ weights", w},
                 {"float *__restrict__ out", out},
                 {"long long T", "T"}},
                body, grid1(dim(1)), 128);
}

/// The routing of logits [T, E] (`logits`: a buffer or scratch ref) with
/// the optional correction bias (weight `bias`, -1: none) into the top-k
/// weights and expert ids (buffers): one block per token.
Object Emitter::route(int64_t i, const Constants &r, int64_t E, const std::string &logits,
                      int64_t bias, int64_t weightsOut, int64_t expertsOut) {
  const int64_t k = r.integer("top_k"), groups = r.integer("num_groups"),
                topkGroups = r.integer("topk_groups");
  const bool sigmoid = r.string("scoring") == "sigmoid";
  const bool onLogits = r.string("topk_on") == "logits";
  const bool softmaxOfSelected = onLogits && !sigmoid;
  const bool bf16 = r.string("compute_type") == "BF16";
  const bool groupMax = r.string("group_score") == "max";
  const int64_t B = blockFor(E);
  WeightType bt = bias >= 0 ? weightType(dtype(bias)) : WeightType{"float", "moe_f32"};
  std::string body = subst(R"(  __shared__ float lg[@E@], sc[@E@], key[@E@], gs[@NG@], wj[@K@], red[32], rk[32];
  __shared__ int chosen[@K@], ri[32];
  __shared__ unsigned char taken[@E@], kept[@NG@];
  __shared__ double dred[32];
  const long long t = blockIdx.x;
  if (t >= T) return;
  for (int e = threadIdx.x; e < @E@; e += @B@) {
    const float v = logits[t * @E@ + e];
    lg[e] = @BF16@ ? moe_round_bf16(v) : v;
    taken[e] = 0;
  }
  __syncthreads();
  if (@SIGMOID@) {
    for (int e = threadIdx.x; e < @E@; e += @B@)
      sc[e] = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(lg[e]))));
  } else if (!@SOFTMAX_SELECTED@) {
    float mx = -INFINITY;
    for (int e = threadIdx.x; e < @E@; e += @B@) mx = fmaxf(mx, lg[e]);
    mx = moe_block_max(mx, red, @B@);
    double s = 0.0;
    for (int e = threadIdx.x; e < @E@; e += @B@) {
      sc[e] = static_cast<float>(exp(static_cast<double>(lg[e] - mx)));
      s += sc[e];
    }
    const float total = static_cast<float>(moe_block_sum_d(s, dred, @B@));
    for (int e = threadIdx.x; e < @E@; e += @B@) sc[e] = sc[e] / total;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < @E@; e += @B@) {
    const float base = @ON_LOGITS@ ? lg[e] : sc[e];
    key[e] = @HAS_BIAS@ ? base + @BLOAD@(bias[e]) : base;
  }
  __syncthreads();
  if (@NG@ > 1) {
    for (int g = threadIdx.x; g < @NG@; g += @B@) {
      const float *gk = key + g * (@E@ / @NG@);
      if (@GROUP_MAX@ || @E@ / @NG@ < 2) {
        float best = gk[0];
        for (int i = 1; i < @E@ / @NG@; ++i) best = gk[i] > best ? gk[i] : best;
        gs[g] = best;
      } else {
        float first = -INFINITY, second = -INFINITY;
        for (int i = 0; i < @E@ / @NG@; ++i) {
          if (gk[i] > first) { second = first; first = gk[i]; }
          else if (gk[i] > second) second = gk[i];
        }
        gs[g] = first + second;
      }
      kept[g] = 0;
    }
    __syncthreads();
    if (threadIdx.x == 0)
      for (int n = 0; n < @TG@; ++n) {
        int best = -1;
        for (int g = 0; g < @NG@; ++g) {
          if (kept[g]) continue;
          const float kg = isnan(gs[g]) ? -INFINITY : gs[g];
          const float kb = best < 0 ? 0.0f : (isnan(gs[best]) ? -INFINITY : gs[best]);
          if (moe_better(kg, g, kb, best)) best = g;
        }
        kept[best] = 1;
      }
    __syncthreads();
    for (int e = threadIdx.x; e < @E@; e += @B@)
      if (!kept[e / (@E@ / @NG@)]) key[e] = -INFINITY;
    __syncthreads();
  }
  for (int j = 0; j < @K@; ++j) {
    float bk = -INFINITY;
    int bi = -1;
    for (int e = threadIdx.x; e < @E@; e += @B@) {
      if (taken[e]) continue;
      const float ke = isnan(key[e]) ? -INFINITY : key[e];
      if (moe_better(ke, e, bk, bi)) { bk = ke; bi = e; }
    }
    moe_block_best(bk, bi, rk, ri, @B@);
    if (threadIdx.x == 0) { chosen[j] = bi; taken[bi] = 1; }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (@SOFTMAX_SELECTED@) {
      float mx = -INFINITY;
      for (int j = 0; j < @K@; ++j) mx = fmaxf(mx, lg[chosen[j]]);
      double s = 0.0;
      for (int j = 0; j < @K@; ++j) {
        wj[j] = static_cast<float>(exp(static_cast<double>(lg[chosen[j]] - mx)));
        s += wj[j];
      }
      const float total = static_cast<float>(s);
      for (int j = 0; j < @K@; ++j) wj[j] = wj[j] / total;
    } else {
      for (int j = 0; j < @K@; ++j) wj[j] = sc[chosen[j]];
    }
    if (@NORMALIZE@) {
      float s = 0.0f;
      for (int j = 0; j < @K@; ++j) s = __fadd_rn(s, wj[j]);
      const float denominator = s + 1e-20f;
      for (int j = 0; j < @K@; ++j) wj[j] = wj[j] / denominator;
    }
    for (int j = 0; j < @K@; ++j) {
      float v = wj[j] * @SCALING@;
      if (@BF16@) v = moe_round_bf16(v);
      weights[t * @K@ + j] = v;
      experts[t * @K@ + j] = chosen[j];
    }
  }
)", {{"E", str(E)}, {"NG", str(groups)}, {"TG", str(topkGroups)}, {"K", str(k)}, {"B", str(B)},
     {"BF16", bf16 ? "1" : "0"}, {"SIGMOID", sigmoid ? "1" : "0"},
     {"SOFTMAX_SELECTED", softmaxOfSelected ? "1" : "0"}, {"ON_LOGITS", onLogits ? "1" : "0"},
     {"HAS_BIAS", bias >= 0 ? "1" : "0"}, {"BLOAD", bt.load},
     {"GROUP_MAX", groupMax ? "1" : "0"}, {"NORMALIZE", r.boolean("normalize") ? "1" : "0"},
     {"SCALING", floatLit(r.number("scaling_factor"))}});
  return kernel(i, "router",
                {{"const float *__restrict__ logits", logits},
                 {"const " + bt.type + " *__restrict__ bias",
                  bias >= 0 ? "weight:" + str(bias) : std::string("null")},
                 {"float *__restrict__ weights", "buf:" + str(weightsOut)},
                 {"int *__restrict__ experts", "buf:" + str(expertsOut)},
                 {"long long T", "T"}},
                body, grid1(dim(1)), B);
}

llvm::Error Emitter::checkActivation(const Step &s) const {
  const llvm::StringRef act = s.constants.string("activation");
  if (llvm::Error e = constantsRead(s))
    return e;
  if (act != "silu" && act != "gelu" && act != "gelu_tanh" && act != "relu")
    return stepError(s, "activation '" + act + "' has no CUDA kernel");
  return llvm::Error::success();
}

/// The gate's GEMM into scratch, then the routing epilogue.
llvm::Error Emitter::lowerRouter(const Step &s, Array &launches, std::string &) {
  const std::vector<int64_t> &w = s.weights;
  if (llvm::Error e = checkMatrix(s, 0))
    return e;
  std::vector<int64_t> gs = shape(w[0]);
  const int64_t E = gs[0], H = gs[1];
  std::string logits = addScratch(maxTokens, E);
  launches.push_back(gemm(buf(s.in[0]), wref(w[0]), logits, "T", E, H, dtype(w[0])));
  launches.push_back(route(s.index, s.constants.object("routing"), E, logits,
                           w.size() > 1 ? w[1] : -1, s.out[0], s.out[1]));
  return llvm::Error::success();
}

llvm::Error Emitter::lowerRoute(const Step &s, Array &launches, std::string &) {
  launches.push_back(route(s.index, s.constants.object("routing"), width(s.in[0]),
                           buf(s.in[0]), s.weights.empty() ? -1 : s.weights[0], s.out[0],
                           s.out[1]));
  return llvm::Error::success();
}

/// experts (dropless, one rank): dispatch with C = max_batch_tokens, the
/// strided-batched GEMMs over [E, C, .], combine. expert_ffn: the GEMMs over
/// its [sources, El, C, H] buffer, counts from its input.
llvm::Error Emitter::lowerExperts(const Step &s, Array &launches, std::string &) {
  const std::vector<int64_t> &in = s.in, &w = s.weights;
  // experts_saved (training): also the gate and up products and the output
  // of each (token, slot) pair, with the capacity factor's drops.
  const bool saving = s.kernel == "experts_saved";
  const bool dropless = s.kernel == "experts" || saving;
  const double cf = saving ? s.constants.numberOr("capacity_factor", 0.0) : 0.0;
  if (llvm::Error e = checkActivation(s))
    return e;
  for (size_t i = 0; i < 3; ++i)
    if (llvm::Error e = checkMatrix(s, i, 3))
      return e;
  std::vector<int64_t> gs = shape(w[0]);
  const int64_t El = gs[0], I = gs[1], H = gs[2];
  std::string x, counts, y, slotsRef;
  int64_t E, C, k = 0;
  if (dropless) {
    E = El;
    C = maxTokens;
    k = width(in[1]);
    counts = addScratch(1, E, "I32");
    slotsRef = addScratch(maxTokens, k, "I32");
    x = addScratch(E * C, H);
    y = addScratch(E * C, H);
    launches.push_back(slots(s.index, buf(in[2]), counts, slotsRef, E, k, C, cf, 1, 1));
    launches.push_back(scatter(s.index, buf(in[0]), slotsRef, x, H, k));
  } else {
    E = width(in[1]);
    if (E <= 0 || rows(in[0]) % E)
      return stepError(s, llvm::formatv("{0} block rows do not split over {1} expert counts",
                                        rows(in[0]), E));
    C = rows(in[0]) / E;
    x = buf(in[0]);
    counts = buf(in[1]);
    y = buf(s.out[0]);
  }
  std::string g = addScratch(E * C, I), u = addScratch(E * C, I);
  auto batched = [&](std::string A, int64_t wid, std::string Cm, int64_t n, int64_t kk) {
    Object o = gemm(A, wref(wid), Cm, str(C), n, kk, dtype(wid));
    Object &gm = *o.getObject("gemm");
    gm["batch"] = E;
    gm["stride_a"] = C * kk;
    gm["stride_b"] = n * kk;
    gm["stride_c"] = C * n;
    gm["b_batch_modulo"] = El; // block b uses expert b % El of the stack
    gm["rows_from_counts"] = counts;
    return o;
  };
  launches.push_back(batched(x, w[0], g, I, H));
  launches.push_back(batched(x, w[1], u, I, H));
  if (saving) {
    launches.push_back(pairRows(s.index, "experts_save_inner", buf(s.out[1]), slotsRef, g, I, k,
                                /*toBlocks=*/false, false, "null"));
    launches.push_back(pairRows(s.index, "experts_save_inner", buf(s.out[2]), slotsRef, u, I, k,
                                false, false, "null"));
  }
  launches.push_back(activation(s.index, g, u, counts, I, C, s.constants.string("activation"),
                                "const:" + str(E * C),
                                grid1(dim(0, 1, (E * C * I + 255) / 256))));
  launches.push_back(batched(g, w[2], y, H, I));
  if (saving)
    launches.push_back(pairRows(s.index, "experts_save_output", buf(s.out[3]), slotsRef, y, H, k,
                                false, false, "null"));
  if (dropless)
    launches.push_back(combine(s.index, y, slotsRef, buf(in[1]), buf(s.out[0]), H, k));
  return llvm::Error::success();
}

llvm::Error Emitter::lowerDispatch(const Step &s, Array &launches, std::string &) {
  const Constants &a = s.constants;
  const int64_t E = a.integer("num_experts"), C = a.integer("capacity"), k = a.integer("top_k");
  launches.push_back(slots(s.index, buf(s.in[1]), buf(s.out[1]), buf(s.out[2]), E, k, C,
                           a.number("capacity_factor"), a.integer("row_parts"),
                           a.integer("row_part_stride")));
  launches.push_back(
      scatter(s.index, buf(s.in[0]), buf(s.out[2]), buf(s.out[0]), width(s.in[0]), k));
  return llvm::Error::success();
}

llvm::Error Emitter::lowerCombine(const Step &s, Array &launches, std::string &) {
  launches.push_back(combine(s.index, buf(s.in[0]), buf(s.in[1]), buf(s.in[2]), buf(s.out[0]),
                             width(s.in[0]), width(s.in[1])));
  return llvm::Error::success();
}

} // namespace moe::cuda::detail
