//===- CudaAttentionKernels.cpp - RoPE, KV cache and attention -*- C++ -*-===//
//
// Step lowerings and kernel builders of the CUDA emitter (Emitter.h): RoPE,
// KV cache and attention (GQA and DeepSeek's MLA).
//
//===----------------------------------------------------------------------===//
#include "Emitter.h"

namespace moe::cuda::detail {

Object Emitter::rope(int64_t i, std::string in, std::string out, std::string positions,
                     int64_t W, int64_t headDim, int64_t headStride, int64_t headOffset,
                     const Constants &r, llvm::StringRef what, bool transposed) {
  const int64_t table = ropeTable(r);
  const int64_t half = r.integer("rotary_dim") / 2;
  const bool interleaved = r.boolean("interleaved");
  const int64_t heads = W / headStride;
  std::string body = subst(R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  const float *src = x + t * @W@;
  float *dst = out + t * @W@;
  if (dst != src)
    for (int i = threadIdx.x; i < @W@; i += 128) dst[i] = src[i];
  __syncthreads();
  const float *c = cosTable + static_cast<long long>(positions[t]) * @HALF@;
  const float *s = sinTable + static_cast<long long>(positions[t]) * @HALF@;
  for (int i = threadIdx.x; i < @HEADS@ * @HALF@; i += 128) {
    const int h = i / @HALF@, j = i % @HALF@;
    const int base = h * @STRIDE@ + @OFFSET@;
    const int ia = @INTERLEAVED@ ? base + 2 * j : base + j;
    const int ib = @INTERLEAVED@ ? base + 2 * j + 1 : base + j + @HALF@;
    const float a = src[ia], b = src[ib];
    const float ra = __fadd_rn(__fmul_rn(a, c[j]), @MINUS@__fmul_rn(b, s[j]));
    const float rb = __fadd_rn(__fmul_rn(b, c[j]), @PLUS@__fmul_rn(a, s[j]));
    dst[ia] = ra;
    dst[ib] = rb;
  }
)", {{"W", str(W)}, {"HALF", str(half)}, {"HEADS", str(heads)}, {"STRIDE", str(headStride)},
     {"OFFSET", str(headOffset)}, {"INTERLEAVED", interleaved ? "1" : "0"},
     // The transpose of [c -s; s c] (rope_grad) is [c s; -s c].
     {"MINUS", transposed ? "" : "-"}, {"PLUS", transposed ? "-" : ""}});
  // Each pair is read and written by the same thread: in place is safe.
  (void)headDim;
  return kernel(i, what,
                {{"const float *x", in},
                 {"const int *__restrict__ positions", positions},
                 {"const float *__restrict__ cosTable", "rope_cos:" + str(table)},
                 {"const float *__restrict__ sinTable", "rope_sin:" + str(table)},
                 {"float *out", out},
                 {"long long T", "T"}},
                body, grid1(dim(1)), 128);
}

Object Emitter::kvWrite(int64_t i, std::string k, std::string v, int64_t kw, int64_t vw,
                        int64_t cache) {
  std::string body = subst(R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  const long long row = static_cast<long long>(seq[t]) * @MAXSEQ@ + positions[t];
  moe_copy_row(keys + row * @KW@, k + t * @KW@, @KW@, threadIdx.x, 128, @KV4@);
  moe_copy_row(values + row * @VW@, v + t * @VW@, @VW@, threadIdx.x, 128, @VV4@);
)", {{"MAXSEQ", str(maxSeqLen)}, {"KW", str(kw)}, {"VW", str(vw)},
     {"KV4", kw % 4 == 0 ? "true" : "false"}, {"VV4", vw % 4 == 0 ? "true" : "false"}});
  return kernel(i, "kv_write",
                {{"const float *__restrict__ k", k},
                 {"const float *__restrict__ v", v},
                 {"const int *__restrict__ seq", "batch:sequence"},
                 {"const int *__restrict__ positions", "batch:position"},
                 {"float *__restrict__ keys", "cache_keys:" + str(cache)},
                 {"float *__restrict__ values", "cache_values:" + str(cache)},
                 {"long long T", "T"}},
                body, grid1(dim(1)), 128);
}

