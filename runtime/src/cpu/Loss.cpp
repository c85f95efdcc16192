// The training loss's kernels (Kernels.h): cross-entropy over the vocabulary,
// each MoE layer's router statistics and the loss they make.
#include "GradientUtil.h"
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Kernels.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace moert::cpu {
namespace {

/// log(sum_i exp(x_i)) over n values: the f32 exponentials the gradient's
/// softmax takes (grad::expShifted), added in f64. (The scalar f64 exp of
/// every logit took 2% of a bench-moe training update; the loss's value
/// feeds no gradient.)
double logSumExp(const float *x, int64_t n) {
  const float peak = *std::max_element(x, x + n);
  float *values = grad::workspace(grad::kLogSumExp, static_cast<size_t>(n));
  return peak + std::log(grad::expShifted(x, n, peak, values));
}

constexpr int32_t kIgnoreIndex = -100;

} // namespace

void crossEntropy(const float *logits, int64_t tokens, int64_t width, int64_t vocab,
                  const int32_t *labels, float out[2]) {
  for (int64_t t = 0; t < tokens; ++t)
    if (labels[t] != kIgnoreIndex && (labels[t] < 0 || labels[t] >= vocab))
      inputError("cross_entropy: label {} of row {} is outside [0, {}) and not -100", labels[t],
                 t, vocab);
  // Per-row terms, then one sum in row order: the same bits at any thread
  // count.
  std::vector<double> terms(static_cast<size_t>(tokens), 0.0);
  parallelFor(
      tokens,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t)
          if (labels[t] != kIgnoreIndex) {
            const float *row = logits + t * width;
            terms[t] = logSumExp(row, vocab) - row[labels[t]];
          }
      },
      8);
  double sum = 0;
  int64_t counted = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    sum += terms[t];
    counted += labels[t] != kIgnoreIndex;
  }
  out[0] = static_cast<float>(sum);
  out[1] = static_cast<float>(counted);
}

VocabTotals vocabTotals(const float *stats, int64_t parts) {
  VocabTotals v;
  v.peak = -INFINITY;
  for (int64_t q = 0; q < parts; ++q)
    v.peak = std::max(v.peak, stats[4 * q]);
  for (int64_t q = 0; q < parts; ++q) {
    const float *p = stats + 4 * q;
    const double s = static_cast<double>(p[1]) + static_cast<double>(p[2]);
    if (s > 0)
      v.sum += s * std::exp(static_cast<double>(p[0]) - v.peak);
    v.target += p[3];
  }
  return v;
}

void vocabStats(const float *logits, int64_t tokens, int64_t width, int64_t real, int64_t first,
                const int32_t *labels, float *out) {
  parallelFor(tokens, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float *row = logits + t * width;
      float *o = out + 4 * t;
      const float peak = real > 0 ? *std::max_element(row, row + real) : -INFINITY;
      // (f64 exponentials: this sum also normalises the gradient of the
      // vocabulary-parallel cross-entropy, whose Mixtral runs follow one
      // rank's within 1e-6 only while they round as they do.)
      double sum = 0;
      for (int64_t c = 0; c < real; ++c)
        sum += std::exp(static_cast<double>(row[c]) - peak);
      o[0] = peak;
      o[1] = static_cast<float>(sum);
      o[2] = static_cast<float>(sum - static_cast<double>(o[1]));
      const int64_t label = labels[t] - first;
      o[3] = labels[t] != kIgnoreIndex && label >= 0 && label < real ? row[label] : 0.0f;
    }
  }, 8);
}

void crossEntropyOfStats(const float *stats, int64_t tokens, int64_t parts, int64_t vocab,
                         const int32_t *labels, float out[2]) {
  double sum = 0;
  int64_t counted = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    if (labels[t] == kIgnoreIndex)
      continue;
    if (labels[t] < 0 || labels[t] >= vocab)
      inputError("cross_entropy: label {} of row {} is outside [0, {}) and not -100", labels[t],
                 t, vocab);
    const VocabTotals v = vocabTotals(stats + 4 * parts * t, parts);
    sum += v.peak + std::log(v.sum) - v.target;
    ++counted;
  }
  out[0] = static_cast<float>(sum);
  out[1] = static_cast<float>(counted);
}

