//===- MoecPipeline.cpp - recompute per pipeline stage, the bubble -*- C++ -*-===//
//
// The planner's training mode over pipeline stages (moec compile --train
// --pp P; docs/training.md, "Pipeline parallelism"). The stages are given;
// what each stage's backward pass recomputes is chosen per stage: the
// first stage keeps up to pp micro-batches' values in flight, the last one,
// so the first may need to recompute where the last need not. Each
// recompute (none, selective, full) is compiled for all stages; each stage
// takes the fastest whose memory (moe::rankProgramMemory of its programs,
// the kept values in every slot its schedule needs) fits the budget. The
// time model (TrainingTimeModel.h) gives each stage's seconds per
// micro-batch; the update is 1F1B over them, (m - 1) max + sum, plus the
// optimizer and the communication of the slowest stage, and the bubble is
// the share of the stages' time spent waiting.
//
//===----------------------------------------------------------------------===//
#include "MoecOptions.h"
#include "TrainingTimeModel.h"
#include "moe/Target/PlanWriter.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/WithColor.h"

#include <algorithm>
#include <numeric>

using namespace llvm;
using namespace moe;
using namespace moe::driver::timing;

namespace {

Error failure(const Twine &message) {
  return createStringError(inconvertibleErrorCode(), "%s", message.str().c_str());
}

/// 1F1B over the stages' seconds per micro-batch: the slowest sets the
/// steady state, the others add their fill and drain once.
double pipelineSeconds(ArrayRef<double> t, int64_t m) {
  return double(m - 1) * *std::max_element(t.begin(), t.end()) +
         std::accumulate(t.begin(), t.end(), 0.0);
}

/// One compile of the training programs: each stage's memory and time.
struct Trial {
  Recompute recompute;
  std::vector<moe::RankProgramMemory> memory;
  SmallVector<int64_t> slots;
  /// Seconds per micro-batch (forward and backward), and the update's
  /// (its optimizer and communication, which nothing overlaps).
  SmallVector<double> microBatch;
  std::vector<UpdateTime> update;

  /// The update: 1F1B over the stages' micro-batches, then the slowest
  /// stage's optimizer and communication.
  UpdateTime total(int64_t m) const {
    UpdateTime t;
    t.compute = pipelineSeconds(microBatch, m);
    for (const UpdateTime &u : update) {
      t.optimizer = std::max(t.optimizer, u.optimizer);
      t.comm = std::max(t.comm, u.comm);
      t.commBytes = std::max(t.commBytes, u.commBytes);
    }
    return t;
  }

  /// The share of the stages' time idle in that 1F1B.
  double bubble(int64_t m) const {
    const double busy =
        double(m) * std::accumulate(microBatch.begin(), microBatch.end(), 0.0);
    return 1 - busy / (double(microBatch.size()) * pipelineSeconds(microBatch, m));
  }
};

/// The pipeline's shape, from a compiled module.
struct Shape {
  int64_t pp = 1, m = 1;
  SmallVector<int64_t> begin; ///< each stage's first layer, then the layers
};

class PipelinePlanner {
public:
  PipelinePlanner(mlir::MLIRContext &context, mlir::ModuleOp module,
                  const CompileOptions &options, const hf::ModelConfig &config)
      : context(context), module(module), options(options), config(config),
        machine(*sharding::builtinCluster("cpu")) {}

  /// Compiles `trial` options to exec programs.
  Expected<mlir::OwningOpRef<mlir::ModuleOp>> compile(CompileOptions trial) {
    mlir::OwningOpRef<mlir::ModuleOp> probe = module.clone();
    trial.output.clear();
    trial.explain = false;
    mlir::PassManager pm(&context);
    buildPipeline(pm, trial, Phase::Exec);
    if (mlir::failed(pm.run(*probe)))
      return failure("the training programs do not compile (choosing --recompute per "
                     "pipeline stage)");
    return std::move(probe);
  }

