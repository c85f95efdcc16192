//===- CudaGradientKernels.cpp - the dense ops' backward kernels -*- C++ -*-===//
//
// Step lowerings and kernel builders of the CUDA emitter (Emitter.h) for the
// backward pass of the dense ops (moe-differentiate, docs/training.md):
// linear_grad, bias_grad, mlp_grad, rms_norm_grad, rope_grad,
// sigmoid_gate_grad and attention_grad. Every product is a GEMM of the
// table (cuBLAS; the general form: dx = dy W with W not transposed, dW =
// dy^T x summed over the step's rows); the kernels compute the elementwise
// parts and reductions as the CPU kernels (runtime/src/cpu/Gradients.cpp,
// AttentionGrad.cpp) round them, and sum over tokens in token order, never
// with atomics, so that a step's gradients do not depend on the grid.
//
//===----------------------------------------------------------------------===//
#include "Emitter.h"

namespace moe::cuda::detail {

namespace {

/// act(a) and act'(a) in double, as cpu::activationAndSlope (the body of a
/// device function of `a` setting `value` and `slope`).
std::string activationSlope(llvm::StringRef act) {
  if (act == "silu")
    return "const double s = 1.0 / (1.0 + exp(-a));\n"
           "    value = a * s;\n    slope = s * (1.0 + a * (1.0 - s));";
  if (act == "gelu")
    return "const double phi = 0.5 * (1.0 + erf(a / sqrt(2.0)));\n"
           "    value = a * phi;\n"
           "    slope = phi + a * exp(-0.5 * a * a) / sqrt(2.0 * 3.14159265358979323846);";
  if (act == "gelu_tanh")
    return "const double c = 0.7978845608028654, u = c * (a + 0.044715 * a * a * a);\n"
           "    const double th = tanh(u);\n    value = 0.5 * a * (1.0 + th);\n"
           "    slope = 0.5 * (1.0 + th) + 0.5 * a * (1.0 - th * th) * c * "
           "(1.0 + 3.0 * 0.044715 * a * a);";
  return "value = a > 0 ? a : 0.0;\n    slope = a > 0 ? 1.0 : 0.0;";
}

} // namespace

/// h = act(a) u over rows x I values (act in f64, as the CPU's gradient
/// kernels recompute it); with counts (non-"null"), row r of block r / C is
/// skipped when r % C >= counts[r / C].
Object Emitter::gatedProduct(int64_t i, std::string a, std::string u, std::string h, int64_t I,
                             int64_t C, std::string counts, llvm::StringRef act,
                             std::string rowsRef, Array grid) {
  std::string body = subst(R"(  const long long i = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;
  if (i >= rows * @I@) return;
  if (@COUNTED@ && (i / @I@) % @C@ >= counts[i / @I@ / @C@]) return;
  const double a = av[i];
  double value, slope;
  {
    @ACT@
  }
  (void)slope;
  h[i] = static_cast<float>(value * uv[i]);
)",
                           {{"I", str(I)},
                            {"C", str(std::max<int64_t>(C, 1))},
                            {"COUNTED", counts == "null" ? "0" : "1"},
                            {"ACT", activationSlope(act)}});
  return kernel(i, "gated_" + act.str(),
                {{"const float *__restrict__ av", a},
                 {"const float *__restrict__ uv", u},
                 {"float *__restrict__ h", h},
                 {"const int *__restrict__ counts", counts},
                 {"long long rows", rowsRef}},
                body, std::move(grid), 256);
}

/// [da, du] = [dh u act'(a), dh act(a)] (f64), rows as gatedProduct's.
Object Emitter::gatedProductGrad(int64_t i, std::string a, std::string u, std::string dh,
                                 std::string da, std::string du, int64_t I, int64_t C,
                                 std::string counts, llvm::StringRef act, std::string rowsRef,
                                 Array grid) {
  std::string body = subst(R"(  const long long i = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;
  if (i >= rows * @I@) return;
  if (@COUNTED@ && (i / @I@) % @C@ >= counts[i / @I@ / @C@]) return;
  const double a = av[i];
  double value, slope;
  {
    @ACT@
  }
  da[i] = static_cast<float>(static_cast<double>(dh[i]) * uv[i] * slope);
  du[i] = static_cast<float>(dh[i] * value);
)",
                           {{"I", str(I)},
                            {"C", str(std::max<int64_t>(C, 1))},
                            {"COUNTED", counts == "null" ? "0" : "1"},
                            {"ACT", activationSlope(act)}});
  return kernel(i, "gated_grad_" + act.str(),
                {{"const float *__restrict__ av", a},
                 {"const float *__restrict__ uv", u},
                 {"const float *__restrict__ dh", dh},
                 {"float *__restrict__ da", da},
                 {"float *__restrict__ du", du},
                 {"const int *__restrict__ counts", counts},
                 {"long long rows", rowsRef}},
                body, std::move(grid), 256);
}

