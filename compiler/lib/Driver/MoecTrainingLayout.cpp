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
#include <numeric>
#include <optional>

using namespace llvm;
using namespace moe;

namespace {

struct Recompute {
  const char *name, *what;
  bool experts, layers;
};
const Recompute kNone{"none", "every intermediate saved", false, false},
    kSelective{"selective", "the experts' intermediates recomputed", true, false},
    kFull{"full", "whole layers recomputed", false, true};

/// What the update's time depends on, from the compiled programs.
struct Workload {
  double parameters = 0;       ///< trained elements
  double weightBytes = 0;      ///< their bytes as the weights hold them
  double active = 0;           ///< multiply-add parameters a token uses
  double activeExperts = 0;    ///< of which in routed experts
  int64_t tensors = 0;         ///< trained tensors (collectives per kind)
  double expertParameters = 0; ///< trained elements of routed expert stacks
  int64_t expertTensors = 0;   ///< routed expert stacks (3 per MoE layer)
};

/// (The whole model's: each weight's logical shape, moe.logical_weights,
/// where a rank holds a part of it (its experts, its TP part); else its
/// shape, an expert stack's 1/ep of the experts scaled by `ep`.)
Workload workloadOf(mlir::ModuleOp module, const hf::ModelConfig &config, int64_t ep) {
  Workload w;
  const llvm::StringMap<mlir::Type> logical = moe::logicalWeightTypes(module);
  // The weights the train program differentiates (the optimizer's).
  for (auto program : module.getOps<exec::ProgramOp>()) {
    if (program.getEntry() != "train")
      continue;
    auto ret = cast<exec::ReturnOp>(program.getBody().front().getTerminator());
    for (mlir::Value trained : ret.getGradientOf()) {
      auto weight = trained.getDefiningOp<exec::WeightOp>();
      auto type = cast<mlir::RankedTensorType>(weight.getTensorType());
      auto whole = logical.find(weight.getTensor());
      const double n = whole != logical.end()
                           ? static_cast<double>(
                                 cast<mlir::ShapedType>(whole->second).getNumElements())
                           : static_cast<double>(type.getNumElements()) *
                                 (weight.getExpertsAttr() ? static_cast<double>(ep) : 1.0);
      w.parameters += n;
      w.weightBytes += n * (type.getElementType().isBF16() ? 2 : 4);
      ++w.tensors;
      // A lookup table is no product (unless it is the tied LM head).
      const bool lookup = weight.getTensor().ends_with("embed_tokens.weight") &&
                          !config.tieWordEmbeddings;
      if (weight.getExpertsAttr() && config.numExperts > 0) {
        w.expertParameters += n;
        ++w.expertTensors;
        const double used = n * static_cast<double>(config.expertsPerToken) /
                            static_cast<double>(config.numExperts);
        w.active += used;
        w.activeExperts += used;
      } else if (type.getRank() >= 2 && !lookup) {
        w.active += n;
      }
    }
    break;
  }
  return w;
}

/// One update on a rank, in seconds: nothing overlaps (moert runs each
/// collective between kernels).
struct UpdateTime {
  double compute = 0, optimizer = 0, comm = 0;
  double commBytes = 0; ///< sent by the rank
  double total() const { return compute + optimizer + comm; }
};

/// The time model: forward 2 FLOPs per active parameter and token, the
/// backward pass twice that, a recomputed forward once more (selective:
/// the experts' part); AdamW streams its states (about 7 f32 per parameter
/// it updates) through memory; and what the rank sends over its link:
/// the fixed-order all_reduce of the sums and errors (4 f32 per parameter
/// x (N - 1) / N; ZeRO-1: its reduce_scatter half), ZeRO's all_gather of
/// the weights ((N - 1) / N of their bytes), ZeRO-2's reduce_scatter per
/// micro-batch instead (2 f32 per parameter x (N - 1) / N each). Expert
/// parallelism over ep of the replicas: a rank holds and updates 1/ep of
/// the routed experts (whose backward recomputes their gate and up
/// products), whose sums (and ZeRO shards) go over edp = N / ep
/// replicas only, and sends (ep - 1) / ep of its routed rows (k per token,
/// H f32 each) four times per MoE layer and micro-batch (the blocks and the
/// outputs, then their gradients). Tensor parallelism over tp ranks of a
/// replica: each computes 1/tp of its FLOPs and holds 1/tp of the dense
/// weights (the experts whole, their sums over edp = N tp / ep), and
/// all_reduces the replica's activations four times per layer and
/// micro-batch (attention's and the MLP's outputs, then their input
/// gradients: 2 (tp - 1) / tp of tokens x H f32 each).
UpdateTime updateTime(const Workload &w, const sharding::Cluster &machine, int64_t replicas,
                      int64_t tp, int64_t ep, int64_t zero, const Recompute &recompute,
                      double tokensPerMicroBatch, int64_t microBatchesPerReplica, bool bf16,
                      bool optimizer, const hf::ModelConfig &config) {
  UpdateTime t;
  const double N = static_cast<double>(replicas), share = static_cast<double>(microBatchesPerReplica);
  const double T = static_cast<double>(tp), E = static_cast<double>(ep);
  const double dense = (w.parameters - w.expertParameters) / T;
  // The CPU machine's ranks are processes sharing its cores and memory.
  const double ways = machine.name == "cpu" ? N * T : 1;
  const double peak = machine.peakFlops(bf16 ? sharding::DType::BF16 : sharding::DType::F32) / ways;
  double flopsPerToken = 6 * w.active;
  if (recompute.layers)
    flopsPerToken += 2 * w.active;
  else if (recompute.experts)
    flopsPerToken += 2 * w.activeExperts;
  else if (ep > 1 || tp > 1) // (expert_ffn_grad recomputes the gate and up products)
    flopsPerToken += 2 * w.activeExperts * 2 / 3;
  t.compute = share * tokensPerMicroBatch * flopsPerToken / (peak * T);
  const double held = dense + w.expertParameters / E, edp = N * T / E;
  const double updated =
      zero >= 1 ? dense / N + (w.expertParameters / E) / (edp > 1 ? edp : 1) : held;
  t.optimizer = optimizer ? 7 * 4 * updated / (machine.memoryBandwidth / ways) : 0;
  if (replicas * tp > 1) {
    double collectives = 0;
    // The sums of `params` parameters in `tensors` tensors over n members.
    auto reduce = [&](double params, double tensors, double n) {
      if (n <= 1)
        return;
      const double others = (n - 1) / n;
      if (zero == 0) {
        t.commBytes += 4 * 4 * params * others;
        collectives += 2 * tensors;
      } else if (zero == 1) { // the reduce_scatter half of it
        t.commBytes += 2 * 4 * params * others;
        collectives += tensors + 2;
      } else {
        t.commBytes += share * 2 * 4 * params * others;
        collectives += share * tensors + 2;
      }
      if (zero >= 1) { // the updated weights gathered
        t.commBytes += w.weightBytes / w.parameters * params * others;
        collectives += tensors;
      }
    };
    const double expertTensors = static_cast<double>(w.expertTensors);
    reduce(dense, static_cast<double>(w.tensors) - expertTensors, N);
    reduce(w.expertParameters / E, expertTensors, edp);
    if (tp > 1) {
      const double layers = static_cast<double>(config.numLayers);
      t.commBytes += share * layers * 4 * tokensPerMicroBatch *
                     static_cast<double>(config.hiddenSize) * 4 * 2 * (T - 1) / T;
      collectives += share * layers * 4;
    }
    if (ep > 1) {
      const double moeLayers = expertTensors / 3;
      t.commBytes += share * moeLayers * 4 * tokensPerMicroBatch *
                     static_cast<double>(config.expertsPerToken) *
                     static_cast<double>(config.hiddenSize) * 4 * (E - 1) / E;
      collectives += share * moeLayers * 4 + 1;
    }
    const sharding::Link &link = replicas * tp <= machine.devicesPerNode || machine.name == "cpu"
                                     ? machine.intraNode
                                     : machine.interNode;
    t.comm = t.commBytes / link.bandwidth + collectives * link.latency;
  }
  return t;
}

struct Candidate {
  int64_t tp, ep;
  int64_t zero;
  Recompute recompute;
  UpdateTime time;
  std::optional<moe::RankProgramMemory> memory;
};

} // namespace

