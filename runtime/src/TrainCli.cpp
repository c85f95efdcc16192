// moert train PLAN --weights DIR --data TOKENS: runs a training plan (moec
// compile --train) over windows of the token data and prints the loss
// terms of each micro-batch (docs/training.md).
#include "InputFile.h"
#include "TextCli.h"
#include "TrainCli.h"
#include "TrainParts.h"
#include "moert/Checkpoint.h"
#include "moert/Comm.h"
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/Plan.h"
#include "moert/PlanLayout.h"
#include "moert/RankExecutor.h"
#include "moert/SafetensorsWriter.h"
#include "moert/ShardedCheckpoint.h"
#include "moert/StepTimes.h"
#include "moert/TokenData.h"
#include "moert/cpu/Optimizer.h"
#include "moert/cpu/Peak.h"

#include "checkpoint/Progress.h"

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <thread>

namespace moert {
namespace {

int64_t integerOption(const std::string &option, const char *text, int64_t min) {
  const int64_t value = parseInt(option, text);
  if (value < min)
    inputError("{}: expected an integer >= {} but got '{}'", option, min, text);
  return value;
}

/// sum += g (sum starts empty: = g); returns the sum of g's squares
/// (cpu::sumOfSquares: the same bits for any thread count).
double accumulate(const std::vector<float> &g, std::vector<float> &sum) {
  if (sum.empty())
    sum.assign(g.size(), 0.0f);
  cpu::accumulate(g.data(), sum.data(), nullptr, static_cast<int64_t>(g.size()));
  return cpu::sumOfSquares(g.data(), static_cast<int64_t>(g.size()));
}

/// --profile: the seconds per micro-batch (per update: `per`) of each op
/// kind of `program`, largest first.
void printProfile(const PlanProgram &program, const std::vector<double> &seconds,
                  int64_t batches, const char *per = "micro-batch") {
  std::vector<OpTime> kinds = timeByOp(program, seconds, {});
  std::stable_sort(kinds.begin(), kinds.end(),
                   [](const OpTime &a, const OpTime &b) { return a.seconds > b.seconds; });
  double total = 0;
  for (const OpTime &k : kinds)
    total += k.seconds;
  fmt::print("time per {} by op ({:.3f} s in the {} program's steps):\n", per,
             total / static_cast<double>(batches), program.entry);
  for (const OpTime &k : kinds)
    if (k.seconds > 0)
      fmt::print("  {:<22} {:8.3f} s {:5.1f}%\n", k.op, k.seconds / static_cast<double>(batches),
                 100 * k.seconds / total);
  // What --recompute full costs: the forward steps run again (of the above).
  double recomputed = 0;
  bool any = false;
  for (size_t i = 0; i < program.steps.size() && i < seconds.size(); ++i)
    if (program.steps[i].recompute) {
      recomputed += seconds[i];
      any = true;
    }
  if (any)
    fmt::print("  of which recomputed forward steps {:.3f} s {:5.1f}%\n",
               recomputed / static_cast<double>(batches), 100 * recomputed / total);
}

/// --report-memory: what the device holds at its peak (weights, every
/// entry's buffers, the state buffers, the KV caches and the device's
/// scratch) against the compiled programs' figures (all but the scratch).
void printTrainingMemory(const Plan &plan, const RankExecutor &executor, int rank) {
  const double measured = static_cast<double>(executor.peakBytes()),
               predicted = static_cast<double>(plan.ranks.at(rank).predictedPeakBytes);
  fmt::print("{}memory: weights {} bytes, peak measured {:.2f} MiB, predicted {:.2f} MiB "
             "({:+.1f}%)\n",
             plan.worldSize > 1 ? fmt::format("rank {}: ", rank) : std::string(),
             executor.weightBytes(), measured / 1048576, predicted / 1048576,
             100 * (measured - predicted) / predicted);
  // The optimizer's own states and the gradient sums (ZeRO: the rank's
  // shards), allocated against the plan's state buffers.
  for (const auto &[label, kinds] :
       {std::pair<const char *, std::vector<std::string>>{"optimizer states",
                                                          {"exp_avg", "exp_avg_sq", "master"}},
        {"gradient sums", {"grad_sum", "grad_err"}}}) {
    std::set<std::string> seen;
    int64_t planned = 0;
    for (const PlanProgram *entry : plan.entriesOf(rank))
      for (const PlanBuffer &b : entry->buffers)
        if (!b.state.empty() && stateOfKind(b.state, kinds) && seen.insert(b.state).second)
          planned += b.bytes;
    const int64_t allocated = executor.stateBytes(kinds);
    if (planned > 0)
      fmt::print("{}{}: {} bytes allocated, {} predicted ({:+.1f}%)\n",
                 plan.worldSize > 1 ? fmt::format("rank {}: ", rank) : std::string(), label,
                 allocated, planned,
                 100.0 * static_cast<double>(allocated - planned) / static_cast<double>(planned));
  }
}

/// The run's micro-batches (docs/training.md, "Data and windows"): pass p
/// over the data is P = W / B micro-batches (W windows of L + 1 tokens),
/// micro-batch g of the run is micro-batch g mod P of pass g / P, its
/// sequences the windows order[(g mod P) B + s] of that pass's order
/// (windowOrder: in order, or seeded), positions from 0, the labels the
/// next tokens.
class Samples {
public:
  /// `targets` (empty: every token) marks the tokens the loss counts as
  /// labels (fine-tuning on responses only): the others get label -100.
  Samples(const std::vector<int32_t> &tokens, const std::vector<uint8_t> &targets, int64_t B,
          int64_t L, int64_t seed)
      : tokens(tokens), targets(targets), B(B), L(L), seed(seed),
        windows(windowCount(static_cast<int64_t>(tokens.size()), L)), perPass(windows / B) {}

