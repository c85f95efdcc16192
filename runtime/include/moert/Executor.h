// Generation over a device: prefill (in chunks of max_batch_tokens), then
// decode one token per live sequence per step, until EOS or the limit.
#pragma once

#include "moert/Comm.h"
#include "moert/RankExecutor.h"
#include "moert/Plan.h"

#include <cstdint>
#include <functional>
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
  /// Called with (prompt index, token) as each token of this rank's replica
  /// is generated (streaming); may be empty.
  std::function<void(size_t, int32_t)> onToken;
  SamplingOptions sampling;
};

struct GenerateResult {
  std::vector<std::vector<int32_t>> generated; ///< per prompt
  std::vector<float> promptLogits;             ///< all prompts' rows, in order
};

/// Every rank of the plan runs an Executor with the same prompts and options
/// (a world of one: the single-process Comm, rank 0). Data-parallel replica
/// r (its ranks' coords.dp) generates prompts r, r + DP, r + 2 DP, ...; every
/// rank of the world takes every forward step (lockstep: a replica without
/// work runs an empty batch), the replica's last-stage TP-rank-0 broadcasts
/// the logits to the replica, and rank 0 gathers the results.
class Executor {
public:
  Executor(const Plan &plan, RankExecutor &device, Comm &comm, int64_t rank)
      : plan(plan), device(device), comm(comm), rank(rank) {}

  /// Checks the prompts against the plan (InputError naming the prompt:
  /// empty, token id out of range, too long, too many; the same on every
  /// rank), then generates. The result is complete on rank 0; other ranks
  /// hold at least their replica's generated tokens.
  GenerateResult generate(const std::vector<std::vector<int32_t>> &prompts,
                          const GenerateOptions &options);

private:
  const Plan &plan;
  RankExecutor &device;
  Comm &comm;
  int64_t rank;
};

/// The ranks of data-parallel replica `dp` (all ranks with coords.dp == dp),
/// ascending; {0} for a plan without ranks.
std::vector<int> replicaRanks(const Plan &plan, int64_t dp);

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
