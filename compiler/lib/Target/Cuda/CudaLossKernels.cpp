//===- CudaLossKernels.cpp - the training loss and its first gradients -*- C++ -*-===//
//
// Step lowerings and kernel builders of the CUDA emitter (Emitter.h) for a
// training program's loss (moec compile --train, docs/training.md):
// cross_entropy, lm_loss, cross_entropy_grad and embedding_grad. They
// compute as the CPU kernels (runtime/src/cpu/Loss.cpp, Gradients.cpp) do:
// log-sum-exp and the loss terms in double, sums in row order (one thread
// adds the rows' terms), so that the step's values do not depend on the
// grid.
//
//===----------------------------------------------------------------------===//
#include "Emitter.h"

namespace moe::cuda::detail {

namespace {

/// A block of 256 threads over `row`'s first V values: their f32 peak and
/// sum(exp(v - peak)) in f64, as cpu::crossEntropy (shared `red`, `redd`).
const char *kRowLogSumExp = R"(  float peak = -INFINITY;
  for (int v = threadIdx.x; v < @V@; v += 256) peak = fmaxf(peak, row[v]);
  peak = moe_block_max(peak, red, 256);
  double sum = 0.0;
  for (int v = threadIdx.x; v < @V@; v += 256)
    sum += exp(static_cast<double>(row[v]) - static_cast<double>(peak));
  sum = moe_block_sum_d(sum, redd, 256);
)";

} // namespace

/// cross_entropy: per row (one block) the term logsumexp(logits) -
/// logits[label] in double (ignored rows, label -100, give 0) into scratch;
/// then one thread adds the terms in row order: out = [sum, counted rows].
llvm::Error Emitter::lowerCrossEntropy(const Step &s, Array &launches, std::string &) {
  const int64_t W = width(s.in[0]), V = s.constants.integer("vocab");
  if (llvm::Error e = constantsRead(s))
    return e;
  if (V < 1 || V > W)
    return stepError(s, llvm::formatv("vocab {0} is not in [1, {1}]", V, W));
  const std::string terms = addScratch(maxTokens, 2); // one double per row
  std::string rowBody = subst(R"(  __shared__ float red[32];
  __shared__ double redd[32];
  const long long t = blockIdx.x;
  if (t >= T) return;
  const int label = labels[t];
  if (label < 0 || label >= @V@) {
    if (threadIdx.x == 0) terms[t] = 0.0;
    return;
  }
  const float *row = logits + t * @W@;
@LSE@  if (threadIdx.x == 0)
    terms[t] = static_cast<double>(peak) + log(sum) - static_cast<double>(row[label]);
)",
                              {{"LSE", kRowLogSumExp}, {"V", str(V)}, {"W", str(W)}});
  launches.push_back(kernel(s.index, "cross_entropy_rows",
                            {{"const float *__restrict__ logits", buf(s.in[0])},
                             {"const int *__restrict__ labels", buf(s.in[1])},
                             {"double *__restrict__ terms", terms},
                             {"long long T", "T"}},
                            rowBody, grid1(dim(1)), 256));
  std::string sumBody = R"(  if (threadIdx.x != 0) return;
  double sum = 0.0;
  long long counted = 0;
  for (long long t = 0; t < T; ++t) {
    sum += terms[t];
    counted += labels[t] != -100;
  }
  out[0] = static_cast<float>(sum);
  out[1] = static_cast<float>(counted);
)";
  launches.push_back(kernel(s.index, "cross_entropy_sum",
                            {{"const double *__restrict__ terms", terms},
                             {"const int *__restrict__ labels", buf(s.in[1])},
                             {"float *__restrict__ out", buf(s.out[0])},
                             {"long long T", "T"}},
                            sumBody, grid1(dim(0, 1, 1)), target.warpSize));
  return llvm::Error::success();
}

/// lm_loss: [loss, ce, aux, z] from the cross-entropy's (sum, rows) and each
/// MoE layer's router statistics, by one thread, as cpu::lmLoss.
llvm::Error Emitter::lowerLmLoss(const Step &s, Array &launches, std::string &) {
  const double auxCoef = s.constants.number("aux_coef"), zCoef = s.constants.number("z_coef");
  const int64_t sequences = s.constants.integerOr("sequences", 0);
  const int64_t layers = static_cast<int64_t>(s.in.size()) - 1;
  const int64_t E = layers > 0 ? width(s.in[1]) : 0;
  std::vector<Param> params = {{"const float *__restrict__ ce", buf(s.in[0])}};
  std::string statsList;
  for (int64_t l = 0; l < layers; ++l) {
    params.push_back({"const float *__restrict__ stats" + str(l), buf(s.in[l + 1])});
    statsList += (l ? ", stats" : "stats") + str(l);
  }
  params.push_back({"float *__restrict__ out", buf(s.out[0])});
  std::string body = subst(R"(  if (threadIdx.x != 0) return;
  const double meanCe = ce[1] > 0 ? static_cast<double>(ce[0]) / ce[1] : 0.0;
  double aux = 0.0, z = 0.0, rows = 0.0;
  const int layers = @LAYERS@;
#if @LAYERS@ > 0
  const float *stats[@LAYERS@] = {@LIST@};
  double probs[@E@], counts[@E@];
  for (int e = 0; e < @E@; ++e) { probs[e] = 0.0; counts[e] = 0.0; }
  for (int l = 0; l < layers; ++l) {
    const float *st = stats[l];
    const double tokens = st[2 * @E@ + 1];
    for (int e = 0; e < @E@; ++e) {
      probs[e] += st[e];
      counts[e] += st[@E@ + e];
    }
    if (tokens > 0) z += st[2 * @E@] / tokens;
    rows += tokens;
  }
  if (@SEQUENCES@ > 0 && @AUX@ > 0) {
    for (int l = 0; l < layers; ++l) {
      const float *st = stats[l];
      const double L = st[2 * @E@ + 1] / static_cast<double>(@SEQUENCES@);
      const double k = st[2 * @E@ + 2];
      if (L <= 0 || k <= 0) continue;
      double layer = 0.0;
      for (int i = 0; i < @SEQUENCES@ * @E@; ++i)
        layer += (st[(3 + @SEQUENCES@) * @E@ + i] * @E@ / (L * k)) * (st[3 * @E@ + i] / L);
      aux += layer / static_cast<double>(@SEQUENCES@);
    }
  } else if (rows > 0 && @AUX@ > 0) {
    for (int e = 0; e < @E@; ++e) aux += (counts[e] / rows) * (probs[e] / rows);
    aux *= static_cast<double>(@E@);
  }
#endif
  out[0] = static_cast<float>(meanCe + @AUX@ * aux + @Z@ * z);
  out[1] = static_cast<float>(meanCe);
  out[2] = static_cast<float>(aux);
  out[3] = static_cast<float>(z);
)",
                           {{"LAYERS", str(layers)},
                            {"LIST", statsList},
                            {"E", str(std::max<int64_t>(E, 1))},
                            {"SEQUENCES", str(sequences)},
                            {"AUX", doubleLit(auxCoef)},
                            {"Z", doubleLit(zCoef)}});
  launches.push_back(kernel(s.index, "lm_loss", params, body, grid1(dim(0, 1, 1)),
                            target.warpSize));
  return llvm::Error::success();
}