/// dx = dy W (W [out, in] as stored), dW = dy^T x.
llvm::Error Emitter::lowerLinearGrad(const Step &s, Array &launches, std::string &) {
  if (llvm::Error e = checkMatrix(s, 0))
    return e;
  const std::vector<int64_t> sh = shape(s.weights[0]);
  const int64_t out = sh[0], in = sh[1];
  if (width(s.in[0]) != out || width(s.in[1]) != in || width(s.out[0]) != in)
    return stepError(s, "dy, x and dx do not fit the weight [out, in]");
  launches.push_back(
      gemmDx(buf(s.in[0]), wref(s.weights[0]), buf(s.out[0]), in, out, dtype(s.weights[0])));
  launches.push_back(gemmDw(buf(s.in[0]), buf(s.in[1]), buf(s.out[1]), out, in));
  return llvm::Error::success();
}

/// One thread per column: the sum over the step's rows in row order (f64).
llvm::Error Emitter::lowerBiasGrad(const Step &s, Array &launches, std::string &) {
  const int64_t W = width(s.in[0]);
  std::string body = subst(R"(  const long long c = static_cast<long long>(blockIdx.x) * 128 + threadIdx.x;
  if (c >= @W@) return;
  double sum = 0.0;
  for (long long t = 0; t < T; ++t) sum += dy[t * @W@ + c];
  out[c] = static_cast<float>(sum);
)",
                           {{"W", str(W)}});
  launches.push_back(kernel(s.index, "bias_grad",
                            {{"const float *__restrict__ dy", buf(s.in[0])},
                             {"float *__restrict__ out", buf(s.out[0])},
                             {"long long T", "T"}},
                            body, grid1(dim(0, 1, (W + 127) / 128)), 128));
  return llvm::Error::success();
}

/// The gated MLP's backward: a = x gate^T and u = x up^T recomputed, h =
/// act(a) u, dDown = dy^T h, dh = dy down, [da, du] = [dh u act'(a), dh
/// act(a)], dGate = da^T x, dUp = du^T x, dx = da gate + du up.
llvm::Error Emitter::lowerMlpGrad(const Step &s, Array &launches, std::string &) {
  for (size_t w = 0; w < 3; ++w)
    if (llvm::Error e = checkMatrix(s, w))
      return e;
  if (llvm::Error e = checkActivation(s))
    return e;
  const std::vector<int64_t> g = shape(s.weights[0]);
  const int64_t I = g[0], H = g[1];
  const std::string x = buf(s.in[1]), dy = buf(s.in[0]);
  const std::string a = addScratch(maxTokens, I), u = addScratch(maxTokens, I),
                    h = addScratch(maxTokens, I), dh = addScratch(maxTokens, I),
                    da = addScratch(maxTokens, I), du = addScratch(maxTokens, I);
  const auto &w = s.weights;
  launches.push_back(gemm(x, wref(w[0]), a, "T", I, H, dtype(w[0])));
  launches.push_back(gemm(x, wref(w[1]), u, "T", I, H, dtype(w[1])));
  const llvm::StringRef act = s.constants.string("activation");
  launches.push_back(gatedProduct(s.index, a, u, h, I, 1, "null", act, "T", grid1(dim(I, 256))));
  launches.push_back(gemmDw(dy, h, buf(s.out[3]), H, I));
  launches.push_back(gemmDx(dy, wref(w[2]), dh, I, H, dtype(w[2])));
  launches.push_back(
      gatedProductGrad(s.index, a, u, dh, da, du, I, 1, "null", act, "T", grid1(dim(I, 256))));
  launches.push_back(gemmDw(da, x, buf(s.out[1]), I, H));
  launches.push_back(gemmDw(du, x, buf(s.out[2]), I, H));
  launches.push_back(gemmDx(da, wref(w[0]), buf(s.out[0]), H, I, dtype(w[0])));
  launches.push_back(gemmDx(du, wref(w[1]), buf(s.out[0]), H, I, dtype(w[1]), true));
  return llvm::Error::success();
}

