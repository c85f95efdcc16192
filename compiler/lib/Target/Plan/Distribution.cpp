//===- Distribution.cpp - a layout as plan JSON -----------------*- C++ -*-===//
#include "moe/Target/Distribution.h"

#include <map>
#include <tuple>

using namespace llvm;
using json::Array;
using json::Object;

namespace {

Array ints(ArrayRef<int64_t> values) {
  Array a;
  for (int64_t v : values)
    a.push_back(v);
  return a;
}

Object memoryJson(const moe::sharding::MemoryEstimate &m) {
  return Object{{"weights", m.weights},       {"kv_cache", m.kvCache},
                {"activations", m.activations}, {"workspace", m.workspace},
                {"peak", m.peak}};
}

} // namespace

namespace {

/// Calls `rank(index, coords, memory, slices-or-null, sameAsRank)` for every
/// rank; slices are computed once per class of ranks.
template <typename Fn>
void forEachRank(const moe::sharding::ModelInfo &model,
                 const moe::sharding::LayoutEstimate &estimate, Fn rankFn) {
  namespace sh = moe::sharding;
  const sh::Degrees &d = estimate.layout.degrees;
  // Slices (and memory) depend only on (pp, tp, ep, etp): DP replicas hold
  // the same ones.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, int64_t> firstOfClass;
  std::map<int64_t, sh::MemoryEstimate> memoryOfClass;
  for (int64_t rank = 0; rank < d.world(); ++rank) {
    sh::RankCoords c = sh::rankCoords(d, rank);
    auto [it, fresh] = firstOfClass.try_emplace(std::make_tuple(c.pp, c.tp, c.ep, c.etp), rank);
    if (fresh) {
      memoryOfClass[rank] = sh::rankMemory(model, estimate, rank);
      std::vector<sh::WeightSlice> slices = sh::weightSlices(model, estimate.layout, rank);
      rankFn(rank, c, memoryOfClass[rank], &slices, rank);
    } else {
      rankFn(rank, c, memoryOfClass[it->second], nullptr, it->second);
    }
  }
}

void writeInts(json::OStream &J, ArrayRef<int64_t> values) {
  J.array([&] {
    for (int64_t v : values)
      J.value(v);
  });
}

} // namespace

void moe::writeDistribution(json::OStream &J, const sharding::ModelInfo &model,
                            const sharding::LayoutEstimate &estimate) {
  const sharding::ShardingLayout &layout = estimate.layout;
  const sharding::Degrees &d = layout.degrees;
  J.attribute("world_size", d.world());
  J.attributeObject("degrees", [&] {
    J.attribute("dp", d.dp);
    J.attribute("pp", d.pp);
    J.attribute("tp", d.tp);
    J.attribute("ep", d.ep);
    J.attribute("etp", d.etp);
    J.attribute("edp", d.edp());
  });
  J.attributeObject("vocab", [&] {
    J.attribute("size", model.config.vocabSize);
    J.attribute("padded", layout.paddedVocab);
    J.attribute("pad_to", layout.vocabPadTo);
  });
  J.attributeBegin("stage_begin");
  writeInts(J, layout.stageBegin);
  J.attributeEnd();
  J.attributeArray("ranks", [&] {
    forEachRank(model, estimate, [&](int64_t rank, const sharding::RankCoords &c,
                                     const sharding::MemoryEstimate &m,
                                     const std::vector<sharding::WeightSlice> *slices,
                                     int64_t same) {
      J.object([&] {
        J.attribute("rank", rank);
        // Every rank of a pipeline stage runs the stage's program.
        J.attribute("program", c.pp);
        J.attributeObject("coords", [&] {
          J.attribute("dp", c.dp);
          J.attribute("pp", c.pp);
          J.attribute("tp", c.tp);
          J.attribute("edp", c.edp);
          J.attribute("ep", c.ep);
          J.attribute("etp", c.etp);
        });
        J.attribute("memory", memoryJson(m));
        if (!slices) {
          J.attribute("weights_of_rank", same);
          return;
        }
        J.attributeArray("weights", [&] {
          for (const sharding::WeightSlice &w : *slices)
            J.object([&] {
              J.attribute("name", w.name);
              J.attributeBegin("global_shape");
              writeInts(J, w.globalShape);
              J.attributeEnd();
              J.attributeBegin("offset");
              writeInts(J, w.offset);
              J.attributeEnd();
              J.attributeBegin("shape");
              writeInts(J, w.shape);
              J.attributeEnd();
              // (FP8 in safetensors' spelling, with its scales' block.)
              J.attribute("dtype", w.dtype == sharding::DType::FP8
                                       ? StringRef("F8_E4M3")
                                       : sharding::dtypeName(w.dtype));
              J.attribute("bytes", w.bytes);
              if (!w.block.empty()) {
                J.attributeBegin("block");
                writeInts(J, w.block);
                J.attributeEnd();
              }
              // A copy of a slice another rank of the replica owns (norms,
              // routers, MLA's down-projections across TP).
              if (!w.primary)
                J.attribute("primary", false);
            });
        });
      });
    });
  });
}

json::Object moe::distributionJson(const sharding::ModelInfo &model,
                                   const sharding::LayoutEstimate &estimate) {
  std::string text;
  raw_string_ostream os(text);
  json::OStream J(os);
  J.object([&] { writeDistribution(J, model, estimate); });
  os.flush();
  return std::move(*json::parse(text)->getAsObject());
}