/// Causal attention of every (token, head) over its sequence's cached rows
/// (after kv_write): keys in tiles of 64, one warp per key for the scores
/// (lanes over the head dim, shuffle reduction), online softmax, each thread
/// owning value columns d = tid + 128 c.
Object Emitter::attend(int64_t i, std::string q, int64_t ldq, std::string out, int64_t heads,
                       int64_t kvHeads, int64_t dq, int64_t dv, double scale, int64_t window,
                       int64_t cache) {
  const int64_t B = 128, NV = (dv + B - 1) / B;
  const int64_t kw = kvHeads * dq, vw = kvHeads * dv;
  std::string body = subst(R"(  __shared__ float qs[@DQ@];
  __shared__ float ps[64];
  const long long t = blockIdx.x;
  const int h = blockIdx.y;
  if (t >= T) return;
  const int lane = threadIdx.x % MOE_WARP_SIZE, warp = threadIdx.x / MOE_WARP_SIZE;
  for (int d = threadIdx.x; d < @DQ@; d += @B@) qs[d] = q[t * @LDQ@ + h * @DQ@ + d];
  const long long pos = positions[t];
  const long long first = @WINDOW@ > 0 && pos - @WINDOW@ + 1 > 0 ? pos - @WINDOW@ + 1 : 0;
  const int n = static_cast<int>(pos - first + 1);
  const int g = h / @GROUP@;
  const long long base = static_cast<long long>(seq[t]) * @MAXSEQ@ + first;
  const float *K = keys + base * @KW@ + g * @DQ@;
  const float *V = values + base * @VW@ + g * @DV@;
  float m = -INFINITY, l = 0.0f;
  float acc[@NV@];
#pragma unroll
  for (int c = 0; c < @NV@; ++c) acc[c] = 0.0f;
  __syncthreads();
  for (int j0 = 0; j0 < n; j0 += 64) {
    const int nt = n - j0 < 64 ? n - j0 : 64;
    for (int jj = warp; jj < nt; jj += @B@ / MOE_WARP_SIZE) {
      const float *kr = K + static_cast<long long>(j0 + jj) * @KW@;
      float s = 0.0f;
      for (int d = lane; d < @DQ@; d += MOE_WARP_SIZE) s += qs[d] * kr[d];
      s = moe_warp_sum(s);
      if (lane == 0) ps[jj] = s * @SCALE@;
    }
    __syncthreads();
    float tmax = -INFINITY;
    for (int jj = 0; jj < nt; ++jj) tmax = fmaxf(tmax, ps[jj]);
    const float mnew = fmaxf(m, tmax);
    const float corr = expf(m - mnew);
    __syncthreads();
    if (threadIdx.x < nt) ps[threadIdx.x] = expf(ps[threadIdx.x] - mnew);
    __syncthreads();
    float lsum = 0.0f;
    for (int jj = 0; jj < nt; ++jj) lsum += ps[jj];
    l = l * corr + lsum;
#pragma unroll
    for (int c = 0; c < @NV@; ++c) {
      const int d = threadIdx.x + c * @B@;
      if (d < @DV@) {
        float a = acc[c] * corr;
        const float *vr = V + static_cast<long long>(j0) * @VW@ + d;
        for (int jj = 0; jj < nt; ++jj) a += ps[jj] * vr[static_cast<long long>(jj) * @VW@];
        acc[c] = a;
      }
    }
    m = mnew;
    __syncthreads();
  }
  float *o = out + t * @HEADS@ * @DV@ + h * @DV@;
#pragma unroll
  for (int c = 0; c < @NV@; ++c) {
    const int d = threadIdx.x + c * @B@;
    if (d < @DV@) o[d] = acc[c] / l;
  }
)", {{"DQ", str(dq)}, {"DV", str(dv)}, {"B", str(B)}, {"NV", str(NV)}, {"LDQ", str(ldq)},
     {"WINDOW", str(window)}, {"GROUP", str(heads / kvHeads)}, {"MAXSEQ", str(maxSeqLen)},
     {"KW", str(kw)}, {"VW", str(vw)}, {"SCALE", floatLit(scale)}, {"HEADS", str(heads)}});
  return kernel(i, "attention",
                {{"const float *__restrict__ q", q},
                 {"const int *__restrict__ seq", "batch:sequence"},
                 {"const int *__restrict__ positions", "batch:position"},
                 {"const float *__restrict__ keys", "cache_keys:" + str(cache)},
                 {"const float *__restrict__ values", "cache_values:" + str(cache)},
                 {"float *__restrict__ out", out},
                 {"long long T", "T"}},
                body, Array{dim(1), dim(0, 1, heads), dim(0, 1, 1)}, B);
}