  /// The stages' memory and time: compiled with `trialOptions`, timed as
  /// recompute `r` on every stage.
  Expected<Trial> measure(const CompileOptions &trialOptions, const Recompute &r) {
    Expected<mlir::OwningOpRef<mlir::ModuleOp>> probe = compile(trialOptions);
    if (!probe)
      return probe.takeError();
    mlir::ModuleOp m = **probe;
    if (Error e = readShape(m))
      return std::move(e);
    Trial t{r, {}, {}, {}, {}};
    const LayoutRequest &l = *options.layout;
    const int64_t dp = std::max<int64_t>(l.dp, 1), tp = std::max<int64_t>(l.tp, 1),
                  ep = std::max<int64_t>(l.ep, 1);
    const int64_t zero = options.optimizer ? options.optimizer->zero : 0;
    for (int64_t s = 0; s < shape.pp; ++s) {
      Expected<moe::RankProgramMemory> memory = moe::rankProgramMemory(m, s);
      if (!memory)
        return memory.takeError();
      t.memory.push_back(*memory);
      t.slots.push_back(moe::stashSlots(m, s));
      Workload w = workloadOf(m, config, ep, s);
      w.layers = static_cast<double>(shape.begin[s + 1] - shape.begin[s]);
      const bool bf16 = w.weightBytes < 3 * w.parameters;
      const double tokens = static_cast<double>(options.maxBatchTokens);
      const UpdateTime one = updateTime(w, machine, dp, tp, ep, zero, r, tokens, 1, bf16,
                                        /*optimizer=*/false, config, shape.pp);
      const UpdateTime all = updateTime(w, machine, dp, tp, ep, zero, r, tokens, shape.m, bf16,
                                        options.optimizer.has_value(), config, shape.pp);
      // (Each micro-batch's activations sent up and their gradients down,
      // tokens x H f32 each way, to each neighbour.)
      const double p2p = double((s > 0) + (s + 1 < shape.pp)) * double(shape.m) * tokens *
                         double(config.hiddenSize) * 4;
      UpdateTime withSends = all;
      withSends.commBytes += p2p;
      withSends.comm += p2p / machine.intraNode.bandwidth +
                        2 * double(shape.m) * machine.intraNode.latency;
      t.microBatch.push_back(one.compute);
      t.update.push_back(withSends);
    }
    return t;
  }

  /// measure() with recompute `r` on every stage.
  Expected<Trial> measureUniform(const Recompute &r) {
    CompileOptions trial = options;
    trial.recomputeExperts = r.experts;
    trial.recomputeLayers = r.layers;
    trial.recomputeExpertsLayers.clear();
    trial.recomputeLayersOnly.clear();
    return measure(trial, r);
  }

  Shape shape;

private:
  Error readShape(mlir::ModuleOp m) {
    auto schedule = m->getAttrOfType<mlir::ArrayAttr>("moe.pipeline_schedule");
    auto sharding = m->getAttrOfType<mlir::DictionaryAttr>("moe.sharding");
    auto begins = sharding ? sharding.getAs<mlir::DenseI64ArrayAttr>("stage_begin") : nullptr;
    if (!schedule || !begins)
      return failure("no pipeline schedule was made");
    shape.pp = int64_t(schedule.size());
    shape.m = int64_t(cast<mlir::ArrayAttr>(schedule[0]).size()) / 2;
    shape.begin.assign(begins.asArrayRef().begin(), begins.asArrayRef().end());
    shape.begin.resize(shape.pp);
    shape.begin.push_back(config.numLayers);
    return Error::success();
  }

  mlir::MLIRContext &context;
  mlir::ModuleOp module;
  const CompileOptions &options;
  const hf::ModelConfig &config;
  const sharding::Cluster machine;
};

} // namespace

