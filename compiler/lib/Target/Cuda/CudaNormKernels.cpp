//===- CudaNormKernels.cpp - embedding and norms -*- C++ -*-===//
//
// Step lowerings and kernel builders of the CUDA emitter (Emitter.h):
// embedding and norms (rms_norm, layer_norm, and add_norm: a residual add
// fused with the norm that reads it).
//
//===----------------------------------------------------------------------===//
#include "Emitter.h"

namespace moe::cuda::detail {

Object Emitter::embedding(int64_t i, int64_t out, int64_t ids, int64_t table, bool shard) {
  std::vector<int64_t> sh = shape(table);
  const int64_t V = sh[0], W = sh[1];
  WeightType wt = weightType(dtype(table));
  std::string copy;
  if (W % 4 == 0 && wt.type == "float") {
    copy = "  moe_copy_row(dst, src, @W@, threadIdx.x, 128, true);\n";
  } else if (W % 4 == 0) {
    copy = "  const uint2 *s4 = reinterpret_cast<const uint2 *>(src);\n"
           "  float4 *d4 = reinterpret_cast<float4 *>(dst);\n"
           "  for (int i = threadIdx.x; i < @W@ / 4; i += 128) {\n"
           "    const uint2 v = s4[i];\n"
           "    d4[i] = make_float4(@LOAD@(static_cast<unsigned short>(v.x & 0xffffu)), "
           "@LOAD@(static_cast<unsigned short>(v.x >> 16)), "
           "@LOAD@(static_cast<unsigned short>(v.y & 0xffffu)), "
           "@LOAD@(static_cast<unsigned short>(v.y >> 16)));\n  }\n";
  } else {
    copy = "  for (int i = threadIdx.x; i < @W@; i += 128) dst[i] = @LOAD@(src[i]);\n";
  }
  std::string body = subst(R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  const long long id = static_cast<long long>(ids[t]) - (@SHARD@ ? tp * @V@LL : 0LL);
  float *dst = out + t * @W@;
  if (id < 0 || id >= @V@) {
    for (int i = threadIdx.x; i < @W@; i += 128) dst[i] = 0.0f;
    return;
  }
  const @WT@ *src = table + id * @W@LL;
)" + copy, {{"SHARD", shard ? "1" : "0"}, {"V", str(V)}, {"W", str(W)}, {"WT", wt.type},
          {"LOAD", wt.load}});
  return kernel(i, "embedding",
                {{"const int *__restrict__ ids", "buf:" + str(ids)},
                 {"const " + wt.type + " *__restrict__ table", "weight:" + str(table)},
                 {"float *__restrict__ out", "buf:" + str(out)},
                 {"long long T", "T"},
                 {"long long tp", "coord:tp"}},
                body, grid1(dim(1)), 128);
}

Object Emitter::rmsNorm(int64_t i, int64_t in, int64_t w, int64_t out, double eps) {
  const int64_t W = width(in), G = numel(w), groups = W / G;
  const int64_t B = blockFor(G);
  WeightType wt = weightType(dtype(w));
  std::string body = subst(R"(  __shared__ float red[32];
  const long long row = blockIdx.x;
  if (row >= T * @NG@) return;
  const float *src = x + row * @G@;
  float *dst = out + row * @G@;
  float s = 0.0f;
  for (int i = threadIdx.x; i < @G@; i += @B@) {
    const float v = src[i];
    s = __fadd_rn(s, __fmul_rn(v, v));
  }
  s = moe_block_sum(s, red, @B@);
  const float mean = s / static_cast<float>(@G@);
  const float rstd = 1.0f / sqrtf(mean + @EPS@);
  for (int i = threadIdx.x; i < @G@; i += @B@)
    dst[i] = __fmul_rn(@LOAD@(w[i]), __fmul_rn(src[i], rstd));
)", {{"NG", str(groups)}, {"G", str(G)}, {"B", str(B)}, {"EPS", floatLit(eps)}, {"LOAD", wt.load}});
  return kernel(i, "rms_norm",
                {{"const float *x", "buf:" + str(in)},
                 {"const " + wt.type + " *__restrict__ w", "weight:" + str(w)},
                 {"float *out", "buf:" + str(out)},
                 {"long long T", "T"}},
                body, grid1(dim(groups)), B);
}

