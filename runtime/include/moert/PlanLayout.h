// The distribution part of a plan: which slice (box) of which checkpoint
// tensor each rank holds, for any world size. Used by the CPU device to fill
// each rank's weights and by `moert convert` to write sharded checkpoints.
#pragma once

#include "moert/Tensor.h"

#include <map>
#include <string>
#include <vector>

namespace moert {

/// One box of one checkpoint tensor held by a rank.
struct PlanSlice {
  std::string name;                 ///< checkpoint tensor name (no "{e}")
  std::vector<int64_t> globalShape; ///< the whole tensor's (unpadded) shape
  std::vector<int64_t> offset, shape;
  DType dtype = DType::F32;
  /// F8E4M3 weights: the [rows, cols] of one block of the scales in the
  /// checkpoint tensor `<name>_scale_inv` (a slice of the rank's too).
  std::vector<int64_t> block;
  /// false: a copy that another rank of the same replica owns.
  bool primary = true;
};

struct PlanLayout {
  std::string path;
  std::string modelType;
  std::string source; ///< model.source: the config.json the plan was compiled from
  int64_t worldSize = 1;
  std::map<std::string, int64_t> degrees;
  /// The slices of every rank; a rank whose plan entry says
  /// `weights_of_rank: R` gets rank R's slices, all marked non-primary.
  std::vector<std::vector<PlanSlice>> ranks;

  /// Reads and validates the plan at `path` (its format, version, world
  /// size, and every slice: names, shapes, boxes inside the global shape,
  /// dtypes, bytes). A single-rank plan without per-rank slice lists gets one
  /// whole-tensor primary slice per checkpoint tensor (expert stacks
  /// expanded). InputError naming the plan and the field.
  static PlanLayout load(const std::string &path);

  /// Rank `rank`'s slice of checkpoint tensor `name`; null when it has none.
  const PlanSlice *slice(int64_t rank, const std::string &name) const;
};

} // namespace moert
