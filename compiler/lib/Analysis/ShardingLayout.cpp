//===- ShardingLayout.cpp - degrees, model shape, validation ----*- C++ -*-===//
//
// The sharding types of CostModel.h that are not the cost model: degrees
// and rank coordinates, the model's shape as the planner sees it
// (ModelInfo), the checks of degrees, workloads and options, and their JSON.
//
//===----------------------------------------------------------------------===//
#include "moe/Analysis/CostModel.h"
#include "moe/Analysis/Planner.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cmath>
#include <limits>

using namespace llvm;
using namespace moe::sharding;
namespace hf = moe::hf;
//===----------------------------------------------------------------------===//
// Degrees and coordinates
//===----------------------------------------------------------------------===//

std::string Degrees::str() const {
  return formatv("dp={0} pp={1} tp={2} ep={3} etp={4}", dp, pp, tp, ep, etp)
      .str();
}

RankCoords moe::sharding::rankCoords(const Degrees &d, int64_t rank) {
  RankCoords c;
  int64_t perStage = d.world() / d.pp;
  c.pp = rank / perStage;
  int64_t inner = rank % perStage;
  c.dp = inner / d.tp;
  c.tp = inner % d.tp;
  c.etp = inner % d.etp;
  c.ep = (inner / d.etp) % d.ep;
  c.edp = inner / (d.etp * d.ep);
  return c;
}

int64_t moe::sharding::attentionRank(const Degrees &d, int64_t pp, int64_t dp,
                                     int64_t tp) {
  return (pp * d.dp + dp) * d.tp + tp;
}

int64_t moe::sharding::expertRank(const Degrees &d, int64_t pp, int64_t edp,
                                  int64_t ep, int64_t etp) {
  return ((pp * d.edp() + edp) * d.ep + ep) * d.etp + etp;
}

int64_t moe::sharding::paddedVocabSize(int64_t vocab, int64_t tp,
                                       int64_t padTo) {
  int64_t multiple = padTo * tp;
  return (vocab + multiple - 1) / multiple * multiple;
}

int64_t ShardingLayout::stageOfLayer(int64_t layer) const {
  auto it = std::upper_bound(stageBegin.begin(), stageBegin.end(), layer);
  return int64_t(it - stageBegin.begin()) - 1;
}

StringRef moe::sharding::splitName(Split s) {
  switch (s) {
  case Split::Replicated:
    return "replicated";
  case Split::Column:
    return "column";
  case Split::Row:
    return "row";
  case Split::Vocab:
    return "vocab";
  case Split::Expert:
    return "expert";
  case Split::FusedExperts:
    return "fused_experts";
  }
  return "replicated";
}

//===----------------------------------------------------------------------===//
// ModelInfo
//===----------------------------------------------------------------------===//

namespace {

Error makeError(const Twine &message) {
  return createStringError(inconvertibleErrorCode(), "%s",
                           message.str().c_str());
}

} // namespace

std::string ModelInfo::expertsField() const {
  StringRef t = config.modelType;
  if (t == "deepseek_v2" || t == "deepseek_v3")
    return "n_routed_experts";
  if (t == "qwen2_moe" || t == "qwen3_moe" || t == "olmoe")
    return "num_experts";
  return "num_local_experts";
}

std::string ModelInfo::expertWidthField() const {
  StringRef t = config.modelType;
  if (t == "deepseek_v2" || t == "deepseek_v3" || t == "qwen2_moe" ||
      t == "qwen3_moe")
    return "moe_intermediate_size";
  return "intermediate_size";
}

std::string ModelInfo::sharedWidthField() const {
  if (config.modelType == "qwen2_moe")
    return "shared_expert_intermediate_size";
  return "n_shared_experts x moe_intermediate_size";
}

Expected<ModelInfo> ModelInfo::build(const hf::ModelConfig &config,
                                     std::optional<DType> weightDtype) {
  return build(config, hf::withBlockScales(hf::checkpointTensors(config)), weightDtype);
}