Error driver::chooseTrainingLayout(mlir::MLIRContext &context, mlir::ModuleOp module,
                                   CompileOptions &options, const TrainingChoice &request) {
  if (!options.train || options.lossOnly || (!request.recomputeAuto && !request.zeroAuto &&
                                             !options.explain))
    return Error::success();
  const int64_t givenTp = options.layout ? std::max<int64_t>(options.layout->tp, 1) : 1;
  const int64_t world = (options.layout ? options.layout->dp : 1) * givenTp;
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
  SmallVector<Recompute> recomputes;
  if (!request.recomputeAuto)
    recomputes.push_back(options.recomputeLayers    ? kFull
                         : options.recomputeExperts ? kSelective
                                                    : kNone);
  else if (options.capacityFactor == 0)
    recomputes = {kNone, kSelective, kFull};
  else
    recomputes = {kNone, kFull};
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
    return {options.optimizer && dp > 1 ? options.optimizer->zero : 0};
  };
  SmallVector<Candidate> candidates;
  for (int64_t ep : eps)
    for (int64_t zero : zerosOver(replicas))
      for (const Recompute &r : recomputes)
        candidates.push_back({givenTp, ep, zero, r, {}, std::nullopt});
  // Tensor parallelism (--world-size N alone): every T > 1 dividing the
  // ranks and the attention heads, the other N / T ranks replicas.
  const hf::ModelConfig &config = *request.config;
  if (request.tensorAuto && options.optimizer)
    for (int64_t tp = 2; tp <= world; ++tp)
      if (world % tp == 0 && config.numHeads % tp == 0 &&
          (config.numKVHeads == 0 || config.numKVHeads % tp == 0))
        for (int64_t zero : zerosOver(world / tp))
          for (const Recompute &r : recomputes)
            candidates.push_back({tp, 1, zero, r, {}, std::nullopt});

  // The time model needs the trained weights: the first candidate's
  // programs give them.
  mlir::ModuleOp first;
  if (Error e = measure(candidates.front(), &first))
    return e;
  const Workload work = workloadOf(first, *request.config, candidates.front().ep);
  first.erase();
  const int64_t micro = options.optimizer ? options.optimizer->microBatches : 1;
  const bool bf16 = work.weightBytes < 3 * work.parameters; // (bf16 compute weights)
  for (Candidate &c : candidates)
    c.time = updateTime(work, machine, world / c.tp, c.tp, c.ep, c.zero, c.recompute,
                        double(options.maxBatchTokens),
                        std::max<int64_t>(1, micro / (world / c.tp)), bf16,
                        options.optimizer.has_value(), config);
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
           (world / c.tp > 1 ? formatv(", ZeRO-{0}", c.zero).str() : std::string()) +
           (c.ep > 1 ? formatv(", experts split over ep = {0}", c.ep).str() : std::string()) +
           (c.tp > 1 ? formatv(", tensor parallelism over tp = {0}", c.tp).str()
                     : std::string());
  };
  // (A tensor-parallel candidate that does not compile is dropped.)
  std::vector<bool> dropped(candidates.size(), false);
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
    options.layout->dp = world / pick.tp;
  }
  if (*chosen != order.front() || !fits) {
    // (The options that give the choice: "--zero 1 --recompute none", or
    // on one rank the recompute's name alone.)
    std::string flags;
    if (pick.tp > 1)
      flags += formatv("--tp {0} --dp {1} ", pick.tp, world / pick.tp).str();
    if (pick.ep > 1)
      flags += formatv("--ep {0} ", pick.ep).str();
    if (world / pick.tp > 1)
      flags += formatv("--zero {0} ", pick.zero).str();
    if (!flags.empty())
      flags += "--recompute ";
    WithColor::note(errs(), "moec")
        << label << ": " << flags << pick.recompute.name << " (" << named(pick) << ": "
        << pick.memory->total() << " bytes" << (fits ? "" : ", still over the budget") << ")\n";
  }
  if (!options.explain)
    return Error::success();
  if (candidates.size() > 1) {
    outs() << formatv("training layouts of a rank ({0} rank{1}: dp x tp; time of an "
                      "update on the {2} machine, nothing overlapped; bytes):\n",
                      world, world > 1 ? "s" : "", machine.name);
    outs() << formatv("  {0,-3} {1,-3} {2,-3} {3,-5} {4,-10} {5,14} {6,11} {7,11} {8,11} "
                      "{9,14} {10,7}\n",
                      "dp", "tp", "ep", "zero", "recompute", "memory", "compute s",
                      "optimizer s", "comm s", "comm bytes", "comm %");
    for (size_t i : order) {
      const Candidate &c = candidates[i];
      if (dropped[i])
        continue;
      outs() << formatv("  {0,-3} {1,-3} {2,-3} {3,-5} {4,-10} {5,14} {6,11:e2} {7,11:e2} "
                        "{8,11:e2} {9,14:f0} {10,6:f1}%{11}\n",
                        world / c.tp, c.tp, c.ep, c.zero, c.recompute.name,
                        c.memory ? std::to_string(c.memory->total()) : std::string("-"),
                        c.time.compute, c.time.optimizer, c.time.comm, c.time.commBytes,
                        100 * c.time.comm / c.time.total(),
                        i == *chosen ? "  <- chosen" : (c.memory && c.memory->total() > budget
                                                           ? "  over the budget"
                                                           : ""));
    }
  }
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
                    (world / pick.tp > 1 ? formatv(", zero {0}", pick.zero).str()
                                         : std::string()) +
                        (pick.ep > 1 ? formatv(", ep {0}", pick.ep).str() : std::string()) +
                        (pick.tp > 1 ? formatv(", tp {0}", pick.tp).str() : std::string()));
  outs() << formatv("communication not overlapped: {0:f1}% of the update ({1:e2} s of "
                    "{2:e2} s)\n",
                    100 * pick.time.comm / pick.time.total(), pick.time.comm,
                    pick.time.total());
  return Error::success();
}

