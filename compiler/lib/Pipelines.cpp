//===- Pipelines.cpp - the one place pass pipelines are assembled -*- C++ -*-===//
#include "moe/Pipelines.h"
#include "moe/Analysis/Cluster.h"
#include "moe/Target/TargetBackend.h"
#include "moe/Transforms/Passes.h"

#include "mlir/Pass/PassOptions.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/StringSwitch.h"

using namespace mlir;

std::optional<moe::Phase> moe::parsePhase(llvm::StringRef name) {
  return llvm::StringSwitch<std::optional<Phase>>(name)
      .Case("import", Phase::Import)
      .Case("workload", Phase::Workload)
      .Case("partition", Phase::Partition)
      .Case("buffers", Phase::Buffers)
      .Case("exec", Phase::Exec)
      .Case("plan", Phase::Plan)
      .Default(std::nullopt);
}

const char *moe::phaseNames() { return "import, workload, partition, buffers, exec, plan"; }

/// The ranks the planner will lay out: --world-size, else the cluster
/// file's, else one (a cluster file that does not load fails in the pass).
static int64_t worldOf(const moe::LayoutRequest &request) {
  if (request.worldSize)
    return request.worldSize;
  if (!request.cluster.empty()) {
    llvm::Expected<moe::sharding::Cluster> cluster =
        moe::sharding::loadClusterFile(request.cluster);
    if (cluster)
      return cluster->worldSize;
    llvm::consumeError(cluster.takeError());
  }
  return 1;
}

static bool recomputesLayers(const moe::CompileOptions &o) {
  return o.train && !o.lossOnly && o.recomputeLayers;
}

static std::unique_ptr<Pass> recomputeLayersPass(const moe::CompileOptions &o) {
  moe::MoERecomputeLayersOptions recompute;
  recompute.layers = llvm::to_vector(o.recomputeLayersOnly);
  return moe::createMoERecomputeLayers(recompute);
}

static void addEntryPasses(OpPassManager &pm, const moe::CompileOptions &o, bool partition,
                           moe::Phase last);

void moe::buildPipeline(OpPassManager &pm, const CompileOptions &o, Phase last) {
  if (last == Phase::Import)
    return;
  // A training program ends with its loss before anything reads the model.
  if (o.train) {
    MoEAppendLossOptions loss;
    loss.auxLossCoef = o.auxLossCoef;
    loss.zLossCoef = o.zLossCoef;
    loss.sequences = o.maxSequences;
    pm.addPass(createMoEAppendLoss(loss));
    if (!o.lossOnly) {
      MoEDifferentiateOptions backward;
      backward.recomputeExperts = o.recomputeExperts;
      backward.expertsLayers = llvm::to_vector(o.recomputeExpertsLayers);
      backward.capacityFactor = o.capacityFactor;
      pm.addPass(createMoEDifferentiate(backward));
    }
  }
  // The workload comes first: every size decided later (buffers, caches,
  // dispatch capacity) is a function of it.
  MoESpecializeWorkloadOptions workload;
  workload.maxBatchTokens = o.maxBatchTokens;
  workload.maxSeqLen = o.maxSeqLen;
  workload.maxSequences = o.maxSequences;
  pm.addPass(createMoESpecializeWorkload(workload));
  if (!o.weightFormat.empty()) {
    MoEQuantizeWeightsOptions quantize;
    quantize.format = o.weightFormat;
    pm.addPass(createMoEQuantizeWeights(quantize));
  }
  // The layout (it needs the workload) and the weights' sharding.
  // A training program is always partitioned (on its one rank for now): its
  // per-rank form, with its collectives proven by moe-verify-collectives, is
  // the one distributed training extends.
  const bool partition =
      o.train || (o.layout && (worldOf(*o.layout) > 1 || o.capacityFactor > 0));
  if ((o.train || o.storedSlices) && !o.layout) {
    MoEChooseLayoutOptions choose;
    choose.worldSize = 1;
    choose.dtype = o.checkpointDtype;
    pm.addPass(createMoEChooseLayout(choose));
  } else if (o.layout) {
    MoEChooseLayoutOptions choose;
    choose.worldSize = o.layout->worldSize;
    choose.gpu = o.layout->gpu;
    choose.cluster = o.layout->cluster;
    choose.dp = o.layout->dp;
    choose.pp = o.layout->pp;
    choose.tp = o.layout->tp;
    choose.ep = o.layout->ep;
    choose.etp = o.layout->etp;
    choose.vocabPadTo = o.layout->vocabPadTo;
    choose.dtype = o.layout->dtype;
    // (With --train, --explain prints the training memory model instead.)
    choose.explain = o.explain && !o.train;
    choose.json = o.json;
    pm.addPass(createMoEChooseLayout(choose));
  }
  // Fusions of the whole model's ops, before partitioning sees them.
  if (o.fuse)
    pm.addPass(createMoEFuseRouter());
  if (last == Phase::Workload)
    return;
  // With a decode entry, the passes from here to the exec programs run on
  // each entry's copy of the model (its own workload), then the programs
  // are joined (moe-join-entries) before the target's passes.
  OpPassManager *entryPm = &pm;
  if (o.decodeEntry) {
    pm.addPass(createMoESplitEntries());
    entryPm = &pm.nest<ModuleOp>();
  }
  addEntryPasses(*entryPm, o, partition, last);
  if (last < Phase::Exec)
    return;
  if (o.decodeEntry)
    pm.addPass(createMoEJoinEntries());
  // A training plan's optimizer program beside its train program.
  if (o.optimizer) {
    MoEAppendOptimizerOptions adamw;
    adamw.lr = o.optimizer->lr;
    adamw.minLr = o.optimizer->minLr;
    adamw.schedule = o.optimizer->schedule;
    adamw.warmupSteps = o.optimizer->warmupSteps;
    adamw.decaySteps = o.optimizer->decaySteps;
    adamw.beta1 = o.optimizer->beta1;
    adamw.beta2 = o.optimizer->beta2;
    adamw.eps = o.optimizer->eps;
    adamw.weightDecay = o.optimizer->weightDecay;
    adamw.clipGradNorm = o.optimizer->clipGradNorm;
    adamw.microBatches = o.optimizer->microBatches;
    adamw.expertBiasUpdateRate = o.optimizer->expertBiasUpdateRate;
    adamw.zero = o.optimizer->zero;
    pm.addPass(createMoEAppendOptimizer(adamw));
    // Pipeline stages: the order of the micro-batches' forward and
    // backward programs (nothing to do without stages).
    pm.addPass(createMoESchedulePipeline());
  }
  // The whole schedule of the exec programs proven again (a training
  // plan's update: its train and optimizer programs together).
  if (partition)
    pm.addPass(createMoEVerifyExecCollectives());
  // The target's own passes on the exec programs (an unknown target is
  // diagnosed by moe-emit-plan).
  TargetOptions target;
  target.output = o.output;
  target.cudaArch = o.cudaArch;
  target.kernelsOnly = o.kernelsOnly;
  if (const TargetBackend *backend = lookupTargetBackend(o.target))
    backend->buildPipeline(pm, target);
  if (last == Phase::Plan && (!o.output.empty() || o.kernelsOnly)) {
    MoEEmitPlanOptions emit;
    emit.output = o.output;
    emit.target = o.target;
    emit.cudaArch = o.cudaArch;
    emit.kernelsOnly = o.kernelsOnly;
    pm.addPass(createMoEEmitPlan(emit));
  }
}