Error driver::choosePipelineRecompute(mlir::MLIRContext &context, mlir::ModuleOp module,
                                      CompileOptions &options, const TrainingChoice &request) {
  const bool choose = request.recomputeAuto && options.train && !options.lossOnly;
  if ((!choose && !options.explain) || !options.layout)
    return Error::success();
  PipelinePlanner planner(context, module, options, *request.config);
  const int64_t world = options.layout->worldSize;
  const sharding::Cluster machine = *sharding::builtinCluster("cpu");
  // (The CPU machine's ranks share its memory.)
  const int64_t budget = request.budget > 0
                             ? request.budget
                             : int64_t(0.9 * double(machine.memoryBytes) / double(world));
  std::vector<Trial> trials;
  for (const Recompute &r : recomputeCandidates(options, choose)) {
    Expected<Trial> t = planner.measureUniform(r);
    if (!t)
      return t.takeError();
    trials.push_back(std::move(*t));
  }
  const Shape shape = planner.shape;

  // Each stage: the fastest recompute that fits, else the least memory.
  SmallVector<size_t> pick(shape.pp);
  SmallVector<bool> fits(shape.pp, false);
  for (int64_t s = 0; s < shape.pp; ++s) {
    SmallVector<size_t> order(trials.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return trials[a].microBatch[s] < trials[b].microBatch[s];
    });
    pick[s] = order.front();
    for (size_t i : order)
      if (trials[i].memory[s].total() <= budget) {
        pick[s] = i;
        fits[s] = true;
        break;
      }
    if (!fits[s])
      for (size_t i : order)
        if (trials[i].memory[s].total() < trials[pick[s]].memory[s].total())
          pick[s] = i;
  }
  const bool uniform = llvm::all_equal(pick);
  if (choose) {
    options.recomputeExperts = options.recomputeLayers = false;
    options.recomputeExpertsLayers.clear();
    options.recomputeLayersOnly.clear();
    for (int64_t s = 0; s < shape.pp; ++s) {
      const Recompute &r = trials[pick[s]].recompute;
      options.recomputeExperts |= r.experts;
      options.recomputeLayers |= r.layers;
      for (int64_t l = shape.begin[s]; !uniform && l < shape.begin[s + 1]; ++l) {
        if (r.experts)
          options.recomputeExpertsLayers.push_back(l);
        if (r.layers)
          options.recomputeLayersOnly.push_back(l);
      }
    }
    // (--recompute none everywhere, as without a budget: no note.)
    if (!uniform || trials[pick[0]].recompute.layers || trials[pick[0]].recompute.experts ||
        !llvm::all_of(fits, [](bool f) { return f; })) {
      std::string chosen;
      for (int64_t s = 0; s < shape.pp; ++s)
        chosen += formatv("{0}stage {1} {2} ({3} bytes{4})", s ? ", " : "", s,
                          trials[pick[s]].recompute.name, trials[pick[s]].memory[s].total(),
                          fits[s] ? "" : ", over the budget")
                      .str();
      WithColor::note(errs(), "moec") << "--recompute auto over pipeline stages, budget "
                                      << budget << " bytes a rank: " << chosen << "\n";
    }
  }
  if (!options.explain)
    return Error::success();

  // The choice's own programs (a mix of recomputes compiled once more).
  Trial chosen = trials[pick[0]];
  if (!uniform) {
    Expected<Trial> t = planner.measure(options, kNone);
    if (!t)
      return t.takeError();
    chosen = std::move(*t);
    for (int64_t s = 0; s < shape.pp; ++s) // (the time model per stage's choice)
      chosen.microBatch[s] = trials[pick[s]].microBatch[s];
  }
  outs() << formatv("pipeline: {0} stages, 1F1B over {1} micro-batches per replica and update "
                    "(moe.pipeline_schedule); each stage's recompute{2}, memory (its compiled "
                    "programs; bytes) and seconds per micro-batch (the time model on the {3} "
                    "machine):\n",
                    shape.pp, shape.m,
                    choose ? formatv(" (the fastest within {0} bytes)", budget).str() : "",
                    machine.name);
  outs() << formatv("  {0,-6} {1,-9} {2,-10} {3,12} {4,12} {5,18} {6,12} {7,12} {8,14}\n",
                    "stage", "layers", "recompute", "weights", "buffers", "kept (slots)",
                    "states", "total", "s/micro-batch");
  for (int64_t s = 0; s < shape.pp; ++s) {
    const moe::RankProgramMemory &memory = chosen.memory[s];
    int64_t states = 0;
    for (const auto &kind : memory.state)
      states += kind.second;
    outs() << formatv("  {0,-6} {1,-9} {2,-10} {3,12} {4,12} {5,18} {6,12} {7,12} {8,14:e2}\n", s,
                      formatv("[{0}, {1})", shape.begin[s], shape.begin[s + 1]).str(),
                      trials[pick[s]].recompute.name, memory.weights + memory.kvCache,
                      memory.buffers, formatv("{0} ({1})", memory.kept, chosen.slots[s]).str(),
                      states, memory.total(), chosen.microBatch[s]);
  }
  const UpdateTime update = chosen.total(shape.m);
  outs() << formatv("update: 1F1B over the stages' seconds per micro-batch, (m - 1) max + sum "
                    "= {0:e2} s, then {1:e2} s optimizer and communication; bubble {2:f1}% of "
                    "the stages' time (equal stages: (pp - 1) / (m + pp - 1) = {3:f1}%)\n",
                    update.compute, update.optimizer + update.comm, 100 * chosen.bubble(shape.m),
                    100.0 * double(shape.pp - 1) / double(shape.m + shape.pp - 1));
  return Error::success();
}

Expected<driver::timing::PipelineEstimate>
driver::timing::estimatePipeline(mlir::MLIRContext &context, mlir::ModuleOp module,
                         const CompileOptions &options, const hf::ModelConfig &config,
                         const Recompute &recompute) {
  PipelinePlanner planner(context, module, options, config);
  Expected<Trial> t = planner.measureUniform(recompute);
  if (!t)
    return t.takeError();
  const Shape &shape = planner.shape;
  PipelineEstimate e;
  e.time = t->total(shape.m);
  e.bubble = t->bubble(shape.m);
  for (int64_t s = 0; s < shape.pp; ++s)
    if (s == 0 || t->memory[s].total() > e.memory.total()) {
      e.memory = t->memory[s];
      e.stage = s;
    }
  return e;
}