  Batch microBatch(int64_t g) {
    if (g / perPass != pass) {
      pass = g / perPass;
      order = windowOrder(windows, seed, pass);
    }
    Batch batch;
    for (int64_t s = 0; s < B; ++s) {
      const int64_t start = order[static_cast<size_t>((g % perPass) * B + s)] * L;
      const int32_t *window = tokens.data() + start;
      for (int64_t i = 0; i < L; ++i) {
        batch.tokens.push_back(window[i]);
        batch.positions.push_back(static_cast<int32_t>(i));
        batch.slots.push_back(static_cast<int32_t>(s));
        const bool counted = targets.empty() || targets[static_cast<size_t>(start + i + 1)];
        batch.labels.push_back(counted ? window[i + 1] : -100);
        batch.logitRows.push_back(batch.size() - 1); // the LM head computes every row
      }
    }
    return batch;
  }

private:
  const std::vector<int32_t> &tokens;
  const std::vector<uint8_t> &targets;
  const int64_t B, L, seed, windows, perPass;
  int64_t pass = -1;
  std::vector<int64_t> order;
};

/// A training run of `moert train --steps N` (docs/training.md, "The
/// optimizer" and "Training checkpoints").
struct TrainRun {
  int64_t steps = 0;          ///< the number of the last update
  TrainingProgress start;     ///< where it begins (--resume: the checkpoint's) and the seed
  std::string metricsOut, weightsOut, save, planPath;
  int64_t saveEvery = 0;      ///< 0: --save only after the last update
  CheckpointModel model;      ///< what --save's manifest says of the model
  std::shared_ptr<const PlanLayout> layout; ///< the plan's (--save: the weights' dtypes)
  CheckpointTarget target() const { return {save, planPath, model, *layout}; }
};

/// The model's multiply-add parameters per token (6 x this is the FLOPs of
/// a token's forward and backward, attention's products left out): every
/// matrix but an embedding table the LM head does not share, and an expert
/// stack at k of its E experts (k: the routing's top_k).
double activeParameters(const PlanProgram &program) {
  int64_t topK = 1;
  std::vector<bool> lookupOnly(program.weights.size(), true);
  for (const PlanStep &s : program.steps) {
    topK = std::max(topK, s.routing.topK);
    for (int64_t w : s.weights)
      if (!s.op->has(OpDef::VocabShard)) // the embedding step: a lookup, not a product
        lookupOnly[static_cast<size_t>(w)] = false;
  }
  double params = 0;
  for (size_t i = 0; i < program.weights.size(); ++i) {
    const PlanWeight &w = program.weights[i];
    const double n = static_cast<double>(TensorView{w.dtype, w.shape, nullptr}.numel());
    if (w.experts > 0)
      params += n * static_cast<double>(topK) / static_cast<double>(w.experts);
    else if (w.shape.size() >= 2 && !lookupOnly[i])
      params += n;
  }
  return params;
}

/// Pipeline stages: each stage's time waiting for its neighbours (in its
/// receives, sends and exchanges) as a share of its forward and backward
/// steps, beside the 1F1B bubble of equal stages, (pp - 1) / (m + pp - 1);
/// rank 0 prints every stage's first replica's.
void reportBubble(const Plan &plan, RankExecutor &executor, Comm &comm, int64_t micro) {
  const double own[2] = {executor.pipelineBusySeconds(), executor.pipelineWaitSeconds()};
  std::vector<double> all(2 * static_cast<size_t>(comm.size()));
  std::vector<int> world(static_cast<size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r)
    world[static_cast<size_t>(r)] = r;
  comm.allGather(own, sizeof own, all.data(), world, "the pipeline's busy and idle times");
  if (comm.rank() != 0)
    return;
  const int64_t pp = plan.degrees.pp;
  const double model = static_cast<double>(pp - 1) / static_cast<double>(micro + pp - 1);
  double busySum = 0;
  for (int64_t stage = 0; stage < pp; ++stage) {
    const size_t r = static_cast<size_t>(plan.stageRank(0, stage));
    const double busy = all[2 * r], wait = all[2 * r + 1];
    busySum += busy;
    fmt::print("pipeline stage {}: waited {:.1f}% of its steps' time for its neighbours "
               "(busy {:.3f} s, waiting {:.3f} s); the 1F1B bubble of equal stages: "
               "(pp - 1) / (m + pp - 1) = {:.1f}%\n",
               stage, 100 * wait / (busy + wait), busy, wait, 100 * model);
  }
  // The pipeline's time is the first stage's, from its first forward to
  // its last backward (it neither waits for another stage's optimizer nor
  // ends before the others): the bubble is the share of the stages' time
  // in it that they do not compute, as moec --explain models it.
  const size_t first = static_cast<size_t>(plan.stageRank(0, 0));
  const double span = all[2 * first] + all[2 * first + 1];
  if (span > 0)
    fmt::print("pipeline bubble: {:.1f}% of the stages' time (1 - their mean busy time / the "
               "first stage's steps' time, {:.3f} s); equal stages: (pp - 1) / (m + pp - 1) = "
               "{:.1f}%\n",
               100 * (1 - busySum / static_cast<double>(pp) / span), span, 100 * model);
}

/// moert train --steps N: updates run.start.step + 1 .. N of the plan's
/// optimizer, each over its micro-batches (the run's micro-batches from
/// run.start's position, Samples); a line per update, --save every
/// run.saveEvery updates and after the last. Data-parallel replicas (ranks
/// of a plan with dp > 1) each run a contiguous share of an update's
/// micro-batches (replica d the d-th M / dp of them), the optimizer program
/// adds their gradients; rank 0 prints, writes the metrics, the weights and
/// the checkpoints (every replica holds the same weights and states).
void trainSteps(RankExecutor &executor, const Plan &plan, const PlanProgram &program,
                const PlanProgram &optimizer, const std::vector<int32_t> &tokens,
                const std::vector<uint8_t> &targets, const TrainRun &run, Comm &comm) {
  const int64_t M = optimizer.microBatches, B = plan.maxSequences, L = plan.maxSeqLen;
  const int64_t replicas = plan.degrees.dp, share = M / replicas,
                replica = plan.ranks.at(comm.rank()).coords.dp;
  const bool lead = comm.rank() == 0;
  std::vector<int> world(static_cast<size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r)
    world[static_cast<size_t>(r)] = r;
  Samples samples(tokens, targets, B, L, run.start.shuffleSeed);
  // Model FLOP utilisation against the peak measured here: the bf16 dot
  // product's for bf16 weights where the level has one, else the FMA's.
  const cpu::PeakFlops measured = cpu::measurePeakFlops(numThreads(), 2'000'000, 2);
  const bool bf16 = std::any_of(program.weights.begin(), program.weights.end(),
                                [](const PlanWeight &w) { return w.dtype == DType::BF16; });
  const double peak = bf16 && measured.bf16 > 0 ? measured.bf16 : measured.fma;
  const double flopsPerToken = 6 * activeParameters(program);
  if (lead)
    fmt::print("model FLOPs per token {:.3g} (6 x {:.4g} parameters a token uses); peak {:.0f} "
               "GFLOP/s ({}, {} threads, measured now)\n",
               flopsPerToken, flopsPerToken / 6, peak / 1e9,
               peak == measured.bf16 ? "bf16 dot" : "fp32 FMA", numThreads());
  if (lead && replicas > 1)
    fmt::print("{} data-parallel replicas, {} of the {} micro-batches of an update each\n",
               replicas, share, M);
  using Clock = std::chrono::steady_clock;
  std::string metrics;
  std::vector<float> loss, stats;
  int64_t consumed = run.start.microBatchesDone;
  // A bar on stderr while the update lines go elsewhere (a log file): on a
  // terminal the lines themselves show the progress.
  Progress progress("train", static_cast<uint64_t>(run.steps - run.start.step),
                    lead && !::isatty(STDOUT_FILENO), "updates");
  constexpr int64_t kMaxSkipped = 5;
  int64_t skipped = 0; // updates skipped in a row
  for (int64_t step = run.start.step; step < run.steps; ++step) {
    const auto started = Clock::now();
    double terms[4] = {0, 0, 0, 0};
    int64_t count = 0;
    if (!plan.pipelineSchedule.empty()) {
      // Pipeline stages: the stage's forward and backward steps over the
      // replica's micro-batches in the plan's order (1F1B); the last
      // stage's forwards give the loss.
      const RankCoords &coords = plan.ranks.at(comm.rank()).coords;
      const auto &order = plan.pipelineSchedule.at(static_cast<size_t>(coords.pp));
      std::vector<Batch> batches;
      for (int64_t m = 0; m < share; ++m)
        batches.push_back(samples.microBatch(consumed + replica * share + m));
      for (size_t i = 0; i < order.size(); ++i) {
        const Plan::PipelineStep &st = order[i];
        const Plan::PipelineStep *next = i + 1 < order.size() ? &order[i + 1] : nullptr;
        executor.setPhase(fmt::format("update {}, micro-batch {} ({})", step + 1,
                                      st.microBatch + 1, st.backward ? "backward" : "forward"));
        loss.clear();
        executor.pipelineStep(st, batches[static_cast<size_t>(st.microBatch)], loss, next,
                              next ? &batches[static_cast<size_t>(next->microBatch)] : nullptr);
        if (st.backward)
          continue;
        for (size_t k = 0; k < loss.size() && k < 4; ++k)
          terms[k] += loss[k];
        count += batches[static_cast<size_t>(st.microBatch)].size();
      }
    } else {
      for (int64_t m = 0; m < share; ++m) {
        const Batch batch = samples.microBatch(consumed + replica * share + m);
        executor.setPhase(fmt::format("update {}, micro-batch {}", step + 1, m + 1));
        executor.forward(batch, loss);
        for (int k = 0; k < 4; ++k)
          terms[k] += loss[k];
        count += batch.size();
      }
    }
    consumed += M;
    executor.setPhase(fmt::format("update {}", step + 1));
    executor.optimizerStep(step + 1, stats);
    executor.setPhase({});
    if (comm.size() > 1) {
      // The loss terms and tokens of the whole update: each replica's
      // (double) sums, added in replica order (a TP group's first rank's:
      // its ranks computed the same loss).
      const double own[5] = {terms[0], terms[1], terms[2], terms[3], static_cast<double>(count)};
      std::vector<double> all(5 * world.size());
      comm.allGather(own, sizeof own, all.data(), world,
                     fmt::format("step {}: the loss terms", step + 1));
      // (and a pipeline's last stage's: it computes the loss).
      auto counted = [&](size_t r) {
        const RankCoords &c = plan.ranks.at(static_cast<int64_t>(r)).coords;
        return c.tp == 0 && c.pp == plan.degrees.pp - 1;
      };
      for (int k = 0; k < 4; ++k) {
        terms[k] = 0;
        for (size_t r = 0; r < world.size(); ++r)
          if (counted(r))
            terms[k] += all[5 * r + k];
      }
      count = 0;
      for (size_t r = 0; r < world.size(); ++r)
        if (counted(r))
          count += static_cast<int64_t>(all[5 * r + 4]);
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
    for (double &t : terms)
      t /= static_cast<double>(M);
    const double mfu = flopsPerToken * static_cast<double>(count) / seconds /
                       (peak * static_cast<double>(replicas));
    if (lead)
      fmt::print("step {}: loss {:.6f} ce {:.6f} aux {:.6f} z {:.6f} grad_norm {:.6f} lr {:.3e} "
                 "({} tokens, {:.0f} tokens/s, MFU {:.1f}%)\n",
                 step + 1, terms[0], terms[1], terms[2], terms[3], stats[1], stats[0], count,
                 static_cast<double>(count) / seconds, 100 * mfu);
    std::fflush(stdout);
    nlohmann::ordered_json line = {{"step", step + 1}, {"loss", terms[0]}, {"ce", terms[1]},
                                   {"aux", terms[2]},  {"z", terms[3]}};
    line["grad_norm"] = stats[1];
    line["clip_coef"] = stats[2];
    line["lr"] = stats[0];
    line["tokens"] = count;
    line["seconds"] = seconds;
    line["mfu"] = mfu;
    line["skipped"] = stats[3] != 0;
    metrics += line.dump() + "\n";
    // A gradient that is not finite skips its update (the optimizer moves
    // no weight); a run of them means training diverged.
    skipped = stats[3] != 0 ? skipped + 1 : 0;
    if (skipped > 0 && lead)
      fmt::print("step {}: the gradient is not finite (norm {}): update skipped, no weight "
                 "moved\n",
                 step + 1, stats[1]);
    if (skipped >= kMaxSkipped) {
      if (!run.metricsOut.empty() && lead)
        writeFileAtomically(run.metricsOut, metrics);
      inputError("step {}: the gradients were not finite for {} updates in a row (loss {}): "
                   "training diverged; lower --lr or resume from an earlier checkpoint",
                   step + 1, skipped, terms[0]);
    }
    if (!run.save.empty() &&
        ((run.saveEvery > 0 && (step + 1) % run.saveEvery == 0) || step + 1 == run.steps))
      saveCheckpoint(plan, executor, comm, program, run.target(),
                     {step + 1, consumed, M, L, B, run.start.shuffleSeed});
    progress.add(1);
  }
  progress.finish();
  if (!plan.pipelineSchedule.empty() && run.steps > run.start.step)
    reportBubble(plan, executor, comm, share);
  if (run.start.step == run.steps && !run.save.empty()) // a checkpoint saved again
    saveCheckpoint(plan, executor, comm, program, run.target(),
                   {run.steps, consumed, M, L, B, run.start.shuffleSeed});
  if (!run.metricsOut.empty() && lead)
    writeFileAtomically(run.metricsOut, metrics);
  if (!run.weightsOut.empty()) {
    std::vector<std::vector<float>> values;
    std::vector<TensorToWrite> trained = trainedWeights(plan, executor, comm, program, values);
    if (lead)
      writeSafetensors(run.weightsOut, trained);
  }
}

} // namespace

int trainCommand(int argc, char **argv, Comm &comm) {
  std::string planPath, weightsPath, dataPath, metricsOut, gradsOut, weightsOut, deviceName;
  std::string save, resume, tokenizerPath;
  int64_t saveEvery = 0, shuffleSeed = -1;
  int64_t steps = 0, batches = 1;
  bool profile = false, reportMemory = false, inProcess = false, threadsGiven = false;
  double collectiveTimeout = 300;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&] { return optionValue(argc, argv, i); };
    if (arg == "--weights") weightsPath = value();
    else if (arg == "--data") dataPath = value();
    else if (arg == "--steps") steps = integerOption(arg, value(), 0);
    else if (arg == "--micro-batches") batches = integerOption(arg, value(), 1);
    else if (arg == "--metrics-out") metricsOut = value();
    else if (arg == "--threads") {
      threads = static_cast<int>(integerOption(arg, value(), 1));
      threadsGiven = true;
    }
    else if (arg == "--in-process") inProcess = true;
    else if (arg == "--grads-out") gradsOut = value();
    else if (arg == "--weights-out") weightsOut = value();
    else if (arg == "--save") save = value();
    else if (arg == "--save-every") saveEvery = integerOption(arg, value(), 1);
    else if (arg == "--resume") resume = value();
    else if (arg == "--shuffle-seed") shuffleSeed = integerOption(arg, value(), 0);
    else if (arg == "--tokenizer") tokenizerPath = value();
    else if (arg == "--profile") profile = true;
    else if (arg == "--report-memory") reportMemory = true;
    else if (arg == "--device") deviceName = value();
    else if (arg == "--collective-timeout") collectiveTimeout = parseDouble(arg, value());
    else if (!arg.empty() && arg[0] == '-') inputError("unknown option '{}' (see moert --help)", arg);
    else if (planPath.empty()) planPath = arg;
    else inputError("unexpected argument '{}'", arg);
  }
  // --resume CKPT: the weights are the checkpoint's.
  if (!resume.empty()) {
    if (!weightsPath.empty() && weightsPath != resume)
      inputError("--resume {}: the weights are the checkpoint's (drop --weights {})", resume,
                 weightsPath);
    weightsPath = resume;
  }
  if (planPath.empty() || weightsPath.empty() || dataPath.empty())
    inputError("expected moert train PLAN --weights DIR --data TOKENS");
  bool microBatchesGiven = false;
  for (int i = 2; i < argc; ++i)
    microBatchesGiven = microBatchesGiven || std::string(argv[i]) == "--micro-batches";
  if (steps > 0 && (microBatchesGiven || !gradsOut.empty()))
    inputError("--steps {}: the plan's optimizer decides the micro-batches of an update (moec "
               "compile --global-batch-size); --micro-batches and --grads-out go with --steps 0",
               steps);
  if (steps == 0)
    for (auto [option, given] : {std::pair<const char *, bool>{"--weights-out", !weightsOut.empty()},
                                 {"--save", !save.empty()},
                                 {"--save-every", saveEvery > 0},
                                 {"--resume", !resume.empty()}})
      if (given)
        inputError("{}: expected --steps N (the updates of a training run)", option);
  if (saveEvery > 0 && save.empty())
    inputError("--save-every {}: expected --save CKPT", saveEvery);
  if (threads > 1024)
    inputError("--threads: expected a value in [1, 1024] but got {}", threads);
  if (!(collectiveTimeout > 0))
    inputError("--collective-timeout: expected a number of seconds > 0");
  comm.setTimeout(collectiveTimeout);
  setNumThreads(threads);