/// g = act(g) * u over rows x I values; with counts (non-"null"), row r of
/// block e = r / C is skipped when r % C >= counts[e].

llvm::Error Emitter::lowerRope(const Step &s, Array &launches, std::string &) {
  const Constants &a = s.constants;
  const int64_t W = width(s.in[0]), D = a.integer("head_dim");
  if (llvm::Error e = constantsRead(s))
    return e;
  if (D <= 0 || W % D)
    return stepError(s, llvm::formatv("head_dim {0} does not divide the width {1}", D, W));
  launches.push_back(rope(s.index, buf(s.in[0]), buf(s.out[0]), buf(s.in[1]), W, D, D, 0,
                          a.object("rope"), "rope"));
  return llvm::Error::success();
}

/// The KV cache an attention step names, checked against the program's.
llvm::Error Emitter::checkCache(const Step &s, int64_t cache) const {
  if (cache < 0 || cache >= kvCaches)
    return stepError(s, llvm::formatv("kv_cache {0} is not one of the program's {1}", cache,
                                      kvCaches));
  return llvm::Error::success();
}

llvm::Error Emitter::lowerAttention(const Step &s, Array &launches, std::string &) {
  const Constants &a = s.constants;
  const int64_t heads = a.integer("heads"), kvHeads = a.integer("kv_heads");
  const int64_t cache = a.integer("kv_cache");
  if (llvm::Error e = constantsRead(s))
    return e;
  if (llvm::Error e = checkCache(s, cache))
    return e;
  if (heads <= 0 || kvHeads <= 0 || heads % kvHeads)
    return stepError(s, llvm::formatv("{0} heads do not share {1} KV heads", heads, kvHeads));
  const int64_t dq = width(s.in[0]) / heads, dv = width(s.in[2]) / kvHeads;
  launches.push_back(
      kvWrite(s.index, buf(s.in[1]), buf(s.in[2]), kvHeads * dq, kvHeads * dv, cache));
  launches.push_back(attend(s.index, buf(s.in[0]), heads * dq, buf(s.out[0]), heads, kvHeads, dq,
                            dv, a.number("scale"), a.integerOr("sliding_window", 0), cache));
  return llvm::Error::success();
}

