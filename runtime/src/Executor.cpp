#include "moert/Executor.h"
#include "moert/Error.h"
#include "moert/cpu/Kernels.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moert {

GenerateResult Executor::generate(const std::vector<std::vector<int32_t>> &prompts,
                                  const GenerateOptions &options) {
  const int64_t vocab = plan.vocabSize;
  if (prompts.empty())
    inputError("no prompt given (use --tokens)");
  if (static_cast<int64_t>(prompts.size()) > plan.maxSequences)
    inputError("{} prompts but the plan decodes at most {} sequences together "
               "(moec compile --max-sequences)",
               prompts.size(), plan.maxSequences);
  if (options.maxNewTokens < 0)
    inputError("--max-new-tokens: expected a value >= 0 but got {}", options.maxNewTokens);
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::vector<int32_t> &prompt = prompts[p];
    if (prompt.empty())
      inputError("prompt {} is empty", p);
    for (size_t i = 0; i < prompt.size(); ++i)
      if (prompt[i] < 0 || prompt[i] >= vocab)
        inputError("prompt {}: token id {} at position {} is outside the vocabulary [0, {})", p,
                   prompt[i], i, vocab);
    int64_t needed = static_cast<int64_t>(prompt.size()) + options.maxNewTokens;
    if (needed > plan.maxSeqLen)
      inputError("prompt {}: {} tokens plus --max-new-tokens {} exceed the plan's max_seq_len "
                 "{} (moec compile --max-seq-len)",
                 p, prompt.size(), options.maxNewTokens, plan.maxSeqLen);
  }

  GenerateResult result;
  result.generated.resize(prompts.size());
  Sampler sampler(options.sampling);
  std::vector<float> logits;
  // Next token to feed per sequence, once its prompt is done.
  std::vector<int32_t> pending(prompts.size());
  std::vector<bool> live(prompts.size(), options.maxNewTokens > 0);

  // Prefill: the prompts' tokens back to back, in chunks that fit a step.
  struct Row { int32_t slot, position; bool last; };
  std::vector<Row> rows;
  std::vector<int32_t> ids;
  for (size_t p = 0; p < prompts.size(); ++p)
    for (size_t i = 0; i < prompts[p].size(); ++i) {
      rows.push_back({static_cast<int32_t>(p), static_cast<int32_t>(i),
                      i + 1 == prompts[p].size()});
      ids.push_back(prompts[p][i]);
    }
  if (options.keepPromptLogits)
    result.promptLogits.reserve(rows.size() * vocab);
  for (size_t begin = 0; begin < rows.size(); begin += plan.maxBatchTokens) {
    size_t end = std::min(rows.size(), begin + static_cast<size_t>(plan.maxBatchTokens));
    Batch batch;
    for (size_t r = begin; r < end; ++r) {
      batch.tokens.push_back(ids[r]);
      batch.positions.push_back(rows[r].position);
      batch.slots.push_back(rows[r].slot);
      if (options.keepPromptLogits || rows[r].last)
        batch.logitRows.push_back(static_cast<int64_t>(r - begin));
    }
    device.forward(batch, logits);
    for (size_t i = 0; i < batch.logitRows.size(); ++i) {
      const Row &row = rows[begin + batch.logitRows[i]];
      const float *values = logits.data() + i * vocab;
      if (options.keepPromptLogits)
        result.promptLogits.insert(result.promptLogits.end(), values, values + vocab);
      if (row.last && live[row.slot])
        pending[row.slot] = sampler.next(values, vocab);
    }
  }

  // Decode: one token per live sequence per step.
  auto isEos = [&](int32_t id) {
    return options.stopAtEos &&
           std::find(plan.eosTokenIds.begin(), plan.eosTokenIds.end(), id) != plan.eosTokenIds.end();
  };
  for (;;) {
    Batch batch;
    for (size_t p = 0; p < prompts.size(); ++p) {
      if (!live[p])
        continue;
      result.generated[p].push_back(pending[p]);
      if (isEos(pending[p]) ||
          static_cast<int64_t>(result.generated[p].size()) >= options.maxNewTokens) {
        live[p] = false;
        continue;
      }
      batch.logitRows.push_back(batch.size());
      batch.tokens.push_back(pending[p]);
      batch.positions.push_back(
          static_cast<int32_t>(prompts[p].size() + result.generated[p].size() - 1));
      batch.slots.push_back(static_cast<int32_t>(p));
    }
    if (batch.size() == 0)
      break;
    device.forward(batch, logits);
    for (size_t i = 0; i < batch.slots.size(); ++i)
      pending[batch.slots[i]] = sampler.next(logits.data() + i * vocab, vocab);
  }
  return result;
}

Sampler::Sampler(const SamplingOptions &options)
    : options(options), state(options.seed * 0x9E3779B97F4A7C15ull + 1) {}

/// splitmix64: a small, fully specified generator, so a seed gives the same
/// tokens on every platform and library version.
double Sampler::uniform() {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int32_t Sampler::next(const float *logits, int64_t vocab) {
  if (options.temperature <= 0)
    return static_cast<int32_t>(cpu::argmax(logits, vocab));
  // Candidates by descending logit (ties: lower id first).
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  int64_t keep = options.topK > 0 ? std::min<int64_t>(options.topK, vocab) : vocab;
  std::vector<double> probs(keep);
  double maxLogit = logits[order[0]], sum = 0;
  for (int64_t i = 0; i < keep; ++i)
    sum += probs[i] = std::exp((logits[order[i]] - maxLogit) / options.temperature);
  // Nucleus: the smallest prefix whose probability reaches top_p.
  double cumulative = 0;
  int64_t nucleus = keep;
  for (int64_t i = 0; i < keep; ++i) {
    cumulative += probs[i] / sum;
    if (cumulative >= options.topP) {
      nucleus = i + 1;
      break;
    }
  }
  double total = std::accumulate(probs.begin(), probs.begin() + nucleus, 0.0);
  double u = uniform() * total;
  for (int64_t i = 0; i < nucleus; ++i) {
    u -= probs[i];
    if (u < 0)
      return order[i];
  }
  return order[nucleus - 1];
}

} // namespace moert