std::vector<double> sequenceTopKCounts(const float *logits, int64_t tokens, int64_t experts,
                                       int64_t topK, int64_t sequences) {
  if (sequences < 1 || tokens % sequences != 0)
    inputError("router statistics: {} tokens are not {} sequences of one length", tokens,
               sequences);
  const int64_t L = tokens / sequences;
  std::vector<double> counts(static_cast<size_t>(sequences * experts), 0.0), s(experts);
  std::vector<int64_t> order(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < experts; ++e)
      s[e] = 1 / (1 + std::exp(-static_cast<double>(logits[t * experts + e])));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + topK, order.end(),
                      [&](int64_t a, int64_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
    for (int64_t j = 0; j < topK; ++j)
      counts[(t / L) * experts + order[j]] += 1;
  }
  return counts;
}

void routerStats(const float *logits, int64_t tokens, int64_t experts, int64_t topK,
                 float *out, int64_t sequences) {
  std::vector<double> probs(experts, 0.0), counts(experts, 0.0);
  std::vector<double> p(experts);
  std::vector<int64_t> order(experts);
  double z = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const float *row = logits + t * experts;
    const double lse = logSumExp(row, experts);
    z += lse * lse;
    for (int64_t e = 0; e < experts; ++e) {
      p[e] = std::exp(static_cast<double>(row[e]) - lse);
      probs[e] += p[e];
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + topK, order.end(),
                      [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    for (int64_t j = 0; j < topK; ++j)
      counts[order[j]] += 1;
  }
  std::fill(out, out + 3 * experts, 0.0f);
  for (int64_t e = 0; e < experts; ++e) {
    out[e] = static_cast<float>(probs[e]);
    out[experts + e] = static_cast<float>(counts[e]);
  }
  out[2 * experts] = static_cast<float>(z);
  out[2 * experts + 1] = static_cast<float>(tokens);
  if (sequences <= 0)
    return;
  // DeepSeek-V3's per-sequence statistics: sum of s / sum(s), top-k counts.
  const std::vector<double> seqCounts =
      sequenceTopKCounts(logits, tokens, experts, topK, sequences);
  const int64_t L = tokens / sequences;
  out[2 * experts + 2] = static_cast<float>(topK);
  std::fill(out + 3 * experts, out + (3 + 2 * sequences) * experts, 0.0f);
  std::vector<double> sums(static_cast<size_t>(sequences * experts), 0.0), s(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    double total = 0;
    for (int64_t e = 0; e < experts; ++e)
      total += (s[e] = 1 / (1 + std::exp(-static_cast<double>(logits[t * experts + e]))));
    for (int64_t e = 0; e < experts; ++e)
      sums[(t / L) * experts + e] += s[e] / total;
  }
  for (int64_t i = 0; i < sequences * experts; ++i) {
    out[3 * experts + i] = static_cast<float>(sums[i]);
    out[(3 + sequences) * experts + i] = static_cast<float>(seqCounts[i]);
  }
}

void lmLoss(const float ce[2], const float *const *stats, int64_t layers, int64_t experts,
            double auxCoef, double zCoef, float out[4], int64_t sequences) {
  const double meanCe = ce[1] > 0 ? static_cast<double>(ce[0]) / ce[1] : 0.0;
  double aux = 0, z = 0, rows = 0;
  std::vector<double> probs(experts, 0.0), counts(experts, 0.0);
  for (int64_t l = 0; l < layers; ++l) {
    const float *s = stats[l];
    const double tokens = s[2 * experts + 1];
    for (int64_t e = 0; e < experts; ++e) {
      probs[e] += s[e];
      counts[e] += s[experts + e];
    }
    if (tokens > 0)
      z += s[2 * experts] / tokens;
    rows += tokens;
  }
  // No balancing loss asked (or none for the family): aux is 0, not the
  // value of a loss that is not trained.
  if (sequences > 0 && auxCoef > 0) {
    // Per layer (1/B) sum_b sum_e f_be P_be, f = C E / (L k), P = S' / L.
    for (int64_t l = 0; l < layers; ++l) {
      const float *s = stats[l];
      const double L = s[2 * experts + 1] / static_cast<double>(sequences);
      const double k = s[2 * experts + 2];
      if (L <= 0 || k <= 0)
        continue;
      double layer = 0;
      for (int64_t i = 0; i < sequences * experts; ++i)
        layer += (s[(3 + sequences) * experts + i] * experts / (L * k)) *
                 (s[3 * experts + i] / L);
      aux += layer / static_cast<double>(sequences);
    }
  } else if (rows > 0 && auxCoef > 0) {
    for (int64_t e = 0; e < experts; ++e)
      aux += (counts[e] / rows) * (probs[e] / rows);
    aux *= static_cast<double>(experts);
  }
  out[0] = static_cast<float>(meanCe + auxCoef * aux + zCoef * z);
  out[1] = static_cast<float>(meanCe);
  out[2] = static_cast<float>(aux);
  out[3] = static_cast<float>(z);
}

} // namespace moert::cpu