Expected<ModelInfo> ModelInfo::build(const hf::ModelConfig &config,
                                     std::vector<hf::TensorSpec> specs,
                                     std::optional<DType> weightDtype) {
  StringRef type = config.modelType;
  if (type == "dbrx" || type == "switch_transformers")
    return makeError(config.path +
                     ": not supported by the sharding planner "
                     "yet: " +
                     (type == "dbrx" ? "fused Wqkv and expert tensors (dbrx)"
                                     : "encoder-decoder models "
                                       "(switch_transformers)"));
  ModelInfo m;
  m.config = config;
  if (weightDtype) {
    m.weightDtype = *weightDtype;
  } else {
    std::optional<DType> t = parseDType(config.dtype);
    if (!t || *t == DType::FP8)
      return makeError(config.path +
                       ": field 'torch_dtype': expected float32, "
                       "bfloat16 or float16 but got '" +
                       config.dtype + "'");
    m.weightDtype = *t;
  }
  m.activationDtype = m.weightDtype == DType::FP8 ? DType::BF16 : m.weightDtype;
  const int64_t wb = dtypeBytes(m.weightDtype);
  const int64_t L = config.numLayers;
  m.layerTensors.assign(L, {});
  m.expertTensors.assign(L, {});
  m.fusedExperts.assign(L, {});
  m.layerBytes.assign(L, {});
  if (config.isMoE())
    for (auto &perLayer : m.expertTensors)
      perLayer.assign(config.numExperts, {});

  m.tensors.reserve(specs.size());
  for (hf::TensorSpec &spec : specs) {
    // An explicit dtype counts every weight in it (an FP8 checkpoint planned
    // as if dequantised, or everything as FP8): no blocks, no scales.
    if (weightDtype) {
      if (spec.blockScales)
        continue;
      spec.fp8BlockRows = spec.fp8BlockCols = 0;
    }
    m.fp8Blocks |= spec.isFp8();
    PlannedTensor t;
    // FP8 weights and their f32 block scales keep their own sizes.
    t.dtype = spec.isFp8()                           ? DType::FP8
              : spec.blockScales || (spec.storedF32 && !weightDtype) ? DType::F32
                                                                    : m.weightDtype;
    t.elementBytes = dtypeBytes(t.dtype);
    int64_t bytes = spec.numel() * t.elementBytes;
    m.totalBytes += bytes;
    int32_t index = int32_t(m.tensors.size());
    t.spec = std::move(spec);
    const hf::TensorSpec &s = t.spec;
    if (s.role == hf::TensorRole::Embedding) {
      t.split = Split::Vocab;
      t.place = Place::FirstStage;
      t.alsoOnLastStage = config.tieWordEmbeddings;
      m.embeddingBytesPerRow = s.shape.size() > 1 ? s.shape[1] * wb : wb;
      m.firstStageTensors.push_back(index);
    } else if (s.role == hf::TensorRole::LMHead) {
      t.split = Split::Vocab;
      t.place = Place::LastStage;
      m.headBytesPerRow += s.shape.size() > 1 ? s.shape[1] * wb : wb;
      m.lastStageTensors.push_back(index);
    } else if (s.layer < 0) {
      t.split = Split::Replicated; // the final norm
      t.place = Place::LastStage;
      m.finalNormBytes += bytes;
      m.lastStageTensors.push_back(index);
    } else if (s.layer >= L) {
      return makeError(config.path + ": tensor '" + s.name +
                       "' is outside the decoder layers");
    } else if (s.role == hf::TensorRole::RoutedExperts) {
      int64_t e = s.expert;
      if (e >= 0) {
        if (e >= config.numExperts || s.shape.size() != 2)
          return makeError(config.path + ": unexpected expert tensor '" +
                           s.name + "'");
        t.split = Split::Expert;
        t.expert = e;
        // gate/up ([I, h]) split their output rows by ETP, down ([h, I])
        // its input columns.
        t.etpDim = s.etpDim;
        t.wholeInEtpGroup = s.blockScales;
        m.expertTensors[s.layer][e].push_back(index);
      } else {
        if (s.shape.empty() || s.shape[0] != config.numExperts)
          return makeError(config.path + ": unexpected fused expert tensor '" +
                           s.name + "'");
        t.split = Split::FusedExperts;
        m.fusedExpertTensors = true;
        m.fusedExperts[s.layer].push_back(index);
      }
      m.layerBytes[s.layer].experts += bytes;
      if (t.dtype == DType::FP8)
        m.fp8Expert = std::max(m.fp8Expert, s.numel());
    } else {
      // Set by the frontend (hf::TensorSpec::tpSplit), by module.
      t.split = s.tpSplit == hf::TensorSplit::Column ? Split::Column
                : s.tpSplit == hf::TensorSplit::Row  ? Split::Row
                                                     : Split::Replicated;
      if (t.split == Split::Replicated)
        m.layerBytes[s.layer].replicated += bytes;
      else
        m.layerBytes[s.layer].tpSplit += bytes;
      if (t.dtype == DType::FP8) {
        int64_t &largest = t.split == Split::Replicated ? m.fp8Replicated : m.fp8TpSplit;
        largest = std::max(largest, s.numel());
      }
      m.layerTensors[s.layer].push_back(index);
    }
    m.tensors.push_back(std::move(t));
  }
  return m;
}