llvm::Error Emitter::lowerMlaAttention(const Step &s, Array &launches, std::string &) {
  const Constants &a = s.constants;
  const std::vector<int64_t> &in = s.in;
  const int64_t H = a.integer("heads"), r = width(in[2]), cache = a.integer("kv_cache");
  if (llvm::Error e = constantsRead(s))
    return e;
  if (llvm::Error e = checkCache(s, cache))
    return e;
  if (H <= 0 || width(in[0]) % H || width(in[1]) % H || width(in[0]) / H <= r)
    return stepError(s, llvm::formatv("{0} heads do not split query {1} and kv {2} with a "
                                      "rotary part of {3}",
                                      H, width(in[0]), width(in[1]), r));
  const int64_t nope = width(in[0]) / H - r, vdim = width(in[1]) / H - nope, qk = nope + r;
  const Constants ropeAttr = a.object("rope");
  // q with the rotary tail of each head rotated, into scratch.
  std::string q = addScratch(maxTokens, H * qk);
  launches.push_back(rope(s.index, buf(in[0]), q, "batch:position", H * qk, r, qk, nope,
                          ropeAttr, "mla_rope_q"));
  // Rotated key_rope into scratch, then the per-head cache rows.
  std::string kr = addScratch(maxTokens, r);
  launches.push_back(
      rope(s.index, buf(in[2]), kr, "batch:position", r, r, r, 0, ropeAttr, "mla_rope_k"));
  std::string body = subst(R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  const long long row = static_cast<long long>(seq[t]) * @MAXSEQ@ + positions[t];
  float *kd = keys + row * @H@ * @QK@;
  float *vd = values + row * @H@ * @VD@;
  for (int i = threadIdx.x; i < @H@ * @QK@; i += 128) {
    const int h = i / @QK@, c = i % @QK@;
    kd[i] = c < @NOPE@ ? kv[(t * @H@ + h) * (@NOPE@ + @VD@) + c] : keyRope[t * @R@ + (c - @NOPE@)];
  }
  for (int i = threadIdx.x; i < @H@ * @VD@; i += 128) {
    const int h = i / @VD@, c = i % @VD@;
    vd[i] = kv[(t * @H@ + h) * (@NOPE@ + @VD@) + @NOPE@ + c];
  }
)", {{"MAXSEQ", str(maxSeqLen)}, {"H", str(H)}, {"QK", str(qk)}, {"VD", str(vdim)},
     {"NOPE", str(nope)}, {"R", str(r)}});
  launches.push_back(kernel(s.index, "mla_kv_write",
                            {{"const float *__restrict__ kv", buf(in[1])},
                             {"const float *__restrict__ keyRope", kr},
                             {"const int *__restrict__ seq", "batch:sequence"},
                             {"const int *__restrict__ positions", "batch:position"},
                             {"float *__restrict__ keys", "cache_keys:" + str(cache)},
                             {"float *__restrict__ values", "cache_values:" + str(cache)},
                             {"long long T", "T"}},
                            body, grid1(dim(1)), 128));
  launches.push_back(
      attend(s.index, q, H * qk, buf(s.out[0]), H, H, qk, vdim, a.number("scale"), 0, cache));
  return llvm::Error::success();
}

} // namespace moe::cuda::detail

