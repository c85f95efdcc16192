//===- TrainingTimeModel.cpp - a training update's time on a rank -*- C++ -*-===//
//
// TrainingTimeModel.h.
//
//===----------------------------------------------------------------------===//
#include "TrainingTimeModel.h"
#include "moe/Dialect/Exec/IR/ExecOps.h"
#include "moe/Transforms/Layout.h"

using namespace llvm;
using namespace moe;

namespace moe::driver::timing {

const Recompute kNone{"none", "every intermediate saved", false, false},
    kSelective{"selective", "the experts' intermediates recomputed", true, false},
    kFull{"full", "whole layers recomputed", false, true};

SmallVector<Recompute> recomputeCandidates(const CompileOptions &options, bool automatic) {
  if (!automatic)
    return {options.recomputeLayers    ? kFull
            : options.recomputeExperts ? kSelective
                                       : kNone};
  if (options.capacityFactor == 0)
    return {kNone, kSelective, kFull};
  return {kNone, kFull};
}

Workload workloadOf(mlir::ModuleOp module, const hf::ModelConfig &config, int64_t ep,
                    int64_t stage) {
  Workload w;
  w.layers = static_cast<double>(config.numLayers);
  const llvm::StringMap<mlir::Type> logical = moe::logicalWeightTypes(module);
  // The weights the train program differentiates (the optimizer's).
  for (auto program : module.getOps<exec::ProgramOp>()) {
    if (program.getEntry() != "train" || (stage >= 0 && program.getStage() != stage))
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

UpdateTime updateTime(const Workload &w, const sharding::Cluster &machine, int64_t replicas,
                      int64_t tp, int64_t ep, int64_t zero, const Recompute &recompute,
                      double tokensPerMicroBatch, int64_t microBatchesPerReplica, bool bf16,
                      bool optimizer, const hf::ModelConfig &config, int64_t pp) {
  UpdateTime t;
  const double N = static_cast<double>(replicas), share = static_cast<double>(microBatchesPerReplica);
  const double T = static_cast<double>(tp), E = static_cast<double>(ep);
  const double dense = (w.parameters - w.expertParameters) / T;
  // The CPU machine's ranks are processes sharing its cores and memory.
  const double ways = machine.name == "cpu" ? N * T * static_cast<double>(pp) : 1;
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
  t.compute += share * 5 * 4 * held / (machine.memoryBandwidth / ways);
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
      const double layers = w.layers;
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


} // namespace moe::driver::timing