//===----------------------------------------------------------------------===//
// Validation
//===----------------------------------------------------------------------===//

namespace {

std::string tpProblem(const ModelInfo &m, int64_t tp) {
  const hf::ModelConfig &c = m.config;
  if (c.isMLA()) {
    if (c.numHeads % tp)
      return formatv("expected a divisor of num_attention_heads ({0})",
                     c.numHeads);
  } else if (c.numHeads % tp || c.numKVHeads % tp) {
    return formatv("expected a divisor of num_attention_heads ({0}) and "
                   "num_key_value_heads ({1})",
                   c.numHeads, c.numKVHeads);
  }
  bool hasDense = c.numMoELayers() < c.numLayers;
  if (hasDense && c.intermediateSize % tp)
    return formatv("expected a divisor of intermediate_size ({0}), the width "
                   "of the dense MLP layers",
                   c.intermediateSize);
  if (c.isMoE() && c.sharedExpertIntermediateSize > 0 &&
      c.sharedExpertIntermediateSize % tp)
    return formatv("expected a divisor of {0} ({1}), the shared experts' width",
                   m.sharedWidthField(), c.sharedExpertIntermediateSize);
  // Anything else split by TP (a safety net; the fields above cover the
  // supported families).
  for (const PlannedTensor &t : m.tensors) {
    int dim = t.split == Split::Column ? 0 : t.split == Split::Row ? 1 : -1;
    if (dim >= 0 && t.spec.shape[dim] % tp)
      return formatv("expected a divisor of dimension {0} ({1}) of {2}", dim,
                     t.spec.shape[dim], t.spec.name);
  }
  return "";
}

std::string ppProblem(const ModelInfo &m, int64_t pp) {
  if (pp > m.config.numLayers)
    return formatv("expected at most num_hidden_layers ({0})",
                   m.config.numLayers);
  return "";
}

std::string epProblem(const ModelInfo &m, int64_t ep) {
  if (!m.isMoE())
    return ep == 1
               ? ""
               : formatv("the model has no routed experts ({0}); expected 1",
                         m.config.modelType)
                     .str();
  if (m.config.numExperts % ep)
    return formatv("expected a divisor of {0} ({1})", m.expertsField(),
                   m.config.numExperts);
  return "";
}

std::string etpProblem(const ModelInfo &m, int64_t etp) {
  if (!m.isMoE())
    return etp == 1
               ? ""
               : formatv("the model has no routed experts ({0}); expected 1",
                         m.config.modelType)
                     .str();
  if (m.config.moeIntermediateSize % etp)
    return formatv("expected a divisor of {0} ({1})", m.expertWidthField(),
                   m.config.moeIntermediateSize);
  if (etp > 1 && m.fusedExpertTensors)
    return formatv("expected 1: expert tensor parallelism of fused expert "
                   "tensors ({0}) is not supported yet",
                   m.config.modelType);
  return "";
}

} // namespace

namespace moe::sharding {
// Shared with Planner.cpp.
std::string degreeProblem(const ModelInfo &m, StringRef axis, int64_t value) {
  if (value <= 0)
    return "expected a positive integer";
  if (axis == "tp")
    return tpProblem(m, value);
  if (axis == "pp")
    return ppProblem(m, value);
  if (axis == "ep")
    return epProblem(m, value);
  if (axis == "etp")
    return etpProblem(m, value);
  return "";
}
} // namespace moe::sharding

Error moe::sharding::validateDegrees(const ModelInfo &m, int64_t worldSize,
                                     const Degrees &d) {
  std::pair<StringRef, int64_t> axes[] = {
      {"dp", d.dp}, {"pp", d.pp}, {"tp", d.tp}, {"ep", d.ep}, {"etp", d.etp}};
  for (auto [axis, value] : axes) {
    std::string problem = degreeProblem(m, axis, value);
    if (!problem.empty())
      return makeError(formatv("--{0} {1}: {2}", axis, value, problem));
  }
  if (d.world() != worldSize)
    return makeError(formatv("--dp {0} --pp {1} --tp {2}: dp x pp x tp = {3} "
                             "but the world size is {4}",
                             d.dp, d.pp, d.tp, d.world(), worldSize));
  if ((d.dp * d.tp) % (d.ep * d.etp))
    return makeError(formatv(
        "--ep {0} --etp {1}: ep x etp = {2} does not divide dp x tp = {3} "
        "(parallel folding: the experts of a stage use its attention ranks)",
        d.ep, d.etp, d.ep * d.etp, d.dp * d.tp));
  return Error::success();
}

