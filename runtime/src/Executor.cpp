#include "moert/Executor.h"
#include "moert/Error.h"
#include "moert/cpu/Kernels.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moert {

namespace {

RankCoords coordsOf(const Plan &plan, int64_t rank) {
  return rank >= 0 && rank < static_cast<int64_t>(plan.ranks.size()) ? plan.ranks[rank].coords
                                                                       : RankCoords{};
}

} // namespace

std::vector<int> replicaRanks(const Plan &plan, int64_t dp) {
  std::vector<int> ranks;
  for (const PlanRank &r : plan.ranks)
    if (r.coords.dp == dp)
      ranks.push_back(static_cast<int>(r.rank));
  std::sort(ranks.begin(), ranks.end());
  if (plan.ranks.empty())
    ranks.push_back(0);
  return ranks;
}

GenerateResult Executor::generate(const std::vector<std::vector<int32_t>> &prompts,
                                  const GenerateOptions &options) {
  const int64_t vocab = plan.vocabSize;
  const int64_t replicas = std::max<int64_t>(1, plan.degrees.dp);
  const int64_t numPrompts = static_cast<int64_t>(prompts.size());
  // Every rank checks every prompt, so that all fail alike.
  if (prompts.empty())
    inputError("no prompt given (use --tokens)");
  if ((numPrompts + replicas - 1) / replicas > plan.maxSequences) {
    if (replicas == 1)
      inputError("{} prompts but the plan decodes at most {} sequences together "
                 "(moec compile --max-sequences)",
                 prompts.size(), plan.maxSequences);
    inputError("{} prompts but the plan decodes at most {} sequences together in each of its {} "
               "data-parallel replicas, {} in all (moec compile --max-sequences)",
               prompts.size(), plan.maxSequences, replicas, plan.maxSequences * replicas);
  }
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

  // This rank's replica and its prompts: r, r + DP, r + 2 DP, ...
  const int64_t dp = coordsOf(plan, rank).dp;
  std::vector<size_t> mine;
  for (int64_t p = dp; p < numPrompts; p += replicas)
    mine.push_back(static_cast<size_t>(p));
  const std::vector<int> replica = replicaRanks(plan, dp);
  // The replica's member that has the logits: last stage, TP rank 0.
  int logitsRoot = -1;
  for (size_t i = 0; i < replica.size() && logitsRoot < 0; ++i) {
    RankCoords c = coordsOf(plan, replica[i]);
    if (c.pp == plan.degrees.pp - 1 && c.tp == 0)
      logitsRoot = static_cast<int>(i);
  }
  if (logitsRoot < 0)
    runtimeError("{}: data-parallel replica {} has no rank on the last stage with tp 0", plan.path,
                 dp);

  const size_t local = mine.size();
  std::vector<std::vector<int32_t>> generated(local);
  std::vector<float> promptLogits;
  Sampler sampler(options.sampling);
  std::vector<float> logits;
  // Next token to feed per sequence (KV-cache slot = local index), once its
  // prompt is done.
  std::vector<int32_t> pending(local);
  std::vector<bool> live(local, options.maxNewTokens > 0);

  // Prefill: the prompts' tokens back to back, in chunks that fit a step.
  struct Row { int32_t slot, position; bool last; };
  std::vector<Row> rows;
  std::vector<int32_t> ids;
  for (size_t s = 0; s < local; ++s) {
    const std::vector<int32_t> &prompt = prompts[mine[s]];
    for (size_t i = 0; i < prompt.size(); ++i) {
      rows.push_back({static_cast<int32_t>(s), static_cast<int32_t>(i), i + 1 == prompt.size()});
      ids.push_back(prompt[i]);
    }
  }
  if (options.keepPromptLogits)
    promptLogits.reserve(rows.size() * vocab);
  auto isEos = [&](int32_t id) {
    return options.stopAtEos &&
           std::find(plan.eosTokenIds.begin(), plan.eosTokenIds.end(), id) != plan.eosTokenIds.end();
  };

  // One forward step per iteration on every rank of the world (lockstep):
  // prefill chunks until the replica's prompts are done, then decode one
  // token per live sequence per step (in turns when they are more than a
  // step holds); a rank without work runs an empty batch while any rank
  // has work.
  size_t prefilled = 0, decodeFrom = 0;
  for (int64_t step = 0;; ++step) {
    Batch batch;
    const size_t begin = prefilled;
    const bool prefill = begin < rows.size();
    if (prefill) {
      size_t end = std::min(rows.size(), begin + static_cast<size_t>(plan.maxBatchTokens));
      for (size_t r = begin; r < end; ++r) {
        batch.tokens.push_back(ids[r]);
        batch.positions.push_back(rows[r].position);
        batch.slots.push_back(rows[r].slot);
        if (options.keepPromptLogits || rows[r].last)
          batch.logitRows.push_back(static_cast<int64_t>(r - begin));
      }
      prefilled = end;
    } else {
      // At most the decode entry's tokens a step: more live sequences take
      // turns, from where the last step stopped.
      const size_t most = static_cast<size_t>(plan.maxBatchTokensOf(plan.decodeEntry));
      size_t last = decodeFrom;
      for (size_t n = 0; n < local && static_cast<size_t>(batch.size()) < most; ++n) {
        const size_t s = (decodeFrom + n) % local;
        if (!live[s])
          continue;
        generated[s].push_back(pending[s]);
        if (options.onToken)
          options.onToken(mine[s], pending[s]);
        if (isEos(pending[s]) ||
            static_cast<int64_t>(generated[s].size()) >= options.maxNewTokens) {
          live[s] = false;
          continue;
        }
        batch.logitRows.push_back(batch.size());
        batch.tokens.push_back(pending[s]);
        batch.positions.push_back(
            static_cast<int32_t>(prompts[mine[s]].size() + generated[s].size() - 1));
        batch.slots.push_back(static_cast<int32_t>(s));
        last = s;
      }
      decodeFrom = local ? (last + 1) % local : 0;
    }
    // Every rank runs the same entry in a step (a collective group may span
    // replicas that are in different phases): the prefill entry while any
    // rank prefills, else the decode entry (the plan's schedule).
    const int64_t phase = comm.allReduceMax(
        prefill ? 2 : batch.size() > 0 ? 1 : 0,
        fmt::format("generation step {} (is any rank prefilling, decoding or done)", step));
    if (phase == 0)
      break;
    device.forward(batch, logits, phase == 2 ? plan.prefillEntry : plan.decodeEntry);

    // Every rank of the replica samples from the same logits.
    const size_t logitCount = batch.logitRows.size() * static_cast<size_t>(vocab);
    if (rank == replica[logitsRoot] && logits.size() < logitCount)
      runtimeError("the device returned {} logits for {} rows of {}", logits.size(),
                   batch.logitRows.size(), vocab);
    if (replica.size() > 1 && logitCount > 0) {
      if (rank != replica[logitsRoot])
        logits.resize(logitCount);
      comm.broadcast(logits.data(), static_cast<int64_t>(logitCount * sizeof(float)), logitsRoot,
                     replica,
                     fmt::format("generation step {} (logits from rank {})", step,
                                 replica[logitsRoot]));
    }

    if (prefill) {
      for (size_t i = 0; i < batch.logitRows.size(); ++i) {
        const Row &row = rows[begin + batch.logitRows[i]];
        const float *values = logits.data() + i * vocab;
        if (options.keepPromptLogits)
          promptLogits.insert(promptLogits.end(), values, values + vocab);
        if (row.last && live[row.slot])
          pending[row.slot] = sampler.next(values, vocab);
      }
    } else {
      for (size_t i = 0; i < batch.slots.size(); ++i)
        pending[batch.slots[i]] = sampler.next(logits.data() + i * vocab, vocab);
    }
  }

  GenerateResult result;
  result.generated.resize(prompts.size());
  for (size_t s = 0; s < local; ++s)
    result.generated[mine[s]] = std::move(generated[s]);
  if (replicas == 1) {
    result.promptLogits = std::move(promptLogits);
    return result;
  }

  // Rank 0 gathers from each other replica's leader (its lowest rank: pp 0,
  // tp 0), which holds the replica's results like every member.
  auto promptsOf = [&](int64_t r) {
    std::vector<size_t> list;
    for (int64_t p = r; p < numPrompts; p += replicas)
      list.push_back(static_cast<size_t>(p));
    return list;
  };
  auto logitValues = [&](const std::vector<size_t> &list) {
    size_t n = 0;
    for (size_t p : list)
      n += prompts[p].size() * static_cast<size_t>(vocab);
    return n;
  };
  if (rank == 0) {
    std::vector<std::vector<float>> logitsOf(replicas);
    logitsOf[dp] = std::move(promptLogits);
    for (int64_t r = 0; r < replicas; ++r) {
      if (r == dp)
        continue;
      int leader = replicaRanks(plan, r).front();
      std::vector<size_t> theirs = promptsOf(r);
      std::vector<int64_t> counts(theirs.size());
      comm.recv(counts.data(), static_cast<int64_t>(counts.size() * sizeof(int64_t)), leader,
                fmt::format("results of replica {} (token counts)", r));
      size_t total = 0;
      for (int64_t count : counts) {
        if (count < 0 || count > options.maxNewTokens)
          runtimeError("replica {} reports {} generated tokens for a prompt", r, count);
        total += static_cast<size_t>(count);
      }
      std::vector<int32_t> tokens(total);
      comm.recv(tokens.data(), static_cast<int64_t>(total * sizeof(int32_t)), leader,
                fmt::format("results of replica {} (tokens)", r));
      size_t at = 0;
      for (size_t i = 0; i < theirs.size(); ++i) {
        result.generated[theirs[i]].assign(tokens.begin() + at, tokens.begin() + at + counts[i]);
        at += static_cast<size_t>(counts[i]);
      }
      if (options.keepPromptLogits) {
        logitsOf[r].resize(logitValues(theirs));
        comm.recv(logitsOf[r].data(), static_cast<int64_t>(logitsOf[r].size() * sizeof(float)),
                  leader, fmt::format("results of replica {} (prompt logits)", r));
      }
    }
    if (options.keepPromptLogits) {
      // Back to prompt order: prompt p is the next of replica p % DP.
      size_t all = 0;
      for (const std::vector<float> &part : logitsOf)
        all += part.size();
      result.promptLogits.reserve(all);
      std::vector<size_t> cursor(replicas, 0);
      for (int64_t p = 0; p < numPrompts; ++p) {
        int64_t r = p % replicas;
        size_t n = prompts[p].size() * static_cast<size_t>(vocab);
        const float *from = logitsOf[r].data() + cursor[r];
        result.promptLogits.insert(result.promptLogits.end(), from, from + n);
        cursor[r] += n;
      }
    }
  } else if (rank == replica.front() && dp != coordsOf(plan, 0).dp) {
    std::vector<int64_t> counts(local);
    std::vector<int32_t> tokens;
    for (size_t s = 0; s < local; ++s) {
      counts[s] = static_cast<int64_t>(result.generated[mine[s]].size());
      tokens.insert(tokens.end(), result.generated[mine[s]].begin(),
                    result.generated[mine[s]].end());
    }
    comm.send(counts.data(), static_cast<int64_t>(counts.size() * sizeof(int64_t)), 0,
              fmt::format("results of replica {} (token counts)", dp));
    comm.send(tokens.data(), static_cast<int64_t>(tokens.size() * sizeof(int32_t)), 0,
              fmt::format("results of replica {} (tokens)", dp));
    if (options.keepPromptLogits)
      comm.send(promptLogits.data(), static_cast<int64_t>(promptLogits.size() * sizeof(float)), 0,
                fmt::format("results of replica {} (prompt logits)", dp));
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