/// The passes of one entry, from its workload to its exec programs.
static void addEntryPasses(OpPassManager &pm, const moe::CompileOptions &o, bool partition,
                           moe::Phase last) {
  using namespace moe;
  if (partition) {
    // Per-stage programs with collectives (capacity needs the workload), then
    // the proof that they match: a plan that fails it is never written.
    MoELowerRoutingOptions routing;
    routing.capacityFactor = o.capacityFactor;
    pm.addPass(createMoELowerRouting(routing));
    // Over pipeline stages, whole layers are recomputed before the program
    // is cut: each stage's backward function then keeps the boundary
    // values only.
    if (recomputesLayers(o) && o.layout && o.layout->pp > 1)
      pm.addPass(recomputeLayersPass(o));
    pm.addPass(createMoEPartition());
    pm.addPass(createMoEInsertCollectives());
    pm.addPass(createCSEPass());
    pm.addPass(createMoEVerifyCollectives());
  }
  if (last == Phase::Partition)
    return;
  // Dead weights and ops (e.g. a tied head imported twice) go before buffers
  // are assigned, so that no buffer is reserved for them.
  pm.addPass(createCSEPass());
  // Whole layers recomputed in the backward pass: after the last CSE (which
  // would merge the clones with their originals).
  if (recomputesLayers(o) && !(o.layout && o.layout->pp > 1))
    pm.addPass(recomputeLayersPass(o));
  // Fusions of the rank-local programs (partitioning places its all_reduces
  // at the plain adds).
  if (o.fuse)
    pm.addPass(createMoEFuseAddNorm());
  // Buffers last: they depend on the final op order and on which values are
  // still live, so nothing may reorder or add ops after this pass.
  pm.addPass(createMoEAssignBuffers());
  if (last == Phase::Buffers)
    return;
  // Each rank's programs at the execution level: declarations, launches by
  // kernel id, collectives with their groups. The targets and the plan
  // writer read only these.
  pm.addPass(createMoELowerToExec());
}