Error moe::sharding::validateWorkload(const Workload &w) {
  std::pair<StringRef, int64_t> fields[] = {
      {"--max-batch-tokens", w.maxBatchTokens},
      {"--max-seq-len", w.maxSeqLen},
      {"--max-sequences", w.maxSequences}};
  for (auto [name, value] : fields)
    if (value <= 0)
      return makeError(
          formatv("{0} {1}: expected a positive integer", name, value));
  return Error::success();
}

Error moe::sharding::validateOptions(const PlanOptions &o) {
  if (o.vocabPadTo <= 0)
    return makeError(formatv("--vocab-pad-to {0}: expected a positive integer",
                             o.vocabPadTo));
  if (!(o.memoryUtilization > 0 && o.memoryUtilization <= 1))
    return makeError(formatv("memory utilization {0}: expected a fraction in "
                             "(0, 1]",
                             o.memoryUtilization));
  if (o.microbatches < 0)
    return makeError(formatv("--microbatches {0}: expected a positive integer",
                             o.microbatches));
  if (!(o.capacityFactor >= 0) || !std::isfinite(o.capacityFactor))
    return makeError(formatv("--capacity-factor {0}: expected a non-negative "
                             "number (0: dropless)",
                             o.capacityFactor));
  if (o.gemmWorkspaceBytes < 0 || o.commBytesPerPeer < 0)
    return makeError("workspace sizes: expected non-negative byte counts");
  return Error::success();
}

//===----------------------------------------------------------------------===//
// JSON
//===----------------------------------------------------------------------===//

json::Value moe::sharding::toJSON(const Degrees &d) {
  return json::Object{{"dp", d.dp}, {"pp", d.pp},   {"tp", d.tp},
                      {"ep", d.ep}, {"etp", d.etp}, {"edp", d.edp()}};
}

json::Value moe::sharding::toJSON(const MemoryEstimate &m) {
  return json::Object{{"weights", m.weights},
                      {"kv_cache", m.kvCache},
                      {"activations", m.activations},
                      {"workspace", m.workspace},
                      {"peak", m.peak}};
}

json::Value moe::sharding::toJSON(const TimeEstimate &t) {
  return json::Object{{"gemm", t.gemm},
                      {"attention", t.attention},
                      {"memory_bound", t.memoryBound},
                      {"all_to_all", t.allToAll},
                      {"all_reduce", t.allReduce},
                      {"p2p", t.p2p},
                      {"bubble", t.bubble},
                      {"total", t.total}};
}

json::Value moe::sharding::toJSON(const LayoutEstimate &e) {
  json::Array stages;
  for (const StageEstimate &s : e.stages)
    stages.push_back(json::Object{
        {"layers", json::Array{s.firstLayer, s.firstLayer + s.numLayers}},
        {"dense_layers", s.denseLayers},
        {"moe_layers", s.moeLayers},
        {"embedding", s.embedding},
        {"head", s.head},
        {"memory", toJSON(s.memory)},
        {"microbatch_time", toJSON(s.microbatch)}});
  auto where = [](bool spans) { return spans ? "inter_node" : "intra_node"; };
  json::Object o{
      {"degrees", toJSON(e.layout.degrees)},
      {"microbatches", e.microbatches},
      {"microbatch_tokens", e.microbatchTokens},
      {"vocab_pad_to", e.layout.vocabPadTo},
      {"padded_vocab", e.layout.paddedVocab},
      {"vocab_rows_per_rank", e.layout.vocabRowsPerRank()},
      {"stages", std::move(stages)},
      {"memory", toJSON(e.memory)},
      {"memory_budget", e.memoryBudget},
      {"time", toJSON(e.time)},
      {"tokens_per_second", e.tokensPerSecond},
      {"links", json::Object{{"tp", where(e.tpSpansNodes)},
                             {"ep", where(e.epSpansNodes)},
                             {"etp", where(e.etpSpansNodes)},
                             {"pp", where(e.ppSpansNodes)},
                             {"ep_off_node_fraction", e.epOffNodeFraction}}},
      {"fits", e.fits}};
  if (!e.fits)
    o["reason"] = e.reason;
  return o;
}
