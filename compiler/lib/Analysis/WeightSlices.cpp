//===- WeightSlices.cpp - checkpoint boxes per rank -------------*- C++ -*-===//
//
// TP column-parallel tensors split dim 0 (whole heads / equal widths), row-
// parallel ones dim 1; replicated tensors are whole on every TP rank (TP rank
// 0 is their primary owner); the embedding and LM head split dim 0 into
// paddedVocab / tp rows per rank, clipped to the real vocabulary; routed
// expert e lives on EP rank e / (E / ep), split by ETP along its
// intermediate dimension; PP keeps only the stage's layers.
//
//===----------------------------------------------------------------------===//
#include "moe/Analysis/Planner.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <optional>

using namespace llvm;
using namespace moe::sharding;

namespace {

constexpr int kMaxDims = 3;

struct Box {
  int32_t tensor = 0;
  int8_t dims = 0;
  bool primary = true;
  int64_t off[kMaxDims] = {0, 0, 0};
  int64_t len[kMaxDims] = {1, 1, 1};
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < dims; ++i)
      n *= len[i];
    return n;
  }
};

bool isExpertSplit(Split s) {
  return s == Split::Expert || s == Split::FusedExperts;
}

/// Calls f(Box) for every box rank `rc` loads, stage by stage.
template <typename F>
void forEachBox(const ModelInfo &m, const ShardingLayout &layout,
                const RankCoords &rc, F &&f) {
  const Degrees &d = layout.degrees;
  auto whole = [&](int32_t idx, bool primary) {
    const std::vector<int64_t> &shape = m.tensors[idx].spec.shape;
    Box b;
    b.tensor = idx;
    b.dims = int8_t(shape.size());
    b.primary = primary;
    for (int i = 0; i < b.dims; ++i)
      b.len[i] = shape[i];
    return b;
  };
  auto split = [&](int32_t idx, int dim, int64_t parts, int64_t part) {
    Box b = whole(idx, true);
    int64_t chunk = b.len[dim] / parts;
    b.off[dim] = part * chunk;
    b.len[dim] = chunk;
    f(b);
  };
  auto vocab = [&](int32_t idx, bool primary) {
    Box b = whole(idx, primary);
    int64_t rows = b.len[0], per = layout.vocabRowsPerRank();
    int64_t start = rc.tp * per;
    if (start >= rows)
      return; // wholly in the padding
    b.off[0] = start;
    b.len[0] = std::min(per, rows - start);
    f(b);
  };
  auto place = [&](int32_t idx) {
    const PlannedTensor &t = m.tensors[idx];
    switch (t.split) {
    case Split::Replicated:
      f(whole(idx, rc.tp == 0));
      break;
    case Split::Column:
      split(idx, 0, d.tp, rc.tp);
      break;
    case Split::Row:
      split(idx, 1, d.tp, rc.tp);
      break;
    case Split::Vocab:
      vocab(idx, true);
      break;
    case Split::Expert:
      if (t.wholeInEtpGroup)
        f(whole(idx, rc.etp == 0));
      else
        split(idx, t.etpDim, d.etp, rc.etp);
      break;
    case Split::FusedExperts:
      split(idx, 0, d.ep, rc.ep);
      break;
    }
  };

  const int64_t stage = rc.pp;
  if (stage == 0)
    for (int32_t idx : m.firstStageTensors)
      place(idx);
  int64_t local = m.isMoE() ? m.config.numExperts / d.ep : 0;
  for (int64_t l = layout.stageBegin[stage]; l < layout.stageBegin[stage + 1];
       ++l) {
    for (int32_t idx : m.layerTensors[l])
      place(idx);
    if (!m.isMoE())
      continue;
    for (int64_t e = rc.ep * local; e < (rc.ep + 1) * local; ++e)
      for (int32_t idx : m.expertTensors[l][e])
        place(idx);
    for (int32_t idx : m.fusedExperts[l])
      place(idx);
  }
  if (stage == d.pp - 1) {
    for (int32_t idx : m.lastStageTensors)
      place(idx);
    if (d.pp > 1)
      for (int32_t idx : m.firstStageTensors)
        if (m.tensors[idx].alsoOnLastStage)
          vocab(idx, /*primary=*/false);
  }
}

Error makeError(const Twine &message) {
  return createStringError(inconvertibleErrorCode(), "%s",
                           message.str().c_str());
}

std::string element(ArrayRef<int64_t> at) {
  std::string s = "[";
  for (size_t i = 0; i < at.size(); ++i)
    s += (i ? ", " : "") + std::to_string(at[i]);
  return s + "]";
}

} // namespace

