// Generation over a device: prefill (in chunks of max_batch_tokens), then
// decode one token per live sequence per step, until EOS or the limit.
#pragma once

#include "moert/Device.h"
#include "moert/Plan.h"

#include <cstdint>
#include <vector>

namespace moert {

struct SamplingOptions {
  double temperature = 0.0; ///< 0: greedy (argmax)
  int64_t topK = 0;         ///< 0: no top-k filter
  double topP = 1.0;        ///< 1: no nucleus filter
  uint64_t seed = 0;
};

struct GenerateOptions {
  int64_t maxNewTokens = 16;
  bool stopAtEos = true;
  /// Keep the logits of every prompt position ([prompt tokens, vocab]).
  bool keepPromptLogits = false;
  SamplingOptions sampling;
};

struct GenerateResult {
  std::vector<std::vector<int32_t>> generated; ///< per prompt
  std::vector<float> promptLogits;             ///< all prompts' rows, in order
};

class Executor {
public:
  Executor(const Plan &plan, Device &device) : plan(plan), device(device) {}

  /// Checks the prompts against the plan (InputError naming the prompt:
  /// empty, token id out of range, too long, too many), then generates.
  GenerateResult generate(const std::vector<std::vector<int32_t>> &prompts,
                          const GenerateOptions &options);

private:
  const Plan &plan;
  Device &device;
};

/// Picks the next token from one row of logits.
class Sampler {
public:
  explicit Sampler(const SamplingOptions &options);
  int32_t next(const float *logits, int64_t vocab);

private:
  SamplingOptions options;
  uint64_t state;
  double uniform();
};

} // namespace moert