Object Emitter::layerNorm(int64_t i, int64_t in, int64_t w, int64_t b, int64_t out, double eps) {
  const int64_t W = width(in), B = blockFor(W);
  WeightType wt = weightType(dtype(w));
  WeightType bt = b >= 0 ? weightType(dtype(b)) : wt;
  std::string body = subst(R"(  __shared__ float red[32];
  const long long t = blockIdx.x;
  if (t >= T) return;
  const float *src = x + t * @W@;
  float *dst = out + t * @W@;
  float s = 0.0f;
  for (int i = threadIdx.x; i < @W@; i += @B@) s += src[i];
  const float mean = moe_block_sum(s, red, @B@) / static_cast<float>(@W@);
  float q = 0.0f;
  for (int i = threadIdx.x; i < @W@; i += @B@) {
    const float d = src[i] - mean;
    q += d * d;
  }
  const float var = moe_block_sum(q, red, @B@) / static_cast<float>(@W@);
  const float rstd = static_cast<float>(1.0 / sqrt(static_cast<double>(var) + @EPSD@));
  for (int i = threadIdx.x; i < @W@; i += @B@)
    dst[i] = __fadd_rn(__fmul_rn(__fmul_rn(src[i] - mean, rstd), @LOAD@(w[i])), @BIAS@);
)", {{"W", str(W)}, {"B", str(B)}, {"EPSD", doubleLit(eps)}, {"LOAD", wt.load},
     {"BIAS", b >= 0 ? bt.load + "(bias[i])" : std::string("0.0f")}});
  std::vector<Param> params = {{"const float *x", "buf:" + str(in)},
                               {"const " + wt.type + " *__restrict__ w", "weight:" + str(w)}};
  params.push_back({"const " + bt.type + " *__restrict__ bias",
                    b >= 0 ? "weight:" + str(b) : std::string("null")});
  params.push_back({"float *out", "buf:" + str(out)});
  params.push_back({"long long T", "T"});
  return kernel(i, "layer_norm", params, body, grid1(dim(1)), B);
}