  Plan plan = Plan::load(planPath);
  if (!plan.training)
    inputError("{}: not a training plan (compile one with moec compile --train)", planPath);
  if (inProcess || (plan.ranksPerProcess > 1 && plan.worldSize > comm.size())) {
    checkInProcess(comm, threadsGiven ? threads : 1,
                   chooseDevice(plan, planPath, deviceName, "moec compile --train --target cuda"),
                   plan, planPath, inProcess);
    if (plan.worldSize > comm.size())
      return runCommandInProcess(static_cast<int>(plan.worldSize), argc, argv, trainCommand,
                                 comm);
  }
  // Over several ranks: data-parallel replicas of one program, trained by
  // updates (--steps).
  if (plan.worldSize != comm.size())
    inputError("{}: a plan for {} ranks, run on {} (start it with mpirun -np {}, or in one "
               "process with --in-process)",
               planPath, plan.worldSize, comm.size(), plan.worldSize);
  if (plan.worldSize > 1 &&
      (plan.degrees.dp * plan.degrees.tp * plan.degrees.pp != plan.worldSize || steps == 0))
    inputError("{}: not supported yet: training on {} ranks {}", planPath, plan.worldSize,
               steps == 0 ? "without --steps (the gradients of one rank's micro-batches)"
                          : "of this layout");
  const PlanProgram &program = plan.programOf(comm.rank());
  if (steps > 0 && !plan.optimizer)
    inputError("--steps {}: {} has no optimizer (compile it with moec compile --train "
               "--optimizer adamw)",
               steps, planPath);
  if (!gradsOut.empty() && program.gradients.empty())
    inputError("--grads-out: {} computes no gradients (compiled with moec compile --train "
               "--loss-only)",
               planPath);
  const int64_t L = plan.maxSeqLen, B = plan.maxSequences;
  if (L * B != plan.maxBatchTokens)
    inputError("{}: a training plan's max_batch_tokens ({}) must be max_sequences x "
               "max_seq_len ({} x {})",
               planPath, plan.maxBatchTokens, B, L);
  // Token data, or text (.txt, .jsonl, or any file with --tokenizer) through
  // the model's tokenizer.
  auto endsWith = [&](const char *suffix) {
    const size_t n = std::strlen(suffix);
    return dataPath.size() >= n && dataPath.compare(dataPath.size() - n, n, suffix) == 0;
  };
  const bool text = endsWith(".txt") || endsWith(".jsonl") || !tokenizerPath.empty();
  // A JSONL file of prompt/response pairs trains on the responses only.
  std::vector<uint8_t> targets;
  std::vector<int32_t> tokens;
  if (text) {
    const Tokenizer tokenizer = promptTokenizer(tokenizerPath, weightsPath, plan.vocabSize, "--data");
    tokens = isPromptResponseJsonl(dataPath)
                 ? tokenizePromptResponses(tokenizer, dataPath, threads, targets)
                 : tokenizeInputs(tokenizer, {dataPath}, "", false, true, threads,
                                  "moert train --data");
  } else {
    tokens = readTokenData(dataPath, plan.vocabSize);
  }
  const int64_t windows = windowCount(static_cast<int64_t>(tokens.size()), L);
  Samples samples(tokens, targets, B, L, shuffleSeed);
  if (steps > 0 && windows < B)
    inputError("{}: {} tokens hold {} windows of {} + 1 tokens; a micro-batch needs {}", dataPath,
               tokens.size(), windows, L, B);
  if (steps == 0 && windows < batches * B)
    inputError("{}: {} tokens hold {} windows of {} + 1 tokens; {} micro-batches of {} need {}",
               dataPath, tokens.size(), windows, L, batches, B, batches * B);

