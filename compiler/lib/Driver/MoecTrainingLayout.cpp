//===- MoecTrainingLayout.cpp - a training plan's memory and time --*- C++ -*-===//
//
// The planner's training mode (docs/training.md, "Choosing ZeRO and
// recompute"): each candidate (tensor and expert parallelism, the ZeRO
// stage over the data-parallel replicas, what the backward pass
// recomputes) gets the
// training memory model of the programs it compiles to
// (moe::rankProgramMemory: what moert train --report-memory measures) and
// a time model of one update on a rank; the
// fastest candidate whose memory fits the budget is chosen, and --explain
// prints them all with the share of the update that is communication no
// computation hides.
//
//===----------------------------------------------------------------------===//
#include "MoecOptions.h"
#include "TrainingTimeModel.h"
#include "moe/Analysis/Cluster.h"
#include "moe/Dialect/Exec/IR/ExecOps.h"
#include "moe/Target/PlanWriter.h"
#include "moe/Transforms/Layout.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/WithColor.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>

using namespace llvm;
using namespace moe;

namespace {

using namespace moe::driver::timing;

struct Candidate {
  int64_t tp, ep;
  int64_t zero;
  Recompute recompute;
  UpdateTime time;
  std::optional<moe::RankProgramMemory> memory;
  int64_t pp = 1;     ///< pipeline stages (one replica's layers over pp ranks)
  double bubble = 0;  ///< of a pipelined one: the share of its stages' time idle

  /// Data-parallel replicas of `world` ranks.
  int64_t replicas(int64_t world) const { return world / (tp * pp); }
};

} // namespace