/// An add_norm step (i: sum = a + b and its rms_norm or layer_norm, as
/// moe-fuse-add-norm makes it). One block per (token, group) row, like
/// rms_norm's (layer_norm: per token): each thread reads its a and b values
/// once (float4 when the group width allows), keeps the sums in registers
/// (compile-time indexed, unrolled), writes them to `sum` unless the step's
/// two outputs are one buffer (nothing reads the sum: it is not stored), and
/// normalises them as the norm kernels do. Every read precedes the block
/// reduction's barrier and every thread writes only the elements it read, so
/// a, b, sum and out may alias (in-place add, norm output over an operand).
llvm::Error Emitter::lowerAddNorm(const Step &s, Array &launches, std::string &) {
  const Constants &attrs = s.constants;
  const llvm::StringRef norm = attrs.string("norm");
  const double eps = attrs.number("eps");
  if (llvm::Error e = constantsRead(s))
    return e;
  if (norm != "rms_norm" && norm != "layer_norm")
    return stepError(s, "norm '" + norm + "' is neither rms_norm nor layer_norm");
  const bool layer = norm == "layer_norm";
  const std::vector<int64_t> &in = s.in, &w = s.weights, &outs = s.out;
  const int64_t a = in[0], b = in[1], sum = outs[0];
  const std::vector<int64_t> out = {outs[1]};
  const int64_t W = width(sum), G = layer ? W : numel(w[0]), groups = W / G;
  const bool v4 = G % 4 == 0, storeSum = out[0] != sum;
  const int64_t NV = v4 ? G / 4 : G;
  int64_t B = blockFor(NV);
  if ((NV + B - 1) / B > 8)
    B = blockFor((NV + 7) / 8, 1024);
  const int64_t PER = (NV + B - 1) / B;
  // Each thread's elements: guarded unless the block covers the row exactly
  // (ptxas spilled the guarded loop at G = 6144 on sm_90: Mixtral-8x22B).
  const std::string guard = NV % B ? "    if (i < @NV@) {\n" : "    {\n";
  WeightType wt = weightType(dtype(w[0]));
  const int64_t bias = layer && w.size() > 1 ? w[1] : -1;
  WeightType bt = bias >= 0 ? weightType(dtype(bias)) : wt;
  const char *comps[4] = {"x", "y", "z", "w"};
  // Per-component code: @C@ is the component (v4) and @K@ its offset.
  auto each = [&](const std::string &code) {
    if (!v4)
      return subst(code, {{"C", ""}, {"K", "0"}, {"DOT", ""}});
    std::string all;
    for (int c = 0; c < 4; ++c)
      all += subst(code, {{"C", comps[c]}, {"K", str(c)}, {"DOT", "."}});
    return all;
  };
  std::string load =
      v4 ? "      const float4 x = reinterpret_cast<const float4 *>(a + base)[i], y = "
           "reinterpret_cast<const float4 *>(b + base)[i];\n"
           "      v[j] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);\n"
         : "      v[j] = a[base + i] + b[base + i];\n";
  std::string store = !storeSum ? ""
                      : v4      ? "      reinterpret_cast<float4 *>(sum + base)[i] = v[j];\n"
                                : "      sum[base + i] = v[j];\n";
  std::string element = v4 ? "4 * i + @K@" : "i";
  std::string reduce, normalise;
  if (!layer) {
    reduce = each("      s = __fadd_rn(s, __fmul_rn(v[j]@DOT@@C@, v[j]@DOT@@C@));\n");
    normalise = "  const float mean = moe_block_sum(s, red, @B@) / static_cast<float>(@G@);\n"
                "  const float rstd = 1.0f / sqrtf(mean + @EPS@);\n";
  } else {
    reduce = each("      s += v[j]@DOT@@C@;\n");
    normalise = "  const float mean = moe_block_sum(s, red, @B@) / static_cast<float>(@G@);\n"
                "  float q = 0.0f;\n#pragma unroll\n  for (int j = 0; j < @PER@; ++j) {\n"
                "    const int i = threadIdx.x + j * @B@;\n" + guard +
                each("      { const float d = v[j]@DOT@@C@ - mean; q += d * d; }\n") +
                "    }\n  }\n"
                "  const float var = moe_block_sum(q, red, @B@) / static_cast<float>(@G@);\n"
                "  const float rstd = static_cast<float>(1.0 / sqrt(static_cast<double>(var) + "
                "@EPSD@));\n";
  }
  std::string value =
      layer ? "__fadd_rn(__fmul_rn(__fmul_rn(v[j]@DOT@@C@ - mean, rstd), @LOAD@(w[" + element +
                  "])), " + (bias >= 0 ? bt.load + "(bias[" + element + "])" : "0.0f") + ")"
            : "__fmul_rn(@LOAD@(w[" + element + "]), __fmul_rn(v[j]@DOT@@C@, rstd))";
  std::string write =
      v4 ? "      reinterpret_cast<float4 *>(out + base)[i] = make_float4(" +
               subst(value, {{"C", "x"}, {"K", "0"}, {"DOT", "."}}) + ", " +
               subst(value, {{"C", "y"}, {"K", "1"}, {"DOT", "."}}) + ", " +
               subst(value, {{"C", "z"}, {"K", "2"}, {"DOT", "."}}) + ", " +
               subst(value, {{"C", "w"}, {"K", "3"}, {"DOT", "."}}) + ");\n"
         : "      out[base + i] = " + subst(value, {{"C", ""}, {"K", "0"}, {"DOT", ""}}) + ";\n";
  std::string body = subst(std::string(R"(  __shared__ float red[32];
  const long long row = blockIdx.x;
  if (row >= T * @NG@) return;
  const long long base = row * @G@;
  @VT@ v[@PER@];
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < @PER@; ++j) {
    const int i = threadIdx.x + j * @B@;
)") + guard + load + reduce + "    }\n  }\n" + normalise +
                               "#pragma unroll\n  for (int j = 0; j < @PER@; ++j) {\n"
                               "    const int i = threadIdx.x + j * @B@;\n" + guard +
                               store + write + "    }\n  }\n",
                           {{"NG", str(groups)}, {"G", str(G)}, {"B", str(B)}, {"NV", str(NV)},
                            {"PER", str(PER)}, {"VT", v4 ? "float4" : "float"},
                            {"EPS", floatLit(eps)}, {"EPSD", doubleLit(eps)}, {"LOAD", wt.load}});
  std::vector<Param> params = {{"const float *a", "buf:" + str(a)},
                               {"const float *b", "buf:" + str(b)},
                               {"const " + wt.type + " *__restrict__ w", "weight:" + str(w[0])}};
  if (layer)
    params.push_back({"const " + bt.type + " *__restrict__ bias",
                      bias >= 0 ? "weight:" + str(bias) : std::string("null")});
  if (storeSum)
    params.push_back({"float *sum", "buf:" + str(sum)});
  params.push_back({"float *out", "buf:" + str(out[0])});
  params.push_back({"long long T", "T"});
  launches.push_back(kernel(s.index, layer ? "add_layer_norm" : "add_rms_norm", params, body,
                            grid1(dim(groups)), B));
  return llvm::Error::success();
}