namespace moe::cuda::detail {

namespace {

/// The literals of the attention gradient's kernels (block size B).
std::map<std::string, std::string> attentionGradValues(const AttentionGradShape &a, int64_t B) {
  return {{"DQ", str(a.dq)},
          {"DV", str(a.dv)},
          {"B", str(B)},
          {"NQ", str((a.dq + B - 1) / B)},
          {"NV", str((a.dv + B - 1) / B)},
          {"QW", str(a.heads * a.dq)},
          {"OW", str(a.heads * a.dv)},
          {"KW", str(a.kvHeads * a.dq)},
          {"VW", str(a.kvHeads * a.dv)},
          {"WINDOW", str(a.window)},
          {"GROUP", str(a.heads / a.kvHeads)},
          {"HEADS", str(a.heads)},
          {"SCALE", floatLit(a.scale)}};
}

} // namespace

/// attention_grad (GQA, causal, sliding window) over a training step's
/// whole sequences (contiguous rows, positions from 0: the key at position
/// p of token t's sequence is row t - pos(t) + p), in two kernels without
/// atomics. `attention_grad_stats` and `attention_grad_q`, one block per
/// (query token, head): the softmax row recomputed as cpu::attentionGrad
/// rounds it (scores scale * q.k in f32, p = exp(s - max) * f32(1 / sum)
/// with the sum in f64: the first kernel), dP = dO.V, rowDot = sum p dP
/// (f64), dS = p (dP - rowDot) scale, dQ = sum dS K (the second); they keep
/// (max, 1 / sum, rowDot) per (token, head) in `stats`.
/// `attention_grad_kv`, one block per (key token, KV head): over the group's
/// heads and the queries that see the key, p and dS again from the stats,
/// dK = sum dS Q and dV = sum p dO.
void Emitter::attendGradQ(int64_t i, const AttentionGradRefs &r, const std::string &stats,
                          Array &launches) {
  const AttentionGradShape &a = r.shape;
  const int64_t B = 128;
  // The row's scores (from pass 2 also dO . V) in tiles of 64 keys, one
  // warp per key; passes FIRST..LAST each run PASS on every tile, then
  // AFTER.
  const char *head = R"(  __shared__ float qs[@DQ@];
  __shared__ float dos[@DV@];
  __shared__ float ps[64];
  __shared__ float pd[64];
  const long long t = blockIdx.x;
  const int h = blockIdx.y;
  if (t >= T) return;
  const int lane = threadIdx.x % MOE_WARP_SIZE, warp = threadIdx.x / MOE_WARP_SIZE;
  for (int d = threadIdx.x; d < @DQ@; d += @B@) qs[d] = q[t * @QW@ + h * @DQ@ + d];
  for (int d = threadIdx.x; d < @DV@; d += @B@) dos[d] = dout[t * @OW@ + h * @DV@ + d];
  const long long pos = positions[t];
  const long long first = @WINDOW@ > 0 && pos - @WINDOW@ + 1 > 0 ? pos - @WINDOW@ + 1 : 0;
  const int n = static_cast<int>(pos - first + 1);
  const int g = h / @GROUP@;
  const long long base = t - pos + first;
  const float *K = k + base * @KW@ + g * @DQ@;
  const float *V = v + base * @VW@ + g * @DV@;
  float *st = stats + (t * @HEADS@ + h) * 3;
  __syncthreads();
)";
  const char *tiles = R"(  for (int pass = @FIRST@; pass <= @LAST@; ++pass) {
    for (int j0 = 0; j0 < n; j0 += 64) {
      const int nt = n - j0 < 64 ? n - j0 : 64;
      for (int jj = warp; jj < nt; jj += @B@ / MOE_WARP_SIZE) {
        const float *kr = K + static_cast<long long>(j0 + jj) * @KW@;
        float s = 0.0f;
        for (int d = lane; d < @DQ@; d += MOE_WARP_SIZE) s += qs[d] * kr[d];
        s = moe_warp_sum(s);
        float e = 0.0f;
        if (pass >= 2) {
          const float *vr = V + static_cast<long long>(j0 + jj) * @VW@;
          for (int d = lane; d < @DV@; d += MOE_WARP_SIZE) e += dos[d] * vr[d];
          e = moe_warp_sum(e);
        }
        if (lane == 0) {
          ps[jj] = __fmul_rn(s, @SCALE@);
          pd[jj] = e;
        }
      }
      __syncthreads();
@PASS@      __syncthreads();
    }
@AFTER@  }
)";
  auto values = attentionGradValues(a, B);
  // Pass 0: the peak; 1: the sum, then (few values live: the division's
  // slow path spills otherwise) 1 / sum.
  std::string statsBody =
      subst(head, values) +
      subst(subst(tiles, {{"PASS", R"(      if (pass == 0) {
        for (int jj = 0; jj < nt; ++jj) peak = fmaxf(peak, ps[jj]);
      } else {
        for (int jj = 0; jj < nt; ++jj) sum += static_cast<double>(expf(ps[jj] - peak));
      }
)"},
                            {"AFTER", ""}}),
            values);
  statsBody = subst(statsBody, {{"FIRST", "0"}, {"LAST", "1"}});
  statsBody.insert(statsBody.find("  for (int pass"), "  float peak = -INFINITY;\n  double sum = 0.0;\n");
  statsBody += R"(  if (threadIdx.x == 0) {
    st[0] = peak;
    st[1] = static_cast<float>(1.0 / sum);
  }
)";
  std::vector<Param> params = {{"const float *__restrict__ dout", r.dout},
                               {"const float *__restrict__ q", r.q},
                               {"const float *__restrict__ k", r.k},
                               {"const float *__restrict__ v", r.v},
                               {"const int *__restrict__ positions", "batch:position"},
                               {"float *__restrict__ stats", stats},
                               {"long long T", "T"}};
  const Array grid{dim(1), dim(0, 1, a.heads), dim(0, 1, 1)};
  launches.push_back(kernel(i, "attention_grad_stats", params, statsBody, grid, B));
  // Pass 2: rowDot = sum p dP (f64); 3: dQ = sum dS K.
  std::string qBody =
      subst(head, values) +
      subst(subst(tiles, {{"PASS", R"(      if (pass == 2) {
        for (int jj = 0; jj < nt; ++jj)
          dot += static_cast<double>(__fmul_rn(expf(ps[jj] - peak), inverse)) * pd[jj];
      } else {
#pragma unroll
        for (int c = 0; c < @NQ@; ++c) {
          const int d = threadIdx.x + c * @B@;
          if (d < @DQ@) {
            float a = acc[c];
            for (int jj = 0; jj < nt; ++jj) {
              const float p = __fmul_rn(expf(ps[jj] - peak), inverse);
              const float ds = __fmul_rn(__fmul_rn(p, pd[jj] - rowDot), @SCALE@);
              a += ds * K[static_cast<long long>(j0 + jj) * @KW@ + d];
            }
            acc[c] = a;
          }
        }
      }
)"},
                            {"AFTER", "    if (pass == 2) rowDot = static_cast<float>(dot);\n"}}),
            values);
  qBody.insert(qBody.find("  for (int pass"), subst(R"(  const float peak = st[0], inverse = st[1];
  float rowDot = 0.0f;
  double dot = 0.0;
  float acc[@NQ@];
#pragma unroll
  for (int c = 0; c < @NQ@; ++c) acc[c] = 0.0f;
)",
                                                          values));
  qBody = subst(qBody, {{"FIRST", "2"}, {"LAST", "3"}});
  qBody += subst(R"(#pragma unroll
  for (int c = 0; c < @NQ@; ++c) {
    const int d = threadIdx.x + c * @B@;
    if (d < @DQ@) dq[t * @QW@ + h * @DQ@ + d] = acc[c];
  }
  if (threadIdx.x == 0) st[2] = rowDot;
)",
                 values);
  params.insert(params.begin() + 5, {"float *__restrict__ dq", r.dq});
  launches.push_back(kernel(i, "attention_grad_q", params, qBody, grid, B));
}

