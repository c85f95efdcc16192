//===- Planner.h - choose a layout; what each rank owns ---------*- C++ -*-===//
//
// Typical use (moec compile):
//
//   auto config  = hf::loadModelConfig(path);
//   auto model   = ModelInfo::build(*config);            // or with DType::FP8
//   auto cluster = makeCluster("h100", 2048);            // or loadClusterFile
//   auto result  = planSharding(*model, *cluster, workload, options, fixed);
//   const LayoutEstimate &plan = result->chosen();
//   for (int64_t r = 0; r < plan.layout.degrees.world(); ++r)
//     weightSlices(*model, plan.layout, r);              // the plan's slice
//     map
//
// The search enumerates every valid (dp, pp, tp, ep, etp) for the world size
// that agrees with the fixed degrees, estimates each (CostModel.h), rejects
// those whose largest rank exceeds the memory budget, and ranks the rest by
// throughput; near-equal throughputs (within 1e-6 relative) are ordered by
// fewer pp, then smaller tp, then smaller etp, then larger ep.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_ANALYSIS_PLANNER_H
#define MOE_ANALYSIS_PLANNER_H

#include "moe/Analysis/CostModel.h"

#include <optional>

namespace moe::sharding {

/// Degrees the user fixed (--dp --pp --tp --ep --etp); the rest are searched.
struct FixedDegrees {
  std::optional<int64_t> dp, pp, tp, ep, etp;
};

/// Checks fixed degrees on their own and together (divisibility of the
/// model's sizes and of the world size, pp <= layers, dense models ep = etp
/// = 1, folding: ep x etp divides dp x tp). One-line messages naming the
/// options, e.g. `--ep 3: expected a divisor of num_local_experts (8)`.
llvm::Error validateFixedDegrees(const ModelInfo &m, int64_t worldSize,
                                 const FixedDegrees &f);

/// Every valid layout of `worldSize` ranks that agrees with `f`, in a
/// deterministic order (pp, tp, ep, etp ascending).
std::vector<Degrees> enumerateLayouts(const ModelInfo &m, int64_t worldSize,
                                      const FixedDegrees &f);

struct Rejection {
  Degrees degrees;
  std::string
      reason; ///< e.g. "needs 88.1 GiB per rank (...) > 72.0 GiB usable"
  LayoutEstimate estimate; ///< what was estimated
  /// It fits, but the compiler would not run it (reason says why).
  enum class Rule : uint8_t {
    None,        ///< it does not fit
    EtpAcrossDp, ///< PlanOptions::etpWithinTp: etp does not divide tp
    Fp8Group,    ///< PlanOptions::wholeFp8Groups: it cuts an FP8 input group
  } rule = Rule::None;
};

struct PlanResult {
  /// Layouts that fit, best first; ranked.front() is the choice.
  std::vector<LayoutEstimate> ranked;
  std::vector<Rejection> rejected; ///< in enumeration order
  int64_t layoutsConsidered = 0;
  double searchSeconds = 0;
  const LayoutEstimate &chosen() const { return ranked.front(); }
};

/// Searches the layouts of `cluster.worldSize` ranks. Fails on bad input
/// (workload, options, fixed degrees) and when no layout fits, with the
/// closest one in the message: `no layout of 16 x h100 fits: the smallest
/// need is 84.2 GiB per rank (dp=1 pp=8 tp=2 ep=8 etp=1) > 72.0 GiB usable
/// (90% of 80.0 GiB); add ranks or use a device with more memory`.
llvm::Expected<PlanResult> planSharding(const ModelInfo &m,
                                        const Cluster &cluster,
                                        const Workload &w, const PlanOptions &o,
                                        const FixedDegrees &fixed = {});

/// Human-readable explanation (moec --explain): the machine, the choice with
/// its per-rank memory and time breakdown, stage placement, the next
/// `alternatives` layouts and a count (and the first few) of the rejections.
std::string explainPlan(const ModelInfo &m, const Cluster &cluster,
                        const Workload &w, const PlanResult &r,
                        size_t alternatives = 5);
/// {"chosen": {...}, "alternatives": [...], "rejected": [{degrees, reason}],
///  "layouts_considered": N, "search_seconds": s}
llvm::json::Value toJSON(const PlanResult &r, size_t alternatives = 10);

//===----------------------------------------------------------------------===//
// Weight slices
//===----------------------------------------------------------------------===//

/// One box of one checkpoint tensor that a rank loads.
struct WeightSlice {
  std::string name;                 ///< checkpoint tensor name
  std::vector<int64_t> globalShape; ///< the tensor's shape in the checkpoint
  std::vector<int64_t> offset;      ///< box start, per dimension
  std::vector<int64_t> shape;       ///< box size, per dimension
  DType dtype = DType::BF16;
  int64_t bytes = 0; ///< elements of the box x dtype size (exact)
  /// FP8 weights: the [rows, cols] of a block of the `<name>_scale_inv`
  /// tensor beside them; empty otherwise.
  std::vector<int64_t> block;
  Split split = Split::Replicated;
  /// True on exactly one rank per model replica for every element (the
  /// copy a sharded checkpoint save writes): TP rank 0 for replicated
  /// tensors, the first stage for a tied embedding's copy on the last stage.
  bool primary = true;
};

/// Every slice rank `rank` loads, in checkpoint order. Padding rows of the
/// vocabulary are never in a slice: the last TP parts are clipped (and a
/// part wholly in the padding has no slice).
std::vector<WeightSlice>
weightSlices(const ModelInfo &m, const ShardingLayout &layout, int64_t rank);
/// Dynamic FP8 activations scale each 1 x 128 group of a row as one, so a
/// rank must hold an FP8 weight's input columns (dim 1) in whole groups.
/// The first FP8 weight whose input columns `d` splits inside a group, said
/// as "<name>: tp=2 splits its 128 input columns into 64-column slices,
/// cutting its 128-column groups"; nullopt when every group stays whole.
std::optional<std::string> fp8GroupCut(const ModelInfo &m, const Degrees &d);
/// The sum of weightSlices(m, layout, rank) bytes, without building names.
int64_t rankWeightBytes(const ModelInfo &m, const ShardingLayout &layout,
                        int64_t rank);

struct CoverageReport {
  int64_t replicas = 0; ///< attention-fold (dp) + expert-fold (edp) replicas
  int64_t tensorsChecked = 0; ///< (replica, tensor) pairs
  int64_t boxes = 0;          ///< slices examined
};
/// Checks, by counting boxes, that within every model replica (ranks of one
/// dp index for attention-fold tensors, of one edp index for routed experts)
/// every element of every checkpoint tensor has exactly one primary owner and
/// is loaded by the expected number of ranks (tp for replicated tensors, 2
/// for a tied embedding with pp > 1, else 1), that every box lies inside its
/// tensor and that its bytes are exact. The error names the tensor, the
/// element and the replica.
llvm::Expected<CoverageReport> checkCoverage(const ModelInfo &m,
                                             const ShardingLayout &layout);

} // namespace moe::sharding

#endif // MOE_ANALYSIS_PLANNER_H