  std::unique_ptr<Checkpoint> checkpoint = Checkpoint::open(weightsPath);
  if (!checkpoint->modelType().empty() && checkpoint->modelType() != plan.modelType)
    inputError("{}/manifest.json: a checkpoint of a '{}' model, but the plan is for '{}'",
               weightsPath, checkpoint->modelType(), plan.modelType);
  std::unique_ptr<RankExecutor> executor = RankExecutor::create(
      chooseDevice(plan, planPath, deviceName, "moec compile --train --target cuda"));
  executor->prepare(plan, comm.rank(), *checkpoint, comm);
  checkNoUnexpectedTensors(plan, *checkpoint);
  if (steps > 0) {
    TrainRun run;
    run.steps = steps;
    run.metricsOut = metricsOut;
    run.weightsOut = weightsOut;
    run.save = save;
    run.saveEvery = saveEvery;
    run.planPath = planPath;
    run.layout = plan.layout;
    run.model = checkpointModel(*checkpoint, weightsPath, plan.modelType, plan.layout->source);
    const std::vector<const PlanProgram *> entries = plan.entriesOf(comm.rank());
    const PlanProgram &optimizer = **std::find_if(
        entries.begin(), entries.end(), [](const PlanProgram *p) { return p->entry == "optimizer"; });
    run.start.shuffleSeed = shuffleSeed;
    if (!resume.empty())
      run.start = resumeFrom(resume, *checkpoint, *executor, plan, comm.rank(), optimizer, B, L,
                             steps, shuffleSeed, !save.empty());
    if (optimizer.microBatches % plan.degrees.dp)
      inputError("{}: {} micro-batches of an update do not split between {} data-parallel "
                 "replicas",
                 planPath, optimizer.microBatches, plan.degrees.dp);
    trainSteps(*executor, plan, program, optimizer, tokens, targets, run, comm);
    if (profile) { // the train program's steps over the micro-batches this run ran,
                   // then the optimizer program's over its updates
      printProfile(program, executor->stepSeconds(),
                   (steps - run.start.step) * optimizer.microBatches);
      printProfile(optimizer, executor->stepSeconds("optimizer"), steps - run.start.step,
                   "update");
    }
    if (reportMemory)
      printTrainingMemory(plan, *executor, comm.rank());
    return 0;
  }