Object Emitter::attendGradKV(int64_t i, const AttentionGradRefs &r, const std::string &stats) {
  const AttentionGradShape &a = r.shape;
  const int64_t B = 128;
  std::string body = subst(R"(  __shared__ float ks[@DQ@];
  __shared__ float vs[@DV@];
  __shared__ float red[32];
  const long long j = blockIdx.x;
  const int g = blockIdx.y;
  if (j >= T) return;
  for (int d = threadIdx.x; d < @DQ@; d += @B@) ks[d] = k[j * @KW@ + g * @DQ@ + d];
  for (int d = threadIdx.x; d < @DV@; d += @B@) vs[d] = v[j * @VW@ + g * @DV@ + d];
  __syncthreads();
  const long long posj = positions[j];
  const int seqj = seq[j];
  float accK[@NQ@], accV[@NV@];
#pragma unroll
  for (int c = 0; c < @NQ@; ++c) accK[c] = 0.0f;
#pragma unroll
  for (int c = 0; c < @NV@; ++c) accV[c] = 0.0f;
  for (int h = g * @GROUP@; h < (g + 1) * @GROUP@; ++h) {
    for (long long i = j; i < T && seq[i] == seqj; ++i) {
      if (@WINDOW@ > 0 && positions[i] - posj >= @WINDOW@) break;
      const float *qi = q + i * @QW@ + h * @DQ@;
      const float *doi = dout + i * @OW@ + h * @DV@;
      float s = 0.0f, e = 0.0f;
      for (int d = threadIdx.x; d < @DQ@; d += @B@) s += qi[d] * ks[d];
      for (int d = threadIdx.x; d < @DV@; d += @B@) e += doi[d] * vs[d];
      s = moe_block_sum(s, red, @B@);
      e = moe_block_sum(e, red, @B@);
      const float *st = stats + (i * @HEADS@ + h) * 3;
      const float p = __fmul_rn(expf(__fmul_rn(s, @SCALE@) - st[0]), st[1]);
      const float ds = __fmul_rn(__fmul_rn(p, e - st[2]), @SCALE@);
#pragma unroll
      for (int c = 0; c < @NQ@; ++c) {
        const int d = threadIdx.x + c * @B@;
        if (d < @DQ@) accK[c] += ds * qi[d];
      }
#pragma unroll
      for (int c = 0; c < @NV@; ++c) {
        const int d = threadIdx.x + c * @B@;
        if (d < @DV@) accV[c] += p * doi[d];
      }
    }
  }
#pragma unroll
  for (int c = 0; c < @NQ@; ++c) {
    const int d = threadIdx.x + c * @B@;
    if (d < @DQ@) dk[j * @KW@ + g * @DQ@ + d] = accK[c];
  }
#pragma unroll
  for (int c = 0; c < @NV@; ++c) {
    const int d = threadIdx.x + c * @B@;
    if (d < @DV@) dv[j * @VW@ + g * @DV@ + d] = accV[c];
  }
)",
                           attentionGradValues(a, B));
  return kernel(i, "attention_grad_kv",
                {{"const float *__restrict__ dout", r.dout},
                 {"const float *__restrict__ q", r.q},
                 {"const float *__restrict__ k", r.k},
                 {"const float *__restrict__ v", r.v},
                 {"const int *__restrict__ seq", "batch:sequence"},
                 {"const int *__restrict__ positions", "batch:position"},
                 {"const float *__restrict__ stats", stats},
                 {"float *__restrict__ dk", r.dk},
                 {"float *__restrict__ dv", r.dv},
                 {"long long T", "T"}},
                body, Array{dim(1), dim(0, 1, a.kvHeads), dim(0, 1, 1)}, B);
}