namespace {

/// moec compile's options, spelled as moe-opt pipeline options.
struct CompilePipelineOptions : public PassPipelineOptions<CompilePipelineOptions> {
  Option<int64_t> maxBatchTokens{*this, "max-batch-tokens", llvm::cl::init(512),
                                 llvm::cl::desc("most tokens in one step")};
  Option<int64_t> maxSeqLen{*this, "max-seq-len", llvm::cl::init(2048),
                            llvm::cl::desc("longest sequence")};
  Option<int64_t> maxSequences{*this, "max-sequences", llvm::cl::init(8),
                               llvm::cl::desc("most sequences decoded together")};
  Option<double> capacityFactor{*this, "capacity-factor", llvm::cl::init(0.0),
                                llvm::cl::desc("expert capacity factor (0: dropless)")};
  Option<bool> noFuse{*this, "no-fuse", llvm::cl::init(false),
                      llvm::cl::desc("skip the fusion passes")};
  Option<int64_t> worldSize{*this, "world-size", llvm::cl::init(0),
                            llvm::cl::desc("ranks to plan for")};
  Option<std::string> gpu{*this, "gpu", llvm::cl::desc("built-in machine")};
  Option<std::string> cluster{*this, "cluster", llvm::cl::desc("cluster file")};
  Option<int64_t> dp{*this, "dp", llvm::cl::init(0), llvm::cl::desc("fixed dp")};
  Option<int64_t> pp{*this, "pp", llvm::cl::init(0), llvm::cl::desc("fixed pp")};
  Option<int64_t> tp{*this, "tp", llvm::cl::init(0), llvm::cl::desc("fixed tp")};
  Option<int64_t> ep{*this, "ep", llvm::cl::init(0), llvm::cl::desc("fixed ep")};
  Option<int64_t> etp{*this, "etp", llvm::cl::init(0), llvm::cl::desc("fixed etp")};
  Option<int64_t> vocabPadTo{*this, "vocab-pad-to", llvm::cl::init(64),
                             llvm::cl::desc("vocabulary padding multiple (x tp)")};
  Option<std::string> dtype{*this, "dtype", llvm::cl::desc("weight dtype the planner counts")};
  Option<std::string> output{*this, "output", llvm::cl::desc("the plan file to write")};
  Option<std::string> target{*this, "target", llvm::cl::init("cpu"),
                             llvm::cl::desc("cpu or cuda")};
  Option<std::string> cudaArch{*this, "cuda-arch", llvm::cl::init("sm_80,sm_90"),
                               llvm::cl::desc("CUDA architectures")};
  Option<bool> decodeEntry{*this, "decode-entry", llvm::cl::init(false),
                           llvm::cl::desc("a decode entry beside the prefill one")};
  Option<bool> train{*this, "train", llvm::cl::init(false),
                     llvm::cl::desc("a training program: the loss after the model")};
  Option<bool> lossOnly{*this, "loss-only", llvm::cl::init(false),
                        llvm::cl::desc("with train: no backward pass")};
  Option<bool> recomputeExperts{*this, "recompute-experts", llvm::cl::init(false),
                                llvm::cl::desc("with train: recompute the experts' "
                                               "intermediates in the backward pass")};
  Option<bool> recomputeLayers{*this, "recompute-layers", llvm::cl::init(false),
                               llvm::cl::desc("with train: recompute whole layers in the "
                                              "backward pass")};
  Option<double> auxLossCoef{*this, "aux-loss-coef", llvm::cl::init(-1.0),
                             llvm::cl::desc("balancing-loss coefficient (< 0: the config's)")};
  Option<double> zLossCoef{*this, "z-loss-coef", llvm::cl::init(0.0),
                           llvm::cl::desc("router z-loss coefficient")};
  Option<bool> kernelsOnly{*this, "kernels-only", llvm::cl::init(false),
                           llvm::cl::desc("target=cuda without nvcc: the sources beside the "
                                          "plan (moec compile --compile-to=kernels)")};
};

} // namespace

void moe::registerPipelines() {
  PassPipelineRegistration<>(
      "moe-plan-pipeline",
      "every pass from an imported module to the plan's IR (default workload)",
      [](OpPassManager &pm) { buildPipeline(pm, CompileOptions(), Phase::Plan); });
  PassPipelineRegistration<CompilePipelineOptions>(
      "moe-compile-pipeline",
      "moec compile as a pipeline: from an imported module to the plan file (output=...); "
      "the same passes and options, so the same bytes",
      [](OpPassManager &pm, const CompilePipelineOptions &p) {
        CompileOptions o;
        o.maxBatchTokens = p.maxBatchTokens;
        o.maxSeqLen = p.maxSeqLen;
        o.maxSequences = p.maxSequences;
        o.capacityFactor = p.capacityFactor;
        o.fuse = !p.noFuse;
        // The planner runs when any distribution option is given (as moec).
        if (p.worldSize || !p.gpu.empty() || !p.cluster.empty() || p.dp || p.pp || p.tp ||
            p.ep || p.etp || !p.dtype.empty() || (p.capacityFactor != 0 && !p.train))
          o.layout = LayoutRequest{p.worldSize, p.gpu, p.cluster, p.dtype, p.dp, p.pp,
                                   p.tp,        p.ep,  p.etp,     p.vocabPadTo};
        o.output = p.output;
        o.target = p.target;
        o.cudaArch = p.cudaArch;
        o.kernelsOnly = p.kernelsOnly;
        o.decodeEntry = p.decodeEntry;
        o.train = p.train;
        o.lossOnly = p.lossOnly;
        o.recomputeExperts = p.recomputeExperts;
        o.recomputeLayers = p.recomputeLayers;
        o.auxLossCoef = p.auxLossCoef;
        o.zLossCoef = p.zLossCoef;
        buildPipeline(pm, o, Phase::Plan);
      });
}