/// One block per (token, group) row: r = 1 / sqrt(mean(x^2) + eps), dx =
/// r (dy w - x r dot / n) with dot = sum dy w x r (f64), and the row's
/// share dy x r of dw into scratch (f64); then one thread per column adds
/// the rows' shares in row order.
llvm::Error Emitter::lowerRmsNormGrad(const Step &s, Array &launches, std::string &) {
  const int64_t W = width(s.in[0]), G = numel(s.weights[0]);
  if (G < 1 || W % G != 0 || width(s.in[1]) != W || width(s.out[0]) != W)
    return stepError(s, "dy, x and dx differ in width or the weight does not divide it");
  const int64_t groups = W / G, B = blockFor(G);
  const double eps = s.constants.number("eps");
  WeightType wt = weightType(dtype(s.weights[0]));
  const std::string shares = addScratch(maxTokens * groups, 2 * G); // f64
  std::string body = subst(R"(  __shared__ double redd[32];
  const long long row = blockIdx.x;
  if (row >= T * @NG@) return;
  const float *xg = x + row * @G@, *dyg = dy + row * @G@;
  float *dxg = dx + row * @G@;
  double squares = 0.0;
  for (int i = threadIdx.x; i < @G@; i += @B@) squares += static_cast<double>(xg[i]) * xg[i];
  squares = moe_block_sum_d(squares, redd, @B@);
  const double r = 1.0 / sqrt(squares / @G@ + @EPS@);
  double dot = 0.0;
  for (int i = threadIdx.x; i < @G@; i += @B@)
    dot += static_cast<double>(dyg[i]) * @LOAD@(w[i]) * xg[i] * r;
  dot = moe_block_sum_d(dot, redd, @B@);
  for (int i = threadIdx.x; i < @G@; i += @B@) {
    const float dw = __fmul_rn(dyg[i], @LOAD@(w[i]));
    dxg[i] = static_cast<float>(r * (dw - xg[i] * r * dot / @G@));
    shares[row * @G@ + i] = static_cast<double>(dyg[i]) * xg[i] * r;
  }
)",
                           {{"NG", str(groups)},
                            {"G", str(G)},
                            {"B", str(B)},
                            {"EPS", doubleLit(eps)},
                            {"LOAD", wt.load}});
  launches.push_back(kernel(s.index, "rms_norm_grad",
                            {{"const float *dy", buf(s.in[0])},
                             {"const float *x", buf(s.in[1])},
                             {"const " + wt.type + " *__restrict__ w", wref(s.weights[0])},
                             {"float *dx", buf(s.out[0])},
                             {"double *__restrict__ shares", shares},
                             {"long long T", "T"}},
                            body, grid1(dim(groups)), B));
  std::string sumBody = subst(R"(  const long long c = static_cast<long long>(blockIdx.x) * 128 + threadIdx.x;
  if (c >= @G@) return;
  double sum = 0.0;
  for (long long r = 0; r < T * @NG@; ++r) sum += shares[r * @G@ + c];
  dw[c] = static_cast<float>(sum);
)",
                              {{"G", str(G)}, {"NG", str(groups)}});
  launches.push_back(kernel(s.index, "rms_norm_grad_w",
                            {{"const double *__restrict__ shares", shares},
                             {"float *__restrict__ dw", buf(s.out[1])},
                             {"long long T", "T"}},
                            sumBody, grid1(dim(0, 1, (G + 127) / 128)), 128));
  return llvm::Error::success();
}

/// The transposed rotation of every head's rotary pairs (rope's kernel with
/// the sine negated).
llvm::Error Emitter::lowerRopeGrad(const Step &s, Array &launches, std::string &) {
  const int64_t W = width(s.in[0]), headDim = s.constants.integer("head_dim");
  Constants r = s.constants.object("rope");
  if (llvm::Error e = constantsRead(s))
    return e;
  if (headDim <= 0 || W % headDim != 0 || r.integer("rotary_dim") > headDim)
    return stepError(s, "head_dim does not divide the width or rotary_dim exceeds it");
  launches.push_back(rope(s.index, buf(s.in[0]), buf(s.out[0]), buf(s.in[1]), W, headDim, headDim,
                          0, r, "rope_grad", /*transposed=*/true));
  return llvm::Error::success();
}

/// dx = dy sigmoid(g), dg = (dy . x) s (1 - s), per token (one block).
llvm::Error Emitter::lowerSigmoidGateGrad(const Step &s, Array &launches, std::string &) {
  const int64_t W = width(s.in[0]);
  std::string body = subst(R"(  __shared__ double redd[32];
  const long long t = blockIdx.x;
  if (t >= T) return;
  const double sg = 1.0 / (1.0 + exp(-static_cast<double>(gate[t])));
  double dot = 0.0;
  for (int i = threadIdx.x; i < @W@; i += 128) {
    dot += static_cast<double>(dy[t * @W@ + i]) * x[t * @W@ + i];
    dx[t * @W@ + i] = static_cast<float>(dy[t * @W@ + i] * sg);
  }
  dot = moe_block_sum_d(dot, redd, 128);
  if (threadIdx.x == 0) dgate[t] = static_cast<float>(dot * sg * (1.0 - sg));
)",
                           {{"W", str(W)}});
  launches.push_back(kernel(s.index, "sigmoid_gate_grad",
                            {{"const float *dy", buf(s.in[0])},
                             {"const float *__restrict__ x", buf(s.in[1])},
                             {"const float *__restrict__ gate", buf(s.in[2])},
                             {"float *dx", buf(s.out[0])},
                             {"float *__restrict__ dgate", buf(s.out[1])},
                             {"long long T", "T"}},
                            body, grid1(dim(1)), 128));
  return llvm::Error::success();
}

} // namespace moe::cuda::detail