llvm::Error Emitter::lowerEmbedding(const Step &s, Array &launches, std::string &) {
  if (llvm::Error e = checkMatrix(s, 0))
    return e;
  launches.push_back(embedding(s.index, s.out[0], s.in[0], s.weights[0],
                               s.constants.booleanOr("vocab_shard", false)));
  return llvm::Error::success();
}

llvm::Error Emitter::lowerRmsNorm(const Step &s, Array &launches, std::string &) {
  // (With the rows' sums of squares: a part of rows tensor parallelism
  // splits, normalised by the whole row's mean.)
  if (s.in.size() == 2) {
    launches.push_back(rmsNormOfSquares(s.index, s.in[0], s.in[1], s.weights[0], s.out[0],
                                        s.constants.number("eps"),
                                        s.constants.integer("row_width")));
    return llvm::Error::success();
  }
  launches.push_back(
      rmsNorm(s.index, s.in[0], s.weights[0], s.out[0], s.constants.number("eps")));
  return llvm::Error::success();
}

/// rms_norm of a part of each row (row_width values in all): one block a
/// row, the mean from the whole row's sum of squares, as the CPU kernel
/// (the mean, + eps, 1 / sqrt in f32; w (x r)).
Object Emitter::rmsNormOfSquares(int64_t i, int64_t in, int64_t squares, int64_t w, int64_t out,
                                 double eps, int64_t rowWidth) {
  const int64_t W = width(in), B = blockFor(W);
  WeightType wt = weightType(dtype(w));
  std::string body = subst(R"(  const long long row = blockIdx.x;
  if (row >= T) return;
  const float mean = sq[row] / static_cast<float>(@RW@);
  const float rstd = 1.0f / sqrtf(mean + @EPS@);
  for (int i = threadIdx.x; i < @W@; i += @B@)
    out[row * @W@ + i] = __fmul_rn(@LOAD@(w[i]), __fmul_rn(x[row * @W@ + i], rstd));
)", {{"RW", str(rowWidth)}, {"W", str(W)}, {"B", str(B)}, {"EPS", floatLit(eps)},
     {"LOAD", wt.load}});
  return kernel(i, "rms_norm",
                {{"const float *x", "buf:" + str(in)},
                 {"const float *__restrict__ sq", "buf:" + str(squares)},
                 {"const " + wt.type + " *__restrict__ w", "weight:" + str(w)},
                 {"float *out", "buf:" + str(out)},
                 {"long long T", "T"}},
                body, grid1(dim(1)), B);
}

/// row_sum_squares: one block a row, its squares added (f32, as the CUDA
/// rms_norm adds them).
llvm::Error Emitter::lowerRowSumSquares(const Step &s, Array &launches, std::string &) {
  const int64_t in = s.in[0], out = s.out[0], W = width(in), B = blockFor(W);
  std::string body = subst(R"(  __shared__ float red[32];
  const long long row = blockIdx.x;
  if (row >= T) return;
  float s = 0.0f;
  for (int i = threadIdx.x; i < @W@; i += @B@) {
    const float v = x[row * @W@ + i];
    s = __fadd_rn(s, __fmul_rn(v, v));
  }
  s = moe_block_sum(s, red, @B@);
  if (threadIdx.x == 0) out[row] = s;
)", {{"W", str(W)}, {"B", str(B)}});
  launches.push_back(kernel(s.index, "row_sum_squares",
                            {{"const float *__restrict__ x", "buf:" + str(in)},
                             {"float *__restrict__ out", "buf:" + str(out)},
                             {"long long T", "T"}},
                            body, grid1(dim(1)), B));
  return llvm::Error::success();
}

llvm::Error Emitter::lowerLayerNorm(const Step &s, Array &launches, std::string &) {
  launches.push_back(layerNorm(s.index, s.in[0], s.weights[0],
                               s.weights.size() > 1 ? s.weights[1] : -1, s.out[0],
                               s.constants.number("eps")));
  return llvm::Error::success();
}

} // namespace moe::cuda::detail