std::vector<WeightSlice>
moe::sharding::weightSlices(const ModelInfo &m, const ShardingLayout &layout,
                            int64_t rank) {
  std::vector<Box> boxes;
  forEachBox(m, layout, rankCoords(layout.degrees, rank),
             [&](const Box &b) { boxes.push_back(b); });
  std::stable_sort(boxes.begin(), boxes.end(), [](const Box &a, const Box &b) {
    return a.tensor < b.tensor;
  });
  std::vector<WeightSlice> out;
  out.reserve(boxes.size());
  for (const Box &b : boxes) {
    const PlannedTensor &t = m.tensors[b.tensor];
    WeightSlice s;
    s.name = t.spec.name;
    s.globalShape = t.spec.shape;
    s.offset.assign(b.off, b.off + b.dims);
    s.shape.assign(b.len, b.len + b.dims);
    s.dtype = t.dtype;
    s.bytes = b.numel() * t.elementBytes;
    if (t.spec.isFp8())
      s.block = {t.spec.fp8BlockRows, t.spec.fp8BlockCols};
    s.split = t.split;
    s.primary = b.primary;
    out.push_back(std::move(s));
  }
  return out;
}

std::optional<std::string> moe::sharding::fp8GroupCut(const ModelInfo &m,
                                                      const Degrees &d) {
  for (const PlannedTensor &t : m.tensors) {
    const hf::TensorSpec &spec = t.spec;
    if (!spec.isFp8() || spec.shape.size() != 2)
      continue;
    // Row-parallel weights split their input columns by TP; routed experts
    // whose ETP dimension is 1 (down_proj) by ETP.
    const bool row = t.split == Split::Row;
    const bool etp = t.split == Split::Expert && !t.wholeInEtpGroup && t.etpDim == 1;
    const int64_t parts = row ? d.tp : etp ? d.etp : 1;
    const int64_t columns = spec.shape[1], group = spec.fp8BlockCols;
    if (parts <= 1 || (columns / parts) % group == 0)
      continue;
    return formatv("{0}: {1}={2} splits its {3} input columns into {4}-column slices, "
                   "cutting its {5}-column groups",
                   spec.name, row ? "tp" : "etp", parts, columns, columns / parts, group)
        .str();
  }
  return std::nullopt;
}

int64_t moe::sharding::rankWeightBytes(const ModelInfo &m,
                                       const ShardingLayout &layout,
                                       int64_t rank) {
  int64_t bytes = 0;
  forEachBox(m, layout, rankCoords(layout.degrees, rank), [&](const Box &b) {
    bytes += b.numel() * m.tensors[b.tensor].elementBytes;
  });
  return bytes;
}

