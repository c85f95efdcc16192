//===- ReportModel.h - what a plan report shows -----------------*- C++ -*-===//
//
// The figures of one plan (and of a moert --report-json file) that the
// report draws, read once from the JSON (ReportModel.cpp) so that the
// renderer (PlanReport.cpp) only lays them out.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_LIB_TARGET_REPORT_REPORTMODEL_H
#define MOE_LIB_TARGET_REPORT_REPORTMODEL_H

#include "llvm/Support/Error.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moe::report {

struct Memory {
  int64_t weights = 0, kvCache = 0, activations = 0, workspace = 0, peak = 0;
  bool operator<(const Memory &o) const {
    return std::tie(weights, kvCache, activations, workspace, peak) <
           std::tie(o.weights, o.kvCache, o.activations, o.workspace, o.peak);
  }
};

struct Rank {
  int64_t rank = 0, program = 0;
  int64_t dp = 0, pp = 0, tp = 0, edp = 0, ep = 0, etp = 0;
  Memory memory;
  int64_t slices = 0, sliceBytes = 0, primaryBytes = 0;
  int64_t slicesOf = -1; ///< the rank whose slices these are (weights_of_rank), else itself
  int64_t firstExpert = -1, experts = 0; ///< the expert stacks' range on this rank
  /// The peak of the rank's program as compiled (weights + its buffers +
  /// KV caches: what moert --report-memory compares with), bytes.
  int64_t programPeak = 0;
  /// measured (moert --report-json), -1 when not measured
  int64_t measuredWeights = -1, measuredPeak = -1;
};

/// One stage's predicted time of a micro-batch, seconds, by component.
struct StageTime {
  int64_t firstLayer = 0, endLayer = 0;
  std::vector<std::pair<std::string, double>> parts; ///< in kTimeParts order
  Memory memory;
};

struct Alternative {
  std::string degrees;
  bool fits = true;
  int64_t peak = 0;
  double tokensPerSecond = 0;
  std::string reason; ///< a rejection's
};

struct Slice {
  std::string name, dtype;
  std::vector<int64_t> offset, shape, globalShape;
  int64_t bytes = 0;
};

struct Model {
  std::string planPath, modelType, source, cluster, clusterDescription;
  int64_t vocabSize = 0, padded = 0, padTo = 0, worldSize = 1, devicesPerNode = 1;
  int64_t memoryBytes = 0, memoryBudget = 0;
  int64_t maxBatchTokens = 0, maxSeqLen = 0, maxSequences = 0;
  std::map<std::string, int64_t> degrees; ///< dp pp tp ep etp edp
  std::map<std::string, std::string> links; ///< axis -> intra_node / inter_node
  std::vector<int64_t> stageBegin;
  std::string expertStack; ///< the first expert stack's name ("" for a dense model)
  int64_t numExperts = 0;
  std::vector<Rank> ranks;
  /// The slices of each rank that lists its own (by rank).
  std::map<int64_t, std::vector<Slice>> slices;
  bool hasPlanner = false;
  double tokensPerSecond = 0, stepSeconds = 0, bubbleSeconds = 0;
  int64_t layoutsConsidered = 0, fitting = 0;
  std::vector<StageTime> stages;
  std::vector<Alternative> alternatives, rejected;
  /// measured
  bool measured = false;
  std::string measuredPath;
  double measuredTokensPerSecond = 0, measuredSeconds = 0;
  int64_t measuredTokens = 0;
};

/// The parts of a stage's time, in drawing order.
inline const char *const kTimeParts[] = {"gemm",       "attention",  "memory_bound",
                                         "all_to_all", "all_reduce", "p2p"};

llvm::Expected<Model> readModel(llvm::StringRef planPath, llvm::StringRef measuredPath);

/// Reads a plan (and a moert --report-json file, when `measuredPath` is set).


} // namespace moe::report

#endif // MOE_LIB_TARGET_REPORT_REPORTMODEL_H