  // The gradients of the mean loss over the micro-batches (each micro-batch's
  // added in order, then divided), one f32 tensor per weight.
  std::vector<std::vector<float>> sums(program.gradients.size());
  std::string metrics;
  std::vector<float> loss, gradient;
  for (int64_t m = 0; m < batches; ++m) {
    const Batch batch = samples.microBatch(m);
    // The step (forward and backward) and the gradients' read-out and sum
    // over the micro-batches, timed apart (the optimizer of part 2 will
    // take the gradients where they are).
    using Clock = std::chrono::steady_clock;
    auto since = [](Clock::time_point t) {
      return std::chrono::duration<double>(Clock::now() - t).count();
    };
    const auto started = Clock::now();
    executor->forward(batch, loss);
    const double seconds = since(started);
    const auto summing = Clock::now();
    double squares = 0;
    for (size_t i = 0; i < sums.size(); ++i) {
      executor->readGradient(i, gradient);
      squares += accumulate(gradient, sums[i]);
    }
    const double gradSeconds = since(summing);
    std::string norm =
        sums.empty() ? std::string() : fmt::format(" grad_norm {:.6f}", std::sqrt(squares));
    fmt::print("micro-batch {}: loss {:.6f} ce {:.6f} aux {:.6f} z {:.6f}{} ({} tokens, "
               "{:.0f} tokens/s)\n",
               m, loss[0], loss[1], loss[2], loss[3], norm, batch.size(), batch.size() / seconds);
    nlohmann::ordered_json line = {{"micro_batch", m}, {"loss", loss[0]}, {"ce", loss[1]},
                                   {"aux", loss[2]},   {"z", loss[3]}};
    if (!sums.empty())
      line["grad_norm"] = std::sqrt(squares);
    line["tokens"] = batch.size();
    line["seconds"] = seconds;
    if (!sums.empty())
      line["grad_sum_seconds"] = gradSeconds;
    metrics += line.dump() + "\n";
  }
  if (profile)
    printProfile(program, executor->stepSeconds(), batches);
  if (reportMemory)
    printTrainingMemory(plan, *executor, comm.rank());
  if (!metricsOut.empty())
    writeFileAtomically(metricsOut, metrics);
  if (!gradsOut.empty()) {
    std::vector<TensorToWrite> tensors;
    for (size_t i = 0; i < sums.size(); ++i) {
      for (float &g : sums[i])
        g /= static_cast<float>(batches);
      appendByName(program.weights[program.gradients[i].weight], sums[i], tensors);
    }
    writeSafetensors(gradsOut, tensors);
  }
  std::fflush(stdout);
  return 0;
}

} // namespace moert