Error driver::explainPipeline(mlir::MLIRContext &context, mlir::ModuleOp module,
                              const CompileOptions &options) {
  mlir::OwningOpRef<mlir::ModuleOp> probe = module.clone();
  CompileOptions trial = options;
  trial.output.clear();
  trial.explain = false;
  mlir::PassManager pm(&context);
  buildPipeline(pm, trial, Phase::Exec);
  if (mlir::failed(pm.run(*probe)))
    return createStringError(inconvertibleErrorCode(), "the training programs do not compile");
  auto schedule = (*probe)->getAttrOfType<mlir::ArrayAttr>("moe.pipeline_schedule");
  auto sharding = (*probe)->getAttrOfType<mlir::DictionaryAttr>("moe.sharding");
  auto begins = sharding ? sharding.getAs<mlir::DenseI64ArrayAttr>("stage_begin") : nullptr;
  if (!schedule || !begins)
    return createStringError(inconvertibleErrorCode(), "no pipeline schedule was made");
  const int64_t pp = int64_t(schedule.size());
  const int64_t m = int64_t(cast<mlir::ArrayAttr>(schedule[0]).size()) / 2;
  outs() << formatv("pipeline: {0} stages, 1F1B over {1} micro-batches per replica and update "
                    "(moe.pipeline_schedule); each stage's memory (its compiled programs; "
                    "bytes):\n",
                    pp, m);
  outs() << formatv("  {0,-6} {1,-9} {2,12} {3,14} {4,20} {5,14} {6,14}\n", "stage", "layers",
                    "weights", "buffers", "kept (slots)", "states", "total");
  auto model = (*probe)->getAttrOfType<mlir::DictionaryAttr>("moe.model_sizes");
  auto total = model ? model.getAs<mlir::IntegerAttr>("num_layers") : nullptr;
  for (int64_t s = 0; s < pp; ++s) {
    Expected<moe::RankProgramMemory> memory = moe::rankProgramMemory(*probe, s);
    if (!memory)
      return memory.takeError();
    int64_t states = 0;
    for (const auto &kind : memory->state)
      states += kind.second;
    const int64_t first = begins[s],
                  end = s + 1 < int64_t(begins.size()) ? begins[s + 1]
                                                       : (total ? total.getInt() : first);
    outs() << formatv("  {0,-6} {1,-9} {2,12} {3,14} {4,20} {5,14} {6,14}\n", s,
                      formatv("[{0}, {1})", first, end).str(), memory->weights + memory->kvCache,
                      memory->buffers,
                      formatv("{0} ({1})", memory->kept, moe::stashSlots(*probe, s)).str(), states,
                      memory->total());
  }
  outs() << formatv("bubble of equal stages: (pp - 1) / (m + pp - 1) = {0:f1}% of the update\n",
                    100.0 * double(pp - 1) / double(m + pp - 1));
  return Error::success();
}
