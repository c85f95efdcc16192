//===- CudaDenseKernels.cpp - linear, dense MLP, split, elementwise -*- C++ -*-===//
//
// Step lowerings of the CUDA emitter (Emitter.h) for dense layers (linear
// and the LM head, the gated MLP: cuBLAS GEMMs with their bias, row-gather
// and activation kernels), column splits and concats, and elementwise ops
// (add, sigmoid gate).
//
//===----------------------------------------------------------------------===//
#include "Emitter.h"

namespace moe::cuda::detail {

llvm::Error Emitter::lowerLinear(const Step &s, Array &launches, std::string &rowsName) {
  if (llvm::Error e = checkMatrix(s, 0))
    return e;
  std::vector<int64_t> sh = shape(s.weights[0]);
  std::string x = buf(s.in[0]), m = "T";
  if (s.constants.booleanOr("head", false)) {
    // The LM head: only the logit rows (batch.logit_rows, R of them).
    x = addScratch(maxTokens, sh[1]);
    std::string body = subst(R"(  const long long r = blockIdx.x;
  if (r >= R) return;
  moe_copy_row(rows + r * @W@, x + static_cast<long long>(logitRows[r]) * @W@, @W@, threadIdx.x, 128, @V4@);
)", {{"W", str(sh[1])}, {"V4", sh[1] % 4 == 0 ? "true" : "false"}});
    launches.push_back(kernel(s.index, "head_rows",
                              {{"const float *__restrict__ x", buf(s.in[0])},
                               {"const int *__restrict__ logitRows", "batch:logit_rows"},
                               {"float *__restrict__ rows", x},
                               {"long long R", "R"}},
                              body, grid1(dim(1)), 128));
    launches.back().getAsObject()->try_emplace("rows", "R");
    m = "R";
    rowsName = "R";
  }
  launches.push_back(
      gemm(x, wref(s.weights[0]), buf(s.out[0]), m, sh[0], sh[1], dtype(s.weights[0])));
  if (m == "R")
    launches.back().getAsObject()->try_emplace("rows", "R");
  if (s.weights.size() > 1) {
    WeightType bt = weightType(dtype(s.weights[1]));
    std::string body = subst(R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  for (int n = threadIdx.x; n < @N@; n += 128) y[t * @N@ + n] += @LOAD@(bias[n]);
)", {{"N", str(sh[0])}, {"LOAD", bt.load}});
    launches.push_back(kernel(s.index, "bias",
                              {{"float *__restrict__ y", buf(s.out[0])},
                               {"const " + bt.type + " *__restrict__ bias", wref(s.weights[1])},
                               {"long long T", m}},
                              body, grid1(dim(1)), 128));
    if (m == "R")
      launches.back().getAsObject()->try_emplace("rows", "R");
  }
  return llvm::Error::success();
}

llvm::Error Emitter::lowerMlp(const Step &s, Array &launches, std::string &) {
  const std::vector<int64_t> &w = s.weights;
  if (llvm::Error e = checkActivation(s))
    return e;
  for (size_t i = 0; i < 3; ++i)
    if (llvm::Error e = checkMatrix(s, i))
      return e;
  std::vector<int64_t> gs = shape(w[0]);
  const int64_t I = gs[0], H = gs[1];
  std::string g = addScratch(maxTokens, I), u = addScratch(maxTokens, I);
  const std::string x = buf(s.in[0]);
  launches.push_back(gemm(x, wref(w[0]), g, "T", I, H, dtype(w[0])));
  launches.push_back(gemm(x, wref(w[1]), u, "T", I, H, dtype(w[1])));
  launches.push_back(activation(s.index, g, u, "null", I, 0, s.constants.string("activation"),
                                "T", grid1(dim(I, 256))));
  launches.push_back(gemm(g, wref(w[2]), buf(s.out[0]), "T", H, I, dtype(w[2])));
  return llvm::Error::success();
}

llvm::Error Emitter::lowerSplit(const Step &s, Array &launches, std::string &) {
  const int64_t W = width(s.in[0]);
  const std::vector<int64_t> widths = s.constants.integers("widths");
  if (widths.size() != s.out.size())
    return stepError(s, llvm::formatv("{0} widths for {1} outputs", widths.size(), s.out.size()));
  int64_t offset = 0;
  for (size_t o = 0; o < s.out.size(); ++o) {
    const int64_t part = widths[o];
    std::string body = subst(R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  for (int c = threadIdx.x; c < @PART@; c += 128) out[t * @OW@ + c] = x[t * @W@ + @OFF@ + c];
)", {{"PART", str(part)}, {"OW", str(width(s.out[o]))}, {"W", str(W)}, {"OFF", str(offset)}});
    launches.push_back(kernel(s.index, "split" + str(int64_t(o)),
                              {{"const float *__restrict__ x", buf(s.in[0])},
                               {"float *__restrict__ out", buf(s.out[o])},
                               {"long long T", "T"}},
                              body, grid1(dim(1)), 128));
    offset += part;
  }
  return llvm::Error::success();
}

/// One copy kernel per part, into its columns of the output.
llvm::Error Emitter::lowerConcat(const Step &s, Array &launches, std::string &) {
  const int64_t W = width(s.out[0]);
  const std::vector<int64_t> widths = s.constants.integers("widths");
  if (widths.size() != s.in.size())
    return stepError(s, llvm::formatv("{0} widths for {1} inputs", widths.size(), s.in.size()));
  int64_t offset = 0;
  for (size_t p = 0; p < s.in.size(); ++p) {
    const int64_t part = widths[p];
    std::string body = subst(R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  for (int c = threadIdx.x; c < @PART@; c += 128) out[t * @W@ + @OFF@ + c] = x[t * @IW@ + c];
)", {{"PART", str(part)}, {"W", str(W)}, {"IW", str(width(s.in[p]))}, {"OFF", str(offset)}});
    launches.push_back(kernel(s.index, "concat" + str(int64_t(p)),
                              {{"const float *__restrict__ x", buf(s.in[p])},
                               {"float *__restrict__ out", buf(s.out[0])},
                               {"long long T", "T"}},
                              body, grid1(dim(1)), 128));
    offset += part;
  }
  return llvm::Error::success();
}

/// Elementwise over the step's rows, or over every row of static buffers
/// (weight gradients reaching one weight twice, such as a tied embedding).
llvm::Error Emitter::lowerAdd(const Step &s, Array &launches, std::string &) {
  const int64_t W = width(s.in[0]), staticRows = rows(s.out[0]);
  const bool perToken = staticRows == maxTokens;
  const bool v4 = W % 4 == 0;
  std::string body = subst(R"(  const long long i = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;
  if (i >= T * @N@) return;
  @OP@
)", {{"N", str(v4 ? W / 4 : W)},
     {"OP", v4 ? "const float4 x = reinterpret_cast<const float4 *>(a)[i], y = "
                 "reinterpret_cast<const float4 *>(b)[i];\n  reinterpret_cast<float4 *>(out)[i] "
                 "= make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);"
               : "out[i] = a[i] + b[i];"}});
  launches.push_back(kernel(s.index, "add",
                            {{"const float *a", buf(s.in[0])},
                             {"const float *b", buf(s.in[1])},
                             {"float *out", buf(s.out[0])},
                             {"long long T", perToken ? "T" : "const:" + str(staticRows)}},
                            body,
                            grid1(perToken ? dim(v4 ? W / 4 : W, 256)
                                           : dim(0, 1, ((v4 ? W / 4 : W) * staticRows + 255) / 256)),
                            256));
  return llvm::Error::success();
}

llvm::Error Emitter::lowerSigmoidGate(const Step &s, Array &launches, std::string &) {
  const int64_t W = width(s.in[0]);
  std::string body = subst(R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  const float s = 1.0f / (1.0f + expf(-gate[t]));
  for (int c = threadIdx.x; c < @W@; c += 128) out[t * @W@ + c] = x[t * @W@ + c] * s;
)", {{"W", str(W)}});
  launches.push_back(kernel(s.index, "sigmoid_gate",
                            {{"const float *x", buf(s.in[0])},
                             {"const float *__restrict__ gate", buf(s.in[1])},
                             {"float *out", buf(s.out[0])},
                             {"long long T", "T"}},
                            body, grid1(dim(1)), 128));
  return llvm::Error::success();
}

} // namespace moe::cuda::detail
