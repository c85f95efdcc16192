// One rank's weights from a checkpoint (moert/RankWeights.h).
#include "moert/RankWeights.h"
#include "moert/Error.h"
#include "moert/PlanLayout.h"

#include "checkpoint/Progress.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace moert {
namespace {
/// A figure of /proc/self/status (`key`: "VmRSS:" now, "VmHWM:" peak),
/// bytes; 0 where it cannot be read.
int64_t residentBytes(const char *key) {
  FILE *status = std::fopen("/proc/self/status", "r");
  if (!status)
    return 0;
  char line[256];
  int64_t kib = 0;
  while (std::fgets(line, sizeof line, status))
    if (!std::strncmp(line, key, std::strlen(key)))
      kib = std::strtoll(line + std::strlen(key), nullptr, 10);
  std::fclose(status);
  return kib * 1024;
}

/// n values of a float dtype as f32.
void widenRow(DType dtype, const char *src, int64_t n, float *out) {
  if (dtype == DType::F32) {
    std::memcpy(out, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    out[i] = dtype == DType::BF16 ? bf16ToFloat(h) : f16ToFloat(h);
  }
}

} // namespace

void RankWeights::bind(const Plan &thePlan, int64_t rankIndex, const Checkpoint &ckpt,
                       const std::function<void(int64_t)> &onBytesFn) {
  plan = &thePlan;
  rank = rankIndex;
  coords = plan->ranks.at(rankIndex).coords;
  onBytes = onBytesFn;
  const PlanProgram *program = &plan->programOf(rankIndex);
  slices.clear();
  for (const PlanSlice &s : plan->layout->ranks.at(rank))
    slices.emplace(s.name, &s);
  std::unordered_map<std::string, const PlanWeight *> logical;
  for (const PlanWeight &w : plan->weights)
    logical.emplace(w.name, &w);

  // (Used by any entry of the rank: a pipeline stage's backward program
  // declares its embedding table only for its gradient, which its forward
  // program's lookup binds.)
  std::vector<bool> used(program->weights.size(), false);
  for (const PlanProgram *entry : plan->entriesOf(rankIndex))
    for (const PlanStep &s : entry->steps)
      for (int64_t w : s.weights)
        used[static_cast<size_t>(w)] = true;
  weights_.assign(program->weights.size(), {});
  owned.clear();
  blockScales.clear();
  bound = loaded = 0;
  // Bytes this rank reads (progress), and the resident memory loading
  // adds (MOERT_LOAD_REPORT=1 prints it against the rank's shard bytes).
  uint64_t toLoad = 0;
  for (const PlanSlice &s : plan->layout->ranks.at(rank))
    toLoad += TensorView{s.dtype, s.shape, nullptr}.bytes();
  uint64_t progressed = 0;
  const int64_t rssBefore = residentBytes("VmRSS:");
  Progress progress(fmt::format("load (rank {})", rank), toLoad, rank == 0);
  for (size_t i = 0; i < program->weights.size(); ++i) {
    if (!used[i])
      continue;
    const PlanWeight &local = program->weights[i];
    const PlanWeight &global = *logical.at(local.name); // checked by Plan::load
    if (local.experts == 0) {
      weights_[i].view =
          bindOne(ckpt, local.name, global.shape, local.shape, local.dtype, local.int8Block);
      progress.add(static_cast<uint64_t>(loaded) - progressed);
      progressed = static_cast<uint64_t>(loaded);
      continue;
    }
    for (int64_t l = 0; l < local.experts; ++l) {
      int64_t e = coords.ep * local.experts + l;
      if (e >= global.experts)
        inputError("{}: rank {} (ep {}) would hold expert {} of '{}', a stack of {}", plan->path,
                   rank, coords.ep, e, global.name, global.experts);
      TensorView v = bindOne(ckpt, global.expertName(e), global.tensorShape(), local.tensorShape(),
                             local.dtype, local.int8Block);
      weights_[i].experts.push_back(v);
      progress.add(static_cast<uint64_t>(loaded) - progressed);
      progressed = static_cast<uint64_t>(loaded);
    }
  }
  slices.clear(); // used during bind() only
  progress.finish();
  const char *report = std::getenv("MOERT_LOAD_REPORT");
  if (report && !std::strcmp(report, "1")) {
    // Growth: the peak after loading over the resident set before it (an
    // upper bound of what loading added at its peak).
    const int64_t hwmAfter = residentBytes("VmHWM:");
    fmt::print(stderr,
               "moert: load: rank {}: shard bytes {}, RSS before {}, peak RSS after {} "
               "(+{} bytes during load)\n",
               rank, toLoad, rssBefore, hwmAfter, hwmAfter - rssBefore);
    std::fflush(stderr);
  }
}

/// One local tensor `name` of `localShape` from this rank's box of the
/// checkpoint tensor (of `globalShape`): the tensor itself when the box is
/// all of it and the local shape is its shape, else an owned copy of the
/// box at the origin, zero elsewhere (vocabulary padding rows); int8
/// weights (int8Block > 0) quantised by bindInt8.
TensorView RankWeights::bindOne(const Checkpoint &ckpt, const std::string &name,
                                const std::vector<int64_t> &globalShape,
                                const std::vector<int64_t> &localShape, DType dtype,
                                int64_t int8Block) {
  TensorView localView{dtype, localShape, nullptr};
  auto found = slices.find(name);
  if (found == slices.end()) {
    // Only a part of the vocabulary wholly past the checkpoint's rows
    // (padding) has no box; it is all zeros.
    bool padding = !localShape.empty() && globalShape[0] == plan->vocabSize &&
                   coords.tp * localShape[0] >= plan->vocabSize;
    if (!padding)
      inputError("{}: rank {} holds no slice of '{}' (ranks[{}].weights)", plan->path, rank, name,
                 rank);
    return ownedCopy(localView);
  }
  const PlanSlice &slice = *found->second;
  // Say what differs (the shape, the dtype or both), not two equal halves.
  if (slice.globalShape != globalShape && slice.dtype != dtype)
    inputError("{}: rank {}'s slice of '{}' is of a {} {} tensor but the plan's weight is {} {}",
               plan->path, rank, name, dtypeName(slice.dtype), shapeString(slice.globalShape),
               dtypeName(dtype), shapeString(globalShape));
  if (slice.globalShape != globalShape)
    inputError("{}: rank {}'s slice of '{}' is of a tensor of shape {} but the plan's weight has "
               "shape {}",
               plan->path, rank, name, shapeString(slice.globalShape), shapeString(globalShape));
  // A weight computes in its slice's dtype, or in bf16 from an f32 slice
  // (moec compile --param-dtype bf16: rounded here, to nearest even).
  const bool rounded = slice.dtype == DType::F32 && dtype == DType::BF16;
  // An FP8 slice computes as the plan's dtype through its block scales.
  const bool fp8 = slice.dtype == DType::F8E4M3 &&
                   (dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16);
  if (fp8 && slice.shape != localShape)
    inputError("{}: rank {}'s box {} of FP8 weight '{}' differs from the program's {} tensor",
               plan->path, rank, shapeString(slice.shape), name, shapeString(localShape));
  if (slice.dtype != dtype && !rounded && !fp8)
    inputError("{}: rank {}'s slice of '{}' is of a {} tensor but the plan's weight is {}",
               plan->path, rank, name, dtypeName(slice.dtype), dtypeName(dtype));
  // The plan's dtype is part of its memory figures: a checkpoint in
  // another dtype is another model file.
  TensorView whole = ckpt.info(name, globalShape);
  if (whole.dtype != slice.dtype)
    inputError("{}: tensor '{}': expected dtype {} (the plan's) but found {}", ckpt.fileOf(name),
               name, dtypeName(slice.dtype), dtypeName(whole.dtype));
  if (int8Block)
    return bindInt8(ckpt, slice, localShape, dtype, int8Block);
  TensorView box{slice.dtype, slice.shape, nullptr};
  loaded += static_cast<int64_t>(box.bytes());

  // A whole tensor of a Hugging Face checkpoint is used in place (a view
  // into its mapping: no copy, its pages resident once touched); any other
  // box is read (pread, only its bytes) into a buffer the device owns.
  bool atOrigin =
      std::all_of(slice.offset.begin(), slice.offset.end(), [](int64_t o) { return o == 0; });
  // (A plan with an optimizer writes its weights: always copies.)
  if (ckpt.hasViews() && atOrigin && slice.shape == globalShape && localShape == globalShape &&
      !plan->optimizer && !rounded) {
    whole = ckpt.tensor(name, globalShape);
    bound += static_cast<int64_t>(whole.bytes());
    onBytes(static_cast<int64_t>(whole.bytes()));
    if (fp8)
      whole.blocks = bindScales(ckpt, slice, dtype);
    return whole;
  }
  for (size_t d = 0; d < localShape.size(); ++d)
    if (slice.shape.size() != localShape.size() || slice.shape[d] > localShape[d])
      inputError("{}: rank {}'s box {} of '{}' does not fit the program's {} tensor", plan->path,
                 rank, shapeString(slice.shape), name, shapeString(localShape));
  if (fp8)
    localView.dtype = DType::F8E4M3; // one byte per element in memory too
  TensorView copy = ownedCopy(localView);
  if (rounded) {
    std::vector<float> values(static_cast<size_t>(localView.numel()));
    ckpt.readBox(name, slice.offset, slice.shape, DType::F32,
                 reinterpret_cast<char *>(values.data()), localShape);
    auto *to = static_cast<uint16_t *>(const_cast<void *>(copy.data));
    for (size_t i = 0; i < values.size(); ++i)
      to[i] = floatToBf16(values[i]);
    return copy;
  }
  if (fp8) {
    ckpt.readBox(name, slice.offset, slice.shape, DType::F8E4M3,
                 static_cast<char *>(const_cast<void *>(copy.data)), localShape);
    copy.blocks = bindScales(ckpt, slice, dtype);
    return copy;
  }
  ckpt.readBox(name, slice.offset, slice.shape, dtype,
               static_cast<char *>(const_cast<void *>(copy.data)), localShape);
  return copy;
}

/// The block scales of FP8 weight slice `weight` (which computes as
/// `computeDtype`): the rank's box of `<name>_scale_inv`, which must cover
/// every block the weight's box touches.
const BlockScales *RankWeights::bindScales(const Checkpoint &ckpt, const PlanSlice &weight,
                                           DType computeDtype) {
  const std::string name = weight.name + "_scale_inv";
  auto found = slices.find(name);
  if (found == slices.end())
    inputError("{}: rank {} holds FP8 weight '{}' but no slice of its scales '{}'", plan->path,
               rank, weight.name, name);
  const PlanSlice &scales = *found->second;
  const int64_t br = weight.block[0], bc = weight.block[1];
  const std::vector<int64_t> grid{(weight.globalShape[0] + br - 1) / br,
                                  (weight.globalShape[1] + bc - 1) / bc};
  if (scales.dtype != DType::F32 || scales.globalShape != grid)
    inputError("{}: rank {}'s slice of '{}' is {} {}, but blocks of {}x{} of '{}' {} need F32 {}",
               plan->path, rank, name, dtypeName(scales.dtype), shapeString(scales.globalShape),
               br, bc, weight.name, shapeString(weight.globalShape), shapeString(grid));
  for (int d = 0; d < 2; ++d) {
    const int64_t block = d == 0 ? br : bc;
    const int64_t first = weight.offset[d] / block,
                  last = (weight.offset[d] + weight.shape[d] + block - 1) / block;
    if (scales.offset[d] > first || scales.offset[d] + scales.shape[d] < last)
      inputError("{}: rank {}'s box {} at {} of '{}' does not cover the blocks [{}, {}) of "
                 "dimension {} that its weight's box uses",
                 plan->path, rank, shapeString(scales.shape), shapeString(scales.offset), name,
                 first, last, d);
  }
  TensorView info = ckpt.info(name, scales.globalShape);
  if (info.dtype != DType::F32)
    inputError("{}: tensor '{}': expected dtype F32 (FP8 block scales) but found {}",
               ckpt.fileOf(name), name, dtypeName(info.dtype));
  TensorView box = ownedCopy(TensorView{DType::F32, scales.shape, nullptr});
  loaded += static_cast<int64_t>(box.bytes());
  auto *values = static_cast<float *>(const_cast<void *>(box.data));
  ckpt.readBox(name, scales.offset, scales.shape, DType::F32, reinterpret_cast<char *>(values),
               scales.shape);
  for (int64_t i = 0; i < box.numel(); ++i)
    if (!std::isfinite(values[i]))
      inputError("{}: tensor '{}': block scale {} is {} (expected a finite value)",
                 ckpt.fileOf(name), name, i, values[i]);
  BlockScales &b = blockScales.emplace_back();
  b.data = values;
  b.stride = scales.shape[1];
  b.blockRows = br;
  b.blockCols = bc;
  b.rowOrigin = weight.offset[0] - scales.offset[0] * br;
  b.colOrigin = weight.offset[1] - scales.offset[1] * bc;
  b.computeDtype = computeDtype == DType::F32 ? DType::F32 : DType::BF16;
  b.quantiseActivations = plan->fp8DynamicActivations;
  return &b;
}

/// Weight slice `slice` quantised to symmetric int8 (moec compile
/// --weight-format int8): per row, per block of `block` columns counted
/// from the checkpoint tensor's first column (the same blocks whatever the
/// layout: a box that starts inside one reads the whole block), scale =
/// max |w| / 127 and q = round-half-even(w / scale) in [-127, 127] (0 where
/// the block is all zero; the clamp only matters where a subnormal scale
/// lost bits). Rows are read a band at a time (bounded scratch); rows of
/// `localShape` past the box (vocabulary padding) stay zero.
TensorView RankWeights::bindInt8(const Checkpoint &ckpt, const PlanSlice &slice,
                                 const std::vector<int64_t> &localShape, DType dtype,
                                 int64_t block) {
  const std::string &name = slice.name;
  if (slice.dtype != dtype || slice.shape.size() != 2 || localShape.size() != 2 ||
      localShape[1] != slice.shape[1] || localShape[0] < slice.shape[0])
    inputError("{}: rank {}'s {} box {} of '{}' cannot be quantised to int8 into the program's "
               "{} {} tensor",
               plan->path, rank, dtypeName(slice.dtype), shapeString(slice.shape), name,
               dtypeName(dtype), shapeString(localShape));
  if (plan->optimizer)
    inputError("{}: not supported yet: training int8 weights ('{}')", plan->path, name);
  const int64_t rows = slice.shape[0], cols = slice.shape[1], K = slice.globalShape[1];
  const int64_t first = slice.offset[1] / block * block,
                last = std::min(K, (slice.offset[1] + cols + block - 1) / block * block),
                width = last - first, blocks = (width + block - 1) / block,
                skip = slice.offset[1] - first;
  TensorView q = ownedCopy(TensorView{DType::I8, localShape, nullptr});
  TensorView s = ownedCopy(TensorView{DType::F32, {localShape[0], blocks}, nullptr});
  auto *values = static_cast<int8_t *>(const_cast<void *>(q.data));
  auto *scales = static_cast<float *>(const_cast<void *>(s.data));
  const int64_t elementBytes = static_cast<int64_t>(dtypeSize(slice.dtype));
  const int64_t band = std::clamp<int64_t>((int64_t(16) << 20) / (width * elementBytes), 1, rows);
  std::vector<char> raw(static_cast<size_t>(band * width * elementBytes));
  std::vector<float> row(static_cast<size_t>(width));
  for (int64_t r0 = 0; r0 < rows; r0 += band) {
    const int64_t m = std::min(band, rows - r0);
    ckpt.readBox(name, {slice.offset[0] + r0, first}, {m, width}, slice.dtype, raw.data());
    loaded += m * width * elementBytes;
    for (int64_t r = 0; r < m; ++r) {
      widenRow(slice.dtype, raw.data() + r * width * elementBytes, width, row.data());
      // (Loops the compiler vectorises: the bits of |w|, finite ones
      // ordered as their values.)
      uint32_t nonFinite = 0;
      for (int64_t c = 0; c < width; ++c)
        nonFinite |= magnitudeBits(row[c]) >= 0x7f800000u;
      if (nonFinite)
        for (int64_t c = 0; c < width; ++c)
          if (!std::isfinite(row[c]))
            inputError("{}: tensor '{}': element [{}, {}] is {} (int8 weights need finite "
                       "values)",
                       ckpt.fileOf(name), name, slice.offset[0] + r0 + r, first + c, row[c]);
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t c0 = b * block, c1 = std::min(width, c0 + block);
        uint32_t most = 0;
        for (int64_t c = c0; c < c1; ++c)
          most = std::max(most, magnitudeBits(row[c]));
        float largest;
        std::memcpy(&largest, &most, sizeof largest);
        const float scale = largest / 127.0f;
        scales[(r0 + r) * blocks + b] = scale;
        if (scale == 0)
          continue; // (the values stay zero)
        int8_t *out = values + (r0 + r) * cols - skip;
        for (int64_t c = std::max(c0, skip); c < std::min(c1, skip + cols); ++c)
          out[c] = static_cast<int8_t>(std::clamp(roundHalfEven(row[c] / scale), -127.0f, 127.0f));
      }
    }
  }
  BlockScales &b = blockScales.emplace_back();
  b.data = scales;
  b.stride = blocks;
  b.blockRows = 1;
  b.blockCols = block;
  b.colOrigin = skip;
  b.computeDtype = dtype == DType::F32 ? DType::F32 : DType::BF16;
  q.blocks = &b;
  return q;
}

/// A zeroed tensor of `view`'s dtype and shape that the device owns.
TensorView RankWeights::ownedCopy(TensorView view) {
  owned.emplace_back(view.bytes());
  view.data = owned.back().get();
  bound += static_cast<int64_t>(view.bytes());
  onBytes(static_cast<int64_t>(view.bytes()));
  return view;
}

void RankWeights::release() {
  owned.clear();
  for (Weight &w : weights_) {
    w.view.data = nullptr;
    for (TensorView &e : w.experts)
      e.data = nullptr;
  }
}

} // namespace moert