llvm::Error Emitter::lowerAttentionGrad(const Step &s, Array &launches, std::string &) {
  const Constants &c = s.constants;
  AttentionGradShape a{c.integer("heads"), c.integer("kv_heads"), 0, 0, c.number("scale"),
                       c.integerOr("sliding_window", 0)};
  if (llvm::Error e = constantsRead(s))
    return e;
  if (a.heads <= 0 || a.kvHeads <= 0 || a.heads % a.kvHeads || width(s.in[1]) % a.heads ||
      width(s.in[3]) % a.kvHeads)
    return stepError(s, llvm::formatv("{0} heads do not share {1} KV heads of the query, key "
                                      "and value widths",
                                      a.heads, a.kvHeads));
  a.dq = width(s.in[1]) / a.heads;
  a.dv = width(s.in[3]) / a.kvHeads;
  if (width(s.in[2]) != a.kvHeads * a.dq || width(s.in[0]) != a.heads * a.dv)
    return stepError(s, "the key or dO width does not fit the heads");
  AttentionGradRefs r{a,           buf(s.in[0]),  buf(s.in[1]),  buf(s.in[2]),
                      buf(s.in[3]), buf(s.out[0]), buf(s.out[1]), buf(s.out[2])};
  const std::string stats = addScratch(maxTokens, 3 * a.heads);
  attendGradQ(s.index, r, stats, launches);
  launches.push_back(attendGradKV(s.index, r, stats));
  return llvm::Error::success();
}

