// One rank's weights, bound from a checkpoint for its program: every program
// weight (rank-local shape) filled from the rank's slices of the plan
// (PlanLayout). A whole tensor of a Hugging Face checkpoint is a view into
// its mapping (no copy); any other box is read (Checkpoint::readBox: pread
// of just its bytes, from a Hugging Face or a sharded checkpoint of any
// layout) into a buffer this object owns, at the local tensor's origin, zero
// elsewhere (vocabulary padding rows). Shared by the CPU and CUDA devices
// (the CUDA one uploads and then drops them).
#pragma once

#include "moert/Checkpoint.h"
#include "moert/HostBlock.h"
#include "moert/Plan.h"
#include "moert/PlanLayout.h"

#include <deque>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

namespace moert {

class RankWeights {
public:
  struct Weight {
    TensorView view;                  ///< a plain weight (data null if unused)
    std::vector<TensorView> experts;  ///< an expert stack: one per local expert
  };

  /// Binds every weight the program's steps use. `onBytes` is told the
  /// bytes each bound tensor holds (views at their size), for the device's
  /// memory accounting. Shows a progress bar on rank 0; with
  /// MOERT_LOAD_REPORT=1 prints the resident memory loading added.
  void bind(const Plan &plan, int64_t rank, const Checkpoint &checkpoint,
            const std::function<void(int64_t)> &onBytes);

  const std::vector<Weight> &weights() const { return weights_; }
  /// Bytes of checkpoint data read (the rank's boxes) and bytes bound.
  int64_t loadedBytes() const { return loaded; }
  int64_t boundBytes() const { return bound; }
  /// Drops the owned copies (after a device uploaded them).
  void release();

private:
  TensorView bindOne(const Checkpoint &ckpt, const std::string &name,
                     const std::vector<int64_t> &globalShape,
                     const std::vector<int64_t> &localShape, DType dtype, int64_t int8Block);
  TensorView bindInt8(const Checkpoint &ckpt, const PlanSlice &slice,
                      const std::vector<int64_t> &localShape, DType dtype, int64_t block);
  TensorView ownedCopy(TensorView view);
  const BlockScales *bindScales(const Checkpoint &ckpt, const PlanSlice &weight,
                                DType computeDtype);

  const Plan *plan = nullptr;
  int64_t rank = 0;
  RankCoords coords;
  std::function<void(int64_t)> onBytes;
  std::unordered_map<std::string, const PlanSlice *> slices; // during bind()
  std::vector<Weight> weights_;
  std::vector<HostBlock> owned;
  std::deque<BlockScales> blockScales; ///< of FP8 and int8 weights (stable addresses)
  int64_t loaded = 0, bound = 0;
};

} // namespace moert
