// Expert routing (#moe.routing): scores, selection key, group limit, top-k,
// weights. Each step is the f32 arithmetic of the transformers router it
// stands for (Mixtral / Qwen2-MoE / Qwen3-MoE / OLMoE: softmax then top-k;
// DeepSeek-V2: group max; DeepSeek-V3: sigmoid, bias for the choice only,
// top-2-sum group scores, dropped groups masked to -inf, +1e-20, routed scaling).
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/cpu/Kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace moert::cpu {
namespace {

/// Softmax over n f32 values: max subtraction, exp, sum, division, as
/// torch's softmax(dtype=float32); exp is rounded once from double and the
/// sum accumulated in double (torch's vectorised f32 path is within an ulp).
void softmax(const float *in, int64_t n, float *out) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i)
    max = std::max(max, in[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(std::exp(static_cast<double>(in[i] - max)));
    sum += out[i];
  }
  const float total = static_cast<float>(sum);
  for (int64_t i = 0; i < n; ++i)
    out[i] = out[i] / total;
}

float sigmoid(float x) { return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x)))); }

/// Orders candidates by descending key, the lower index first on ties; NaN
/// keys rank last (they never win a comparison).
struct ByKey {
  const float *key;
  bool operator()(int32_t a, int32_t b) const {
    const float ka = std::isnan(key[a]) ? -std::numeric_limits<float>::infinity() : key[a];
    const float kb = std::isnan(key[b]) ? -std::numeric_limits<float>::infinity() : key[b];
    return ka > kb || (ka == kb && a < b);
  }
};

} // namespace

void route(const float *logits, int64_t tokens, int64_t numExperts,
           const TensorView *correctionBias, const RoutingParams &params, float *weights,
           int32_t *experts) {
  const int64_t E = numExperts, k = params.topK;
  if (E <= 0 || k <= 0 || k > E)
    inputError("router: top_k {} must lie in [1, {}]", k, E);
  if (params.numGroups < 1 || E % params.numGroups != 0)
    inputError("router: {} experts do not split into {} groups", E, params.numGroups);
  if (params.topkGroups < 1 || params.topkGroups > params.numGroups)
    inputError("router: topk_groups {} must lie in [1, {}]", params.topkGroups, params.numGroups);
  if (correctionBias && correctionBias->numel() != E)
    inputError("router: correction bias has {} values for {} experts", correctionBias->numel(), E);
  std::vector<float> bias;
  if (correctionBias) {
    bias.resize(E);
    for (int64_t e = 0; e < E; ++e)
      bias[e] = correctionBias->at(e);
  }
  const int64_t groups = params.numGroups, groupSize = E / groups;
  const bool softmaxOfSelected = params.topkOnLogits && !params.sigmoid;
  const float scaling = static_cast<float>(params.scalingFactor);

  parallelFor(tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> logit(E), score(E), key(E), groupScore(groups);
    std::vector<int32_t> order(std::max(E, groups));
    std::vector<char> kept(groups);
    std::vector<float> chosenLogits(k);
    for (int64_t t = begin; t < end; ++t) {
      // 1. Scores, from logits rounded to bf16 when the router computes in
      //    bf16 (transformers' gate linear then returns bf16; its softmax
      //    upcasts to f32).
      for (int64_t e = 0; e < E; ++e)
        logit[e] = params.computeBf16 ? roundBf16(logits[t * E + e]) : logits[t * E + e];
      if (params.sigmoid) {
        for (int64_t e = 0; e < E; ++e)
          score[e] = sigmoid(logit[e]);
      } else if (!softmaxOfSelected) {
        softmax(logit.data(), E, score.data());
      }
      // 2. Selection key; the bias (an f32 add) only ever enters the key.
      const std::vector<float> &base = params.topkOnLogits ? logit : score;
      for (int64_t e = 0; e < E; ++e)
        key[e] = bias.empty() ? base[e] : base[e] + bias[e];
      // 3. Group limit: keep the best topk_groups groups, set the other keys
      //    to -inf so that no expert of a dropped group is chosen (DeepSeek's
      //    inference code and transformers 5.x; 4.57's masked_fill(0.0) let
      //    a dropped expert outrank negative keys: docs/conformance.md).
      if (groups > 1) {
        for (int64_t g = 0; g < groups; ++g) {
          const float *gk = key.data() + g * groupSize;
          if (params.groupScoreMax || groupSize < 2) {
            groupScore[g] = *std::max_element(gk, gk + groupSize);
          } else {
            float first = -std::numeric_limits<float>::infinity(), second = first;
            for (int64_t i = 0; i < groupSize; ++i) {
              if (gk[i] > first) {
                second = first;
                first = gk[i];
              } else if (gk[i] > second) {
                second = gk[i];
              }
            }
            groupScore[g] = first + second;
          }
        }
        std::iota(order.begin(), order.begin() + groups, 0);
        std::partial_sort(order.begin(), order.begin() + params.topkGroups, order.begin() + groups,
                          ByKey{groupScore.data()});
        std::fill(kept.begin(), kept.end(), 0);
        for (int64_t i = 0; i < params.topkGroups; ++i)
          kept[order[i]] = 1;
        for (int64_t g = 0; g < groups; ++g)
          if (!kept[g])
            std::fill(key.begin() + g * groupSize, key.begin() + (g + 1) * groupSize,
                      -std::numeric_limits<float>::infinity());
      }
      // 4. Top-k in descending key order, lower index first on ties.
      std::iota(order.begin(), order.begin() + E, 0);
      std::partial_sort(order.begin(), order.begin() + k, order.begin() + E, ByKey{key.data()});
      int32_t *chosen = experts + t * k;
      float *w = weights + t * k;
      std::copy(order.begin(), order.begin() + k, chosen);
      // 5. Weights: the scores of the chosen experts (never the keys), or,
      //    for pre-softmax top-k, the softmax of the chosen logits.
      if (softmaxOfSelected) {
        for (int64_t j = 0; j < k; ++j)
          chosenLogits[j] = logit[chosen[j]];
        softmax(chosenLogits.data(), k, w);
      } else {
        for (int64_t j = 0; j < k; ++j)
          w[j] = score[chosen[j]];
      }
      // 6. Renormalise: f32 sum, + 1e-20 (a no-op in f32 for any sum above
      //    ~1e-12, so this is also Mixtral's plain division), f32 division.
      if (params.normalize) {
        float sum = 0;
        for (int64_t j = 0; j < k; ++j)
          sum += w[j];
        const float denominator = sum + 1e-20f;
        for (int64_t j = 0; j < k; ++j)
          w[j] = w[j] / denominator;
      }
      // 7. Routed scaling (an exact no-op for 1.0), then the compute type.
      for (int64_t j = 0; j < k; ++j) {
        w[j] = w[j] * scaling;
        if (params.computeBf16)
          w[j] = roundBf16(w[j]);
      }
    }
  }, 32);
}

} // namespace moert::cpu