/// mla_attention_grad: the forward's operands of attention again (the
/// query's and key_rope's rotary parts rotated, the per-head keys [kv_h[:n],
/// rope(key_rope)] and values kv_h[n:]), attention's gradient kernels on
/// them (one KV head per head), the query's rotary part rotated back, and
/// the keys' and values' gradients put back into kv's layout, key_rope's
/// summed over the heads (in head order) and rotated back, as
/// cpu::mlaAttentionGrad.
llvm::Error Emitter::lowerMlaAttentionGrad(const Step &s, Array &launches, std::string &) {
  const Constants &a = s.constants;
  const std::vector<int64_t> &in = s.in;
  const int64_t H = a.integer("heads"), r = width(in[3]);
  const Constants ropeAttr = a.object("rope");
  if (llvm::Error e = constantsRead(s))
    return e;
  if (H <= 0 || width(in[1]) % H || width(in[2]) % H || width(in[1]) / H <= r ||
      ropeAttr.integer("rotary_dim") != r)
    return stepError(s, llvm::formatv("{0} heads do not split query {1} and kv {2} with a "
                                      "rotary part of {3}",
                                      H, width(in[1]), width(in[2]), r));
  const int64_t nope = width(in[1]) / H - r, vdim = width(in[2]) / H - nope, qk = nope + r;
  const std::string positions = buf(in[4]);
  const std::string q = addScratch(maxTokens, H * qk), kr = addScratch(maxTokens, r),
                    keys = addScratch(maxTokens, H * qk), values = addScratch(maxTokens, H * vdim),
                    dkeys = addScratch(maxTokens, H * qk),
                    dvalues = addScratch(maxTokens, H * vdim);
  launches.push_back(
      rope(s.index, buf(in[1]), q, positions, H * qk, r, qk, nope, ropeAttr, "mla_rope_q"));
  launches.push_back(rope(s.index, buf(in[3]), kr, positions, r, r, r, 0, ropeAttr, "mla_rope_k"));
  const std::map<std::string, std::string> dims = {
      {"H", str(H)}, {"QK", str(qk)}, {"VD", str(vdim)}, {"NOPE", str(nope)}, {"R", str(r)}};
  launches.push_back(kernel(s.index, "mla_grad_operands",
                            {{"const float *__restrict__ kv", buf(in[2])},
                             {"const float *__restrict__ keyRope", kr},
                             {"float *__restrict__ keys", keys},
                             {"float *__restrict__ values", values},
                             {"long long T", "T"}},
                            subst(R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  for (int i = threadIdx.x; i < @H@ * @QK@; i += 128) {
    const int h = i / @QK@, c = i % @QK@;
    keys[t * @H@ * @QK@ + i] =
        c < @NOPE@ ? kv[(t * @H@ + h) * (@NOPE@ + @VD@) + c] : keyRope[t * @R@ + (c - @NOPE@)];
  }
  for (int i = threadIdx.x; i < @H@ * @VD@; i += 128) {
    const int h = i / @VD@, c = i % @VD@;
    values[t * @H@ * @VD@ + i] = kv[(t * @H@ + h) * (@NOPE@ + @VD@) + @NOPE@ + c];
  }
)",
                                  dims),
                            grid1(dim(1)), 128));
  AttentionGradRefs refs{{H, H, qk, vdim, a.number("scale"), 0},
                         buf(in[0]),
                         q,
                         keys,
                         values,
                         buf(s.out[0]),
                         dkeys,
                         dvalues};
  const std::string stats = addScratch(maxTokens, 3 * H);
  attendGradQ(s.index, refs, stats, launches);
  launches.push_back(attendGradKV(s.index, refs, stats));
  launches.push_back(rope(s.index, buf(s.out[0]), buf(s.out[0]), positions, H * qk, r, qk, nope,
                          ropeAttr, "mla_rope_q_grad", /*transposed=*/true));
  launches.push_back(kernel(s.index, "mla_grad_kv",
                            {{"const float *__restrict__ dkeys", dkeys},
                             {"const float *__restrict__ dvalues", dvalues},
                             {"float *__restrict__ dkv", buf(s.out[1])},
                             {"float *__restrict__ dkeyRope", buf(s.out[2])},
                             {"long long T", "T"}},
                            subst(R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  for (int i = threadIdx.x; i < @H@ * (@NOPE@ + @VD@); i += 128) {
    const int h = i / (@NOPE@ + @VD@), c = i % (@NOPE@ + @VD@);
    dkv[t * @H@ * (@NOPE@ + @VD@) + i] = c < @NOPE@ ? dkeys[(t * @H@ + h) * @QK@ + c]
                                                    : dvalues[(t * @H@ + h) * @VD@ + c - @NOPE@];
  }
  for (int c = threadIdx.x; c < @R@; c += 128) {
    float sum = 0.0f;
    for (int h = 0; h < @H@; ++h) sum += dkeys[(t * @H@ + h) * @QK@ + @NOPE@ + c];
    dkeyRope[t * @R@ + c] = sum;
  }
)",
                                  dims),
                            grid1(dim(1)), 128));
  launches.push_back(rope(s.index, buf(s.out[2]), buf(s.out[2]), positions, r, r, r, 0, ropeAttr,
                          "mla_rope_k_grad", /*transposed=*/true));
  return llvm::Error::success();
}

} // namespace moe::cuda::detail