Expected<CoverageReport>
moe::sharding::checkCoverage(const ModelInfo &m, const ShardingLayout &layout) {
  const Degrees &d = layout.degrees;
  if (int64_t(layout.stageBegin.size()) != d.pp + 1 ||
      layout.stageBegin.front() != 0 ||
      layout.stageBegin.back() != m.numLayers())
    return makeError(formatv("layout: expected {0} stage boundaries from 0 to "
                             "{1}",
                             d.pp + 1, m.numLayers()));
  for (int64_t s = 0; s < d.pp; ++s)
    if (layout.stageBegin[s + 1] <= layout.stageBegin[s])
      return makeError(formatv("layout: stage {0} has no layers", s));
  if (layout.paddedVocab % d.tp || layout.paddedVocab < m.config.vocabSize)
    return makeError(formatv("layout: padded vocabulary {0} is not a multiple "
                             "of tp ({1}) at least the vocabulary ({2})",
                             layout.paddedVocab, d.tp, m.config.vocabSize));

  CoverageReport report;
  std::vector<std::vector<Box>> perTensor(m.tensors.size());
  std::vector<int32_t> attentionTensors, expertTensors;
  for (int32_t i = 0; i < int32_t(m.tensors.size()); ++i)
    (isExpertSplit(m.tensors[i].split) ? expertTensors : attentionTensors)
        .push_back(i);

  // Grid buffers reused across tensors.
  std::vector<int64_t> cuts[kMaxDims];
  std::vector<int32_t> primaries, holders;

  auto verify = [&](int32_t idx, StringRef replica) -> Error {
    const PlannedTensor &t = m.tensors[idx];
    const std::vector<int64_t> &shape = t.spec.shape;
    const std::vector<Box> &boxes = perTensor[idx];
    int dims = int(shape.size());
    ++report.tensorsChecked;
    if (boxes.empty())
      return makeError(formatv("{0}: no rank of replica {1} loads it",
                               t.spec.name, replica));
    if (dims > kMaxDims)
      return makeError(
          formatv("{0}: more than {1} dimensions", t.spec.name, kMaxDims));
    for (int i = 0; i < dims; ++i) {
      cuts[i].assign({0, shape[i]});
      for (const Box &b : boxes) {
        if (b.dims != dims || b.off[i] < 0 || b.len[i] <= 0 ||
            b.off[i] + b.len[i] > shape[i])
          return makeError(formatv("{0}: a slice of replica {1} lies outside "
                                   "the tensor (dimension {2})",
                                   t.spec.name, replica, i));
        cuts[i].push_back(b.off[i]);
        cuts[i].push_back(b.off[i] + b.len[i]);
      }
      llvm::sort(cuts[i]);
      cuts[i].erase(std::unique(cuts[i].begin(), cuts[i].end()), cuts[i].end());
    }
    int64_t extent[kMaxDims] = {1, 1, 1}, cells = 1;
    for (int i = 0; i < dims; ++i) {
      extent[i] = int64_t(cuts[i].size()) - 1;
      cells *= extent[i];
    }
    primaries.assign(cells, 0);
    holders.assign(cells, 0);
    for (const Box &b : boxes) {
      int64_t lo[kMaxDims] = {0, 0, 0}, hi[kMaxDims] = {1, 1, 1};
      for (int i = 0; i < dims; ++i) {
        lo[i] = std::lower_bound(cuts[i].begin(), cuts[i].end(), b.off[i]) -
                cuts[i].begin();
        hi[i] = std::lower_bound(cuts[i].begin(), cuts[i].end(),
                                 b.off[i] + b.len[i]) -
                cuts[i].begin();
      }
      for (int64_t a = lo[0]; a < hi[0]; ++a)
        for (int64_t c = lo[1]; c < hi[1]; ++c)
          for (int64_t e = lo[2]; e < hi[2]; ++e) {
            int64_t cell = (a * extent[1] + c) * extent[2] + e;
            ++holders[cell];
            primaries[cell] += b.primary;
          }
    }
    int64_t expected = 1;
    if (t.split == Split::Replicated)
      expected = d.tp;
    else if (t.wholeInEtpGroup)
      expected = d.etp;
    else if (t.alsoOnLastStage && d.pp > 1)
      expected = 2;
    for (int64_t cell = 0; cell < cells; ++cell) {
      if (primaries[cell] == 1 && holders[cell] == expected)
        continue;
      std::vector<int64_t> at(dims);
      int64_t rest = cell;
      for (int i = dims - 1; i >= 0; --i) {
        at[i] = cuts[i][rest % extent[i]];
        rest /= extent[i];
      }
      if (primaries[cell] != 1)
        return makeError(formatv("{0}: element {1} has {2} primary owners in "
                                 "replica {3} (expected exactly 1)",
                                 t.spec.name, element(at), primaries[cell],
                                 replica));
      return makeError(formatv("{0}: element {1} is loaded by {2} ranks of "
                               "replica {3} (expected {4})",
                               t.spec.name, element(at), holders[cell], replica,
                               expected));
    }
    return Error::success();
  };

  auto checkReplica = [&](bool experts, ArrayRef<int64_t> ranks,
                          StringRef replica) -> Error {
    ++report.replicas;
    for (int64_t r : ranks)
      forEachBox(m, layout, rankCoords(d, r), [&](const Box &b) {
        if (isExpertSplit(m.tensors[b.tensor].split) != experts)
          return;
        perTensor[b.tensor].push_back(b);
        ++report.boxes;
      });
    std::optional<std::string> failure;
    for (int32_t idx : experts ? expertTensors : attentionTensors) {
      if (!failure)
        if (Error e = verify(idx, replica))
          failure = toString(std::move(e));
      perTensor[idx].clear();
    }
    return failure ? makeError(*failure) : Error::success();
  };

  std::vector<int64_t> ranks;
  for (int64_t dpi = 0; dpi < d.dp; ++dpi) {
    ranks.clear();
    for (int64_t p = 0; p < d.pp; ++p)
      for (int64_t t = 0; t < d.tp; ++t)
        ranks.push_back(attentionRank(d, p, dpi, t));
    if (Error e = checkReplica(false, ranks, formatv("dp={0}", dpi).str()))
      return std::move(e);
  }
  if (!expertTensors.empty())
    for (int64_t e = 0; e < d.edp(); ++e) {
      ranks.clear();
      for (int64_t p = 0; p < d.pp; ++p)
        for (int64_t x = 0; x < d.ep; ++x)
          for (int64_t y = 0; y < d.etp; ++y)
            ranks.push_back(expertRank(d, p, e, x, y));
      if (Error err = checkReplica(true, ranks, formatv("edp={0}", e).str()))
        return std::move(err);
    }
  return report;
}