/// cross_entropy_grad: per row (one block), (softmax - onehot(label)) / n
/// with n the counted rows (the cross-entropy's second value); ignored
/// rows and the columns past the vocabulary get 0.
llvm::Error Emitter::lowerCrossEntropyGrad(const Step &s, Array &launches, std::string &) {
  const int64_t W = width(s.in[0]), V = s.constants.integer("vocab");
  if (llvm::Error e = constantsRead(s))
    return e;
  if (V < 1 || V > W)
    return stepError(s, llvm::formatv("vocab {0} is not in [1, {1}]", V, W));
  std::string body = subst(R"(  __shared__ float red[32];
  __shared__ double redd[32];
  const long long t = blockIdx.x;
  if (t >= T) return;
  const float *row = logits + t * @W@;
  float *o = out + t * @W@;
  const int label = labels[t];
  if (label < 0 || label >= @V@) {
    for (int v = threadIdx.x; v < @W@; v += 256) o[v] = 0.0f;
    return;
  }
  const double scale = ce[1] > 0 ? 1.0 / ce[1] : 0.0;
@LSE@  const double inv = scale / sum; // one division: its slow path would spill
  for (int v = threadIdx.x; v < @W@; v += 256) {
    float g = v < @V@ ? static_cast<float>(
        exp(static_cast<double>(row[v]) - static_cast<double>(peak)) * inv) : 0.0f;
    if (v == label) g -= static_cast<float>(scale);
    o[v] = g;
  }
)",
                           {{"LSE", kRowLogSumExp}, {"V", str(V)}, {"W", str(W)}});
  launches.push_back(kernel(s.index, "cross_entropy_grad",
                            {{"const float *__restrict__ logits", buf(s.in[0])},
                             {"const int *__restrict__ labels", buf(s.in[1])},
                             {"const float *__restrict__ ce", buf(s.in[2])},
                             {"float *__restrict__ out", buf(s.out[0])},
                             {"long long T", "T"}},
                            body, grid1(dim(1)), 256));
  return llvm::Error::success();
}

/// embedding_grad: the table's gradient [V, H] is zeroed, then the block of
/// the first token of each id adds the rows of every token with that id in
/// token order (no atomics: the same bits as the CPU's sum); the
/// padding_idx row (a constant when the model has one) keeps 0.
llvm::Error Emitter::lowerEmbeddingGrad(const Step &s, Array &launches, std::string &) {
  const int64_t H = width(s.in[0]), V = rows(s.out[0]);
  if (width(s.out[0]) != H)
    return stepError(s, "the table's gradient is not as wide as dy");
  const int64_t pad = s.constants.integerOr("padding_idx", -1);
  launches.push_back(kernel(s.index, "zero_rows",
                            {{"float *__restrict__ out", buf(s.out[0])}},
                            subst(R"(  const long long i = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;
  if (i < @N@LL) out[i] = 0.0f;
)",
                                  {{"N", str(V * H)}}),
                            grid1(dim(0, 1, (V * H + 255) / 256)), 256));
  std::string body = subst(R"(  const long long t = blockIdx.x;
  if (t >= T) return;
  const int id = ids[t];
  if (id < 0 || id >= @V@ || id == @PAD@) return;
  for (long long u = 0; u < t; ++u)
    if (ids[u] == id) return; // an earlier token's block writes the row
  float *row = out + static_cast<long long>(id) * @H@;
  for (int c = threadIdx.x; c < @H@; c += 128) {
    float sum = 0.0f;
    for (long long u = t; u < T; ++u)
      if (ids[u] == id) sum += dy[u * @H@ + c];
    row[c] = sum;
  }
)",
                           {{"V", str(V)}, {"H", str(H)}, {"PAD", str(pad)}});
  launches.push_back(kernel(s.index, "embedding_grad",
                            {{"const float *__restrict__ dy", buf(s.in[0])},
                             {"const int *__restrict__ ids", buf(s.in[1])},
                             {"float *__restrict__ out", buf(s.out[0])},
                             {"long long T", "T"}},
                            body, grid1(dim(1)), 128));
  return llvm::Error::success();
}

} // namespace moe::cuda::detail
