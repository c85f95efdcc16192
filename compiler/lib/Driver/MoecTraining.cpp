//===- MoecTraining.cpp - moec compile's training options --------*- C++ -*-===//
//
// moec compile --train and the options of a training plan (docs/training.md):
// the workload of one step, the loss, the recompute choice by the training
// memory model, and the optimizer program.
//
//===----------------------------------------------------------------------===//
#include "MoecOptions.h"
#include "moe/Analysis/Cluster.h"
#include "moe/Target/PlanWriter.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/WithColor.h"

using namespace llvm;
using namespace moe;

namespace {

// Training (docs/training.md).
cl::OptionCategory training("Training (--train)");
cl::opt<bool> train("train",
                    cl::desc("A training plan: the model followed by its loss (cross-entropy of "
                             "the next token, the family's balancing loss, the router z-loss); "
                             "moert train runs it"),
                    cl::init(false), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<bool> lossOnly("loss-only",
                       cl::desc("With --train: the loss without the backward pass (an "
                                "evaluation plan: no gradients)"),
                       cl::init(false), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<std::string> recompute(
    "recompute",
    cl::desc("With --train: what the backward pass recomputes instead of keeping from the "
             "forward pass: auto (default: none when the rank's training memory fits "
             "--memory-budget, else selective when that fits, else full), none (the "
             "experts' gate/up products and outputs are kept, 2 x k x intermediate + k x "
             "hidden floats per token and MoE layer), selective or experts (those "
             "recomputed: three more products per expert), full (each decoder layer's "
             "forward run again in the backward pass from its saved input: one layer's "
             "activations alive at a time); all give the same gradients bit for bit. With "
             "--pp, auto chooses per stage (the first keeps the most micro-batches in "
             "flight)"),
    cl::init("auto"), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<int64_t> memoryBudget(
    "memory-budget",
    cl::desc("With --train and --recompute auto (or --dp N without --zero): the bytes a rank "
             "may hold (default: 90% of the 24 GiB of the CPU machine the planner assumes, "
             "shared by the ranks)"),
    cl::init(0), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<int64_t> seqLen("seq-len", cl::desc("With --train: tokens of one training sequence"),
                        cl::init(0), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<int64_t> microBatchSize("micro-batch-size",
                                cl::desc("With --train: sequences of one step (default 1)"),
                                cl::init(1), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<double> auxLossCoef(
    "aux-loss-coef",
    cl::desc("With --train: the balancing loss's coefficient (default: config.json's "
             "router_aux_loss_coef for the families transformers computes it for)"),
    cl::init(-1.0), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<double> routerZLossCoef("router-z-loss-coef",
                                cl::desc("With --train: the router z-loss's coefficient "
                                         "(mean logsumexp^2 of the router logits, summed over "
                                         "the MoE layers; default 0)"),
                                cl::init(0.0), cl::sub(driver::compileSubcommand()), cl::cat(training));

// The optimizer program (docs/training.md, "The optimizer").
cl::opt<std::string> paramDtype(
    "param-dtype",
    cl::desc("With --optimizer: the dtype the weights compute in: bf16 trains an f32 "
             "checkpoint with bf16 weights (rounded at load) and f32 master weights (the "
             "checkpoint's values) that AdamW updates; f32 or the checkpoint's dtype: as "
             "stored (default)"),
    cl::init(""), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<std::string> optimizerKind(
    "optimizer",
    cl::desc("With --train: none (default: the plan computes the loss and the gradients) or "
             "adamw (an optimizer program beside the train program: torch.optim.AdamW with "
             "the options below; moert train --steps N trains)"),
    cl::init("none"), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<double> learningRate("lr", cl::desc("With --optimizer: the peak learning rate (1e-3)"),
                             cl::init(1e-3), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<double> minLr("min-lr",
                      cl::desc("With --lr-schedule cosine: the final learning rate (0)"),
                      cl::init(0.0), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<std::string> lrSchedule(
    "lr-schedule",
    cl::desc("With --optimizer: constant (default) or cosine (decay to --min-lr at "
             "--lr-decay-steps); both after --warmup-steps of linear warmup"),
    cl::init("constant"), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<int64_t> warmupSteps("warmup-steps",
                             cl::desc("With --optimizer: steps of linear warmup (0)"),
                             cl::init(0), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<int64_t> lrDecaySteps("lr-decay-steps",
                              cl::desc("With --lr-schedule cosine: the step where the decay "
                                       "reaches --min-lr"),
                              cl::init(0), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<double> adamBeta1("adam-beta1", cl::desc("With --optimizer: AdamW's beta1 (0.9)"),
                          cl::init(0.9), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<double> adamBeta2("adam-beta2", cl::desc("With --optimizer: AdamW's beta2 (0.999)"),
                          cl::init(0.999), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<double> adamEps("adam-eps", cl::desc("With --optimizer: AdamW's epsilon (1e-8)"),
                        cl::init(1e-8), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<double> weightDecay("weight-decay",
                            cl::desc("With --optimizer: AdamW's decoupled weight decay, on "
                                     "every weight as torch's default (0.01)"),
                            cl::init(0.01), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<double> clipGradNorm("clip-grad-norm",
                             cl::desc("With --optimizer: clip the gradients to this global "
                                      "norm, as clip_grad_norm_ (0: no clipping)"),
                             cl::init(0.0), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<double> expertBiasUpdateRate(
    "expert-bias-update-rate",
    cl::desc("With --optimizer: DeepSeek-V3's auxiliary-loss-free balancing: each update "
             "moves every routing correction bias (e_score_correction_bias) by this much "
             "towards the mean expert load (default 1e-3; 0: none)"),
    cl::init(1e-3), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<int64_t> zeroStage(
    "zero",
    cl::desc("With --optimizer and --dp N: the ZeRO stage, 0 (every replica holds the "
             "optimizer's states), 1 (the moments and bf16 masters sharded between the "
             "replicas, the weights gathered after each update) or 2 (the gradient sums "
             "sharded too, reduce-scattered after each micro-batch); default: the fastest "
             "stage whose memory fits --memory-budget by the time model (--explain)"),
    cl::init(0), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<int64_t> tpArithmetic(
    "tp-arithmetic",
    cl::desc("With --train: compute as tensor parallelism over L ranks does, whatever the "
             "layout's --tp T (a divisor of L): the plan is the TP=L partition, and each "
             "process runs L / T of its ranks on threads (moert's --in-process), so every "
             "layout compiled with the same L trains to the same bytes, one process "
             "included (docs/training.md)"),
    cl::init(0), cl::sub(driver::compileSubcommand()), cl::cat(training));
cl::opt<int64_t> globalBatchSize(
    "global-batch-size",
    cl::desc("With --optimizer: sequences per update, a multiple of --micro-batch-size (the "
             "gradients of its micro-batches are averaged; default: one micro-batch per "
             "data-parallel replica)"),
    cl::init(0), cl::sub(driver::compileSubcommand()), cl::cat(training));

/// --ep given with --train (trainingOptions): no choice of it left.
bool expertsGiven = false;
/// --world-size N alone with --train (no --dp, --tp, --ep, --etp): the
/// planner chooses tensor parallelism too.
bool worldAlone = false;

} // namespace

/// --recompute auto and --zero auto (not given with --dp N): the planner's
/// training mode, MoecTrainingLayout.cpp.
Error driver::chooseRecompute(mlir::MLIRContext &context, mlir::ModuleOp module,
                              CompileOptions &options, const hf::ModelConfig &config) {
  TrainingChoice request;
  request.recomputeAuto = recompute == "auto";
  request.zeroAuto = zeroStage.getNumOccurrences() == 0;
  request.expertsAuto = request.zeroAuto && !expertsGiven;
  request.tensorAuto = request.zeroAuto && worldAlone;
  // (A process's budget is its ranks'.)
  request.budget =
      memoryBudget.getNumOccurrences() ? int64_t(memoryBudget) / options.ranksPerProcess : 0;
  request.config = &config;
  // Pipeline stages are given (and ZeRO, and the layout): the recompute of
  // each stage is chosen.
  if (options.layout && options.layout->pp > 1)
    return choosePipelineRecompute(context, module, options, request);
  return chooseTrainingLayout(context, module, options, request);
}

/// --train: the workload of one step (micro-batch-size sequences of
/// seq-len tokens) and the loss; what training does not do yet is refused.
Error driver::trainingOptions(CompileOptions &options, const hf::ModelConfig &config,
                              bool distribution, ArrayRef<cl::Option *> workloadOptions) {
  auto refuse = [](const Twine &message) {
    return createStringError(inconvertibleErrorCode(), "%s", message.str().c_str());
  };
  const std::initializer_list<cl::Option *> optimizerOptions{
      &learningRate, &minLr,     &lrSchedule,  &warmupSteps,  &lrDecaySteps,   &adamBeta1,
      &adamBeta2,    &adamEps,   &weightDecay, &clipGradNorm, &globalBatchSize,
      &expertBiasUpdateRate, &paramDtype, &zeroStage};
  if (!train) {
    for (cl::Option *o : std::initializer_list<cl::Option *>{
             &seqLen, &microBatchSize, &auxLossCoef, &routerZLossCoef, &lossOnly, &recompute,
             &optimizerKind, &memoryBudget, &tpArithmetic})
      if (o->getNumOccurrences())
        return refuse("--" + o->ArgStr + ": expected --train");
  }
  if (optimizerKind != "none" && optimizerKind != "adamw")
    return refuse("--optimizer " + optimizerKind + ": expected none or adamw");
  if (optimizerKind == "none")
    for (cl::Option *o : optimizerOptions)
      if (o->getNumOccurrences())
        return refuse("--" + o->ArgStr + ": expected --optimizer adamw");
  if (!train)
    return Error::success();
  if (config.fp8)
    return refuse(config.path + ": not supported yet: training a model whose checkpoint stores "
                  "FP8 weights (quantization_config)");
  if (seqLen < 1 || microBatchSize < 1)
    return refuse("--train: expected --seq-len >= 1 and --micro-batch-size >= 1");
  if (seqLen > config.maxPositionEmbeddings)
    return refuse("--seq-len " + Twine(int64_t(seqLen)) + ": more than the model's " +
                  "max_position_embeddings (" + Twine(config.maxPositionEmbeddings) + ")");
  for (cl::Option *o : workloadOptions)
    if (o->getNumOccurrences())
      return refuse("--train: --" + o->ArgStr +
                    " does not apply (a step is --micro-batch-size x --seq-len tokens)");
  // Distributed training: data-parallel replicas (--dp N, --world-size N, or
  // both), their experts split between them (--ep E, dividing the replicas:
  // expert parallelism across data parallelism); --world-size alone is the
  // planner's choice among them (dp = N, ZeRO and recompute by the training
  // memory and time model).
  int64_t replicas = 1, experts = 1, tensor = 1, slices = 1, stages = 1;
  // --tp-arithmetic L: the TP=L partition, L / T of its ranks in each
  // process (applied once the replicas are counted from the real --tp, and
  // before --etp and --ep are checked against the TP=L group).
  int64_t perProcess = 1;
  auto arithmeticOfTp = [&]() -> Error {
    if (!tpArithmetic.getNumOccurrences())
      return Error::success();
    const int64_t arithmetic = tpArithmetic;
    if (arithmetic < 1 || arithmetic % tensor)
      return refuse("--tp-arithmetic " + Twine(arithmetic) +
                    ": expected a positive multiple of --tp (" + Twine(tensor) + ")");
    // (The heads first, in the option's name; other widths TP=L splits
    // are checked by the layout, under --tp L.)
    if (config.numHeads % arithmetic || (!config.isMLA() && config.numKVHeads % arithmetic))
      return refuse(formatv("--tp-arithmetic {0}: expected a divisor of num_attention_heads "
                            "({1}){2}",
                            arithmetic, config.numHeads,
                            config.isMLA() ? std::string()
                                           : formatv(" and num_key_value_heads ({0})",
                                                     config.numKVHeads)
                                                 .str())
                        .str());
    if (worldAlone && options.layout->worldSize > 1)
      return refuse("--tp-arithmetic " + Twine(arithmetic) +
                    ": not with --world-size alone (the planner's choice of --tp): give the "
                    "layout (--dp N, --tp T, --ep E)");
    if (options.target != "cpu")
      return refuse("not supported yet: --tp-arithmetic with --target " + options.target +
                    " (a process runs its ranks on the CPU device)");
    perProcess = arithmetic / tensor;
    tensor = arithmetic;
    worldAlone = false; // (--world-size 1: nothing left to choose)
    return Error::success();
  };
  if (distribution) {
    const LayoutRequest &l = *options.layout;
    // Pipeline stages (--pp P): each replica's layers over P ranks.
    stages = std::max<int64_t>(l.pp, 1);
    if (stages > 1 && options.target != "cpu")
      return refuse("not supported yet: --train --pp with --target " + options.target);
    if (stages > 1 && l.worldSize && l.worldSize % stages)
      return refuse("--train --pp " + Twine(stages) + ": expected a divisor of --world-size " +
                    Twine(l.worldSize));
    if (!l.gpu.empty() || !l.cluster.empty() || !l.dtype.empty())
      return refuse("not supported yet: --train with --gpu, --cluster or --dtype (a training "
                    "plan runs on the CPU machine the planner assumes): give --world-size N "
                    "or --dp N (and --ep E, --tp T)");
    tensor = std::max<int64_t>(l.tp, 1);
    const int64_t perStage = l.worldSize / stages;
    if (l.dp && l.worldSize && perStage != l.dp * tensor)
      return refuse("--train --dp " + Twine(l.dp) + ": expected --world-size " +
                    Twine(l.dp * tensor * stages) + " (dp x tp" + (stages > 1 ? " x pp" : "") +
                    ": every rank a replica" +
                    (tensor > 1 ? " or a part of one" : "") + "), not " + Twine(l.worldSize));
    if (l.worldSize % tensor)
      return refuse("--train --tp " + Twine(tensor) + ": expected a divisor of --world-size " +
                    Twine(l.worldSize));
    experts = std::max<int64_t>(l.ep, 1);
    expertsGiven = l.ep > 0;
    worldAlone = l.worldSize > 0 && l.dp == 0 && l.tp == 0 && l.ep == 0 && l.etp == 0 && l.pp == 0;
    replicas = l.dp ? l.dp : l.worldSize ? perStage / tensor : tensor > 1 || stages > 1 ? 1 : experts;
    if (replicas < 1)
      return refuse("--train: expected --world-size N or --dp N with N >= 1");
    if (Error e = arithmeticOfTp())
      return e;
    slices = std::max<int64_t>(l.etp, 1);
    if (tensor % slices)
      return refuse("--train --etp " + Twine(slices) + ": expected a divisor of --tp " +
                    Twine(tensor) + " (each expert's slices within a tensor-parallel group)");
    if ((replicas * tensor) % experts)
      return refuse("--train --ep " + Twine(experts) + ": expected a divisor of the " +
                    Twine(replicas * tensor) + " ranks (the experts are split between the "
                    "ranks of each group of ep)");
    if ((replicas * tensor) % (experts * slices))
      return refuse("--train --ep " + Twine(experts) + " --etp " + Twine(slices) +
                    ": expected ep x etp to divide the " + Twine(replicas * tensor) + " ranks");
    if ((experts > 1 || tensor > 1) && options.target != "cpu")
      return refuse("not supported yet: --train --" + Twine(experts > 1 ? "ep" : "tp") +
                    " with --target " + options.target +
                    " (the experts' backward kernels are the CPU's for now)");
  }
  if (!distribution)
    if (Error e = arithmeticOfTp())
      return e;
  options.ranksPerProcess = perProcess;
  const bool selective = recompute == "selective" || recompute == "experts",
             full = recompute == "full";
  if (options.capacityFactor > 0 && selective)
    return refuse("not supported yet: --recompute " + recompute + " with --capacity-factor");
  // A capacity factor alone: one rank, the experts' drops in the training
  // program itself (moe-differentiate's capacity-factor); each replica's
  // likewise.
  options.layout.reset();
  if (replicas * tensor * stages > 1) {
    LayoutRequest layout;
    layout.worldSize = replicas * tensor * stages;
    layout.dp = replicas;
    layout.pp = stages;
    layout.etp = slices;
    layout.tp = tensor;
    layout.ep = experts;
    options.layout = layout;
  }
  if (auxLossCoef.getNumOccurrences() && auxLossCoef < 0)
    return refuse("--aux-loss-coef: expected a value >= 0");
  if (routerZLossCoef < 0)
    return refuse("--router-z-loss-coef: expected a value >= 0");
  if (recompute != "auto" && recompute != "none" && !selective && !full)
    return refuse("--recompute " + recompute +
                  ": expected auto, none, selective, experts or full");
  if (lossOnly && recompute.getNumOccurrences())
    return refuse("--recompute: --loss-only computes no backward pass");
  if (memoryBudget.getNumOccurrences() &&
      (memoryBudget <= 0 ||
       (recompute != "auto" && (replicas == 1 || zeroStage.getNumOccurrences()))))
    return refuse("--memory-budget: expected a positive number of bytes, with --recompute auto "
                  "(or --dp N without --zero)");
  options.train = true;
  options.lossOnly = lossOnly;
  options.recomputeExperts = selective;
  options.recomputeLayers = full;
  options.maxBatchTokens = seqLen * microBatchSize;
  options.maxSeqLen = seqLen;
  options.maxSequences = microBatchSize;
  options.auxLossCoef = auxLossCoef;
  options.zLossCoef = routerZLossCoef;
  if (optimizerKind == "none")
    return replicas * tensor * stages > 1
               ? refuse((stages > 1   ? "--pp " + Twine(stages)
                         : tensor > 1 ? "--tp " + Twine(tensor)
                                      : "--dp " + Twine(replicas)) +
                        ": expected --optimizer adamw (the optimizer program adds the "
                        "replicas' gradients)")
               : Error::success();
  if (lossOnly)
    return refuse("--optimizer: --loss-only computes no gradients");
  if (options.target != "cpu")
    return refuse("not supported yet: --optimizer with --target " + options.target +
                  " (the optimizer's kernels are the CPU's for now)");
  if (globalBatchSize.getNumOccurrences() &&
      (globalBatchSize < 1 || globalBatchSize % microBatchSize != 0))
    return refuse("--global-batch-size " + Twine(int64_t(globalBatchSize)) +
                  ": expected a positive multiple of --micro-batch-size (" +
                  Twine(int64_t(microBatchSize)) + ")");
  if (lrSchedule != "constant" && lrSchedule != "cosine")
    return refuse("--lr-schedule " + lrSchedule + ": expected constant or cosine");
  if (lrSchedule == "cosine" && lrDecaySteps <= warmupSteps)
    return refuse("--lr-schedule cosine: expected --lr-decay-steps greater than --warmup-steps");
  if (!(learningRate > 0) || !(minLr >= 0) || minLr > learningRate)
    return refuse("--lr / --min-lr: expected --lr > 0 and 0 <= --min-lr <= --lr");
  if (warmupSteps < 0 || !(adamBeta1 >= 0 && adamBeta1 < 1) ||
      !(adamBeta2 >= 0 && adamBeta2 < 1) || !(adamEps > 0) || !(weightDecay >= 0) ||
      !(clipGradNorm >= 0) || !(expertBiasUpdateRate >= 0))
    return refuse("--optimizer adamw: expected --warmup-steps >= 0, betas in [0, 1), "
                  "--adam-eps > 0, --weight-decay >= 0, --clip-grad-norm >= 0 and "
                  "--expert-bias-update-rate >= 0");
  // --param-dtype: bf16 compute weights for an f32 checkpoint (its
  // slices stay f32: moert rounds them at load and starts the masters from
  // them); the checkpoint's own dtype changes nothing.
  const std::optional<sharding::DType> stored = sharding::parseDType(config.dtype);
  if (!paramDtype.empty() && paramDtype != "bf16" && paramDtype != "f32")
    return refuse("--param-dtype " + paramDtype + ": expected bf16 or f32");
  const bool fromF32 = stored == sharding::DType::F32;
  if (!paramDtype.empty() && sharding::parseDType(paramDtype) != stored && !fromF32)
    return refuse("not supported yet: --param-dtype " + paramDtype + " for a checkpoint of " +
                  config.dtype + " (" + config.path + ": dtype): the weights train in the "
                  "checkpoint's dtype or, from f32, in bf16");
  if (paramDtype == "bf16" && fromF32) {
    options.checkpointDtype = "f32";
    // (Over replicas the layout's slices are f32 too.)
    if (options.layout)
      options.layout->dtype = options.checkpointDtype;
  }
  CompileOptions::Optimizer adamw;
  adamw.lr = learningRate;
  adamw.minLr = minLr;
  adamw.schedule = lrSchedule;
  adamw.warmupSteps = warmupSteps;
  adamw.decaySteps = lrDecaySteps;
  adamw.beta1 = adamBeta1;
  adamw.beta2 = adamBeta2;
  adamw.eps = adamEps;
  adamw.weightDecay = weightDecay;
  adamw.clipGradNorm = clipGradNorm;
  adamw.expertBiasUpdateRate = expertBiasUpdateRate;
  // Without --global-batch-size: one micro-batch per data-parallel replica.
  adamw.microBatches =
      globalBatchSize.getNumOccurrences() ? globalBatchSize / microBatchSize : replicas;
  if (adamw.microBatches % replicas)
    return refuse("--global-batch-size " + Twine(adamw.microBatches * microBatchSize) +
                  ": expected a multiple of --micro-batch-size x --dp (" +
                  Twine(int64_t(microBatchSize)) + " x " + Twine(replicas) +
                  "): each data-parallel replica runs the same number of micro-batches");
  if (zeroStage < 0 || zeroStage > 2)
    return refuse("--zero " + Twine(int64_t(zeroStage)) + ": expected 0, 1 or 2");
  // (With one replica, an expert stack's states can still be sharded over
  // its edp group: the TP ranks that hold it whole, --tp without --etp.)
  const bool expertGroup = config.isMoE() && tensor / (experts * slices) > 1;
  if (zeroStage > 0 && replicas == 1 && !expertGroup)
    return refuse("--zero " + Twine(int64_t(zeroStage)) +
                  ": expected --dp N with N > 1 (ZeRO shards the optimizer's states between "
                  "data-parallel replicas), or --tp T with experts whole on its ranks (their "
                  "states sharded between them)");
  adamw.zero = zeroStage;
  options.optimizer = adamw;
  return Error::success();
}