Error driver::chooseTrainingLayout(mlir::MLIRContext &context, mlir::ModuleOp module,
                                   CompileOptions &options, const TrainingChoice &request) {
  if (!options.train || options.lossOnly || (!request.recomputeAuto && !request.zeroAuto &&
                                             !options.explain))
    return Error::success();
  const int64_t givenTp = options.layout ? std::max<int64_t>(options.layout->tp, 1) : 1;
  const int64_t world = (options.layout ? options.layout->dp : 1) * givenTp;
  const hf::ModelConfig &config = *request.config;
  const sharding::Cluster machine = *sharding::builtinCluster("cpu");
  // The CPU machine's ranks share its memory.
  const int64_t budget =
      request.budget > 0 ? request.budget
                         : int64_t(0.9 * double(machine.memoryBytes) / double(world));
  auto measure = [&](Candidate &c, mlir::ModuleOp *keep = nullptr) -> Error {
    mlir::OwningOpRef<mlir::ModuleOp> probe = module.clone();
    CompileOptions trial = options;
    trial.recomputeExperts = c.recompute.experts;
    trial.recomputeLayers = c.recompute.layers;
    if (trial.optimizer)
      trial.optimizer->zero = c.zero;
    if (trial.layout) {
      trial.layout->ep = c.ep;
      trial.layout->tp = c.tp;
      trial.layout->dp = world / c.tp;
    }
    trial.output.clear();
    trial.explain = false;
    trial.target = "cpu"; // (the memory is the programs', whatever the target)
    if (c.pp > 1) { // (its time too: the stages' 1F1B, from their programs)
      trial.layout->pp = c.pp;
      trial.layout->dp = c.replicas(world);
      std::optional<mlir::ScopedDiagnosticHandler> quiet;
      quiet.emplace(&context, [](mlir::Diagnostic &) { return mlir::success(); });
      Expected<PipelineEstimate> e = estimatePipeline(context, module, trial, config, c.recompute);
      if (!e)
        return e.takeError();
      c.memory = e->memory;
      c.time = e->time;
      c.bubble = e->bubble;
      return Error::success();
    }
    mlir::PassManager pm(&context);
    buildPipeline(pm, trial, Phase::Exec);
    // (A tensor-parallel candidate the model refuses is no candidate:
    // measured quietly.)
    std::optional<mlir::ScopedDiagnosticHandler> quiet;
    if (c.tp != givenTp)
      quiet.emplace(&context, [](mlir::Diagnostic &) { return mlir::success(); });
    if (mlir::failed(pm.run(*probe)))
      return createStringError(inconvertibleErrorCode(),
                               "the training programs do not compile (choosing --recompute / "
                               "--zero)");
    Expected<moe::RankProgramMemory> memory = moe::rankProgramMemory(*probe);
    if (!memory)
      return memory.takeError();
    c.memory = *memory;
    if (keep)
      *keep = probe.release();
    return Error::success();
  };

  // The candidates: the given choices, or every one where auto.
  const SmallVector<Recompute> recomputes =
      recomputeCandidates(options, request.recomputeAuto);
  // Expert parallelism: as given, or (the planner's layout) every degree
  // that divides the replicas and the experts.
  const int64_t replicas = world / givenTp;
  SmallVector<int64_t> eps{options.layout ? options.layout->ep : 1};
  if (request.expertsAuto && replicas > 1 && options.optimizer && givenTp == 1)
    for (int64_t ep = 2; ep <= replicas; ++ep)
      if (replicas % ep == 0 && request.config->numExperts > 0 &&
          request.config->numExperts % ep == 0)
        eps.push_back(ep);
  auto zerosOver = [&](int64_t dp) -> SmallVector<int64_t> {
    if (request.zeroAuto && dp > 1 && options.optimizer)
      return {0, 1, 2};
    // (A given stage stands with one replica too: moec refused it unless
    // an expert stack's edp group shards it.)
    return {options.optimizer ? options.optimizer->zero : 0};
  };
  SmallVector<Candidate> candidates;
  for (int64_t ep : eps)
    for (int64_t zero : zerosOver(replicas))
      for (const Recompute &r : recomputes)
        candidates.push_back({givenTp, ep, zero, r, {}, std::nullopt});
  // Tensor parallelism (--world-size N alone): every T > 1 dividing the
  // ranks and the attention heads, the other N / T ranks replicas.
  if (request.tensorAuto && options.optimizer)
    for (int64_t tp = 2; tp <= world; ++tp)
      if (world % tp == 0 && config.numHeads % tp == 0 &&
          (config.numKVHeads == 0 || config.numKVHeads % tp == 0))
        for (int64_t zero : zerosOver(world / tp))
          for (const Recompute &r : recomputes)
            candidates.push_back({tp, 1, zero, r, {}, std::nullopt});
  // Pipeline stages (--world-size N alone): every P > 1 dividing the ranks,
  // up to the layers, the other N / P ranks replicas; each timed as 1F1B
  // over its stages (its bubble counted) when it is compiled.
  if (request.tensorAuto && options.optimizer)
    for (int64_t pp = 2; pp <= world && pp <= config.numLayers; ++pp)
      if (world % pp == 0)
        for (int64_t zero : zerosOver(world / pp))
          for (const Recompute &r : recomputes)
            candidates.push_back({1, 1, zero, r, {}, std::nullopt, pp});

  // The time model needs the trained weights: the first candidate's
  // programs give them.
  mlir::ModuleOp first;
  if (Error e = measure(candidates.front(), &first))
    return e;
  const Workload work = workloadOf(first, *request.config, candidates.front().ep);
  first.erase();
  const int64_t micro = options.optimizer ? options.optimizer->microBatches : 1;
  const bool bf16 = work.weightBytes < 3 * work.parameters; // (bf16 compute weights)
  // (A pipelined candidate's time needs its programs: measured now.)
  std::vector<bool> dropped(candidates.size(), false);
  for (auto [i, c] : llvm::enumerate(candidates)) {
    if (c.pp > 1) {
      if (Error e = measure(c)) {
        consumeError(std::move(e));
        dropped[i] = true;
        c.time.compute = std::numeric_limits<double>::infinity();
      }
      continue;
    }
    c.time = updateTime(work, machine, world / c.tp, c.tp, c.ep, c.zero, c.recompute,
                        double(options.maxBatchTokens),
                        std::max<int64_t>(1, micro / (world / c.tp)), bf16,
                        options.optimizer.has_value(), config);
  }
  // The fastest that fits; measured in that order (all of them to explain).
  SmallVector<size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return candidates[a].time.total() < candidates[b].time.total();
  });
  // (Notes as they are tried: "--recompute auto: ..." on one rank.)
  const std::string label =
      request.zeroAuto && world > 1 ? "training layout" : "--recompute auto";
  auto named = [&](const Candidate &c) {
    return std::string(c.recompute.what) +
           (c.replicas(world) > 1 ? formatv(", ZeRO-{0}", c.zero).str() : std::string()) +
           (c.pp > 1 ? formatv(", pipeline stages over pp = {0}", c.pp).str() : std::string()) +
           (c.ep > 1 ? formatv(", experts split over ep = {0}", c.ep).str() : std::string()) +
           (c.tp > 1 ? formatv(", tensor parallelism over tp = {0}", c.tp).str()
                     : std::string());
  };
  // (A tensor-parallel or pipelined candidate that does not compile is
  // dropped.)
  auto tryMeasure = [&](size_t i) -> Error {
    if (Error e = measure(candidates[i])) {
      if (candidates[i].tp == givenTp)
        return e;
      consumeError(std::move(e));
      dropped[i] = true;
    }
    return Error::success();
  };
  std::optional<size_t> chosen;
  for (size_t i : order) {
    Candidate &c = candidates[i];
    if (!c.memory && !dropped[i] && (options.explain || !chosen))
      if (Error e = tryMeasure(i))
        return e;
    if (chosen || !c.memory)
      continue;
    if (c.memory->total() <= budget)
      chosen = i;
    else if (i != order.back())
      WithColor::note(errs(), "moec")
          << label << ": the training programs hold " << c.memory->total() << " bytes with "
          << named(c) << ", over the budget of " << budget << "\n";
  }
  bool fits = chosen.has_value();
  if (!chosen) { // none fits: the least memory
    for (size_t i = 0; i < candidates.size(); ++i)
      if (!candidates[i].memory && !dropped[i])
        if (Error e = tryMeasure(i))
          return e;
    for (size_t i = 0; i < candidates.size(); ++i)
      if (candidates[i].memory &&
          (!chosen || candidates[i].memory->total() < candidates[*chosen].memory->total()))
        chosen = i;
  }
  const Candidate &pick = candidates[*chosen];
  options.recomputeExperts = pick.recompute.experts;
  options.recomputeLayers = pick.recompute.layers;
  if (options.optimizer)
    options.optimizer->zero = pick.zero;
  if (options.layout) {
    options.layout->ep = pick.ep;
    options.layout->tp = pick.tp;
    options.layout->pp = pick.pp;
    options.layout->dp = pick.replicas(world);
  }
  if (*chosen != order.front() || !fits) {
    // (The options that give the choice: "--zero 1 --recompute none", or
    // on one rank the recompute's name alone.)
    std::string flags;
    if (pick.tp > 1)
      flags += formatv("--tp {0} --dp {1} ", pick.tp, pick.replicas(world)).str();
    if (pick.pp > 1)
      flags += formatv("--pp {0} --dp {1} ", pick.pp, pick.replicas(world)).str();
    if (pick.ep > 1)
      flags += formatv("--ep {0} ", pick.ep).str();
    if (pick.replicas(world) > 1)
      flags += formatv("--zero {0} ", pick.zero).str();
    if (!flags.empty())
      flags += "--recompute ";
    WithColor::note(errs(), "moec")
        << label << ": " << flags << pick.recompute.name << " (" << named(pick) << ": "
        << pick.memory->total() << " bytes" << (fits ? "" : ", still over the budget") << ")\n";
  }
  // A pipelined choice: each stage's recompute (as fast as fits), and with
  // --explain each stage's memory and time.
  auto pipelineDetail = [&]() -> Error {
    return pick.pp > 1 ? choosePipelineRecompute(context, module, options, request)
                       : Error::success();
  };
  if (!options.explain)
    return pipelineDetail();
  // (The pp column where pipelines were weighed; a pipelined candidate's
  // compute is its stages' 1F1B, bubble included.)
  const bool pipelines = llvm::any_of(candidates, [](const Candidate &c) { return c.pp > 1; });
  auto lead = [&](auto dp, auto tp, auto pp) {
    return pipelines ? formatv("{0,-3} {1,-3} {2,-3}", dp, tp, pp).str()
                     : formatv("{0,-3} {1,-3}", dp, tp).str();
  };
  if (candidates.size() > 1) {
    outs() << formatv("training layouts of a rank ({0} rank{1}: dp x tp{2}; time of an "
                      "update on the {3} machine, nothing overlapped{4}; bytes):\n",
                      world, world > 1 ? "s" : "", pipelines ? " x pp" : "", machine.name,
                      pipelines ? ", a pipeline's bubble in its compute" : "");
    outs() << formatv("  {0} {1,-3} {2,-5} {3,-10} {4,14} {5,11} {6,11} {7,11} "
                      "{8,14} {9,7}\n",
                      lead("dp", "tp", "pp"), "ep", "zero", "recompute", "memory", "compute s",
                      "optimizer s", "comm s", "comm bytes", "comm %");
    for (size_t i : order) {
      const Candidate &c = candidates[i];
      if (dropped[i])
        continue;
      outs() << formatv("  {0} {1,-3} {2,-5} {3,-10} {4,14} {5,11:e2} {6,11:e2} "
                        "{7,11:e2} {8,14:f0} {9,6:f1}%{10}\n",
                        lead(c.replicas(world), c.tp, c.pp), c.ep, c.zero, c.recompute.name,
                        c.memory ? std::to_string(c.memory->total()) : std::string("-"),
                        c.time.compute, c.time.optimizer, c.time.comm, c.time.commBytes,
                        100 * c.time.comm / c.time.total(),
                        i == *chosen ? "  <- chosen" : (c.memory && c.memory->total() > budget
                                                           ? "  over the budget"
                                                           : ""));
    }
  }
  if (pick.pp > 1)
    return pipelineDetail();
  // The training memory model of the choice, as moert --report-memory
  // measures it.
  const moe::RankProgramMemory &memory = *pick.memory;
  outs() << "training memory of the rank (its compiled programs, " << pick.recompute.what
         << "; bytes):\n";
  outs() << formatv("  {0,-28} {1,14}\n", "weights", memory.weights);
  outs() << formatv("  {0,-28} {1,14}\n", "KV caches", memory.kvCache);
  outs() << formatv("  {0,-28} {1,14}\n", "buffers (activations, grads)", memory.buffers);
  for (const auto &[kind, kindBytes] : memory.state)
    outs() << formatv("  {0,-28} {1,14}\n", "state " + kind, kindBytes);
  outs() << formatv("  {0,-28} {1,14}   budget {2}: recompute {3}{4}\n", "total",
                    memory.total(), budget, pick.recompute.name,
                    (world / pick.tp > 1 || pick.zero > 0 ? formatv(", zero {0}", pick.zero).str()
                                         : std::string()) +
                        (pick.ep > 1 ? formatv(", ep {0}", pick.ep).str() : std::string()) +
                        (pick.tp > 1 ? formatv(", tp {0}", pick.tp).str() : std::string()));
  outs() << formatv("communication not overlapped: {0:f1}% of the update ({1:e2} s of "
                    "{2:e2} s)\n",
                    100 * pick.time.comm / pick.time.total(), pick.time.comm,
                    pick.time.total());
  if (options.ranksPerProcess > 1)
    outs() << formatv("--tp-arithmetic: {0} runs {1} of these ranks (a process holds {1} x "
                      "the rank's memory)\n",
                      world == options.ranksPerProcess
                          ? std::string("the one process")
                          : formatv("each of the {0} processes", world / options.ranksPerProcess)
                                .str(),
                      options.ranksPerProcess);
  return Error::success();
}
