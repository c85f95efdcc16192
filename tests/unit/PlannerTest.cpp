// The sharding planner: cluster descriptions, degree validation, vocabulary
// padding, the search on the reference models (plans fit, every weight
// element has exactly one owner per replica), the predicted ordering of
// Megatron-Core's published guidance, and the search time.
#include "moe/Analysis/Planner.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "gtest/gtest.h"

#include <chrono>
#include <map>
#include <set>

using namespace moe::sharding;
namespace hf = moe::hf;

#ifndef MOE_SHARED_CONFIGS_DIR
#define MOE_SHARED_CONFIGS_DIR ""
#endif
#ifndef MOE_SOURCE_DIR
#define MOE_SOURCE_DIR ""
#endif

namespace {

constexpr int64_t kGiB = int64_t(1) << 30;

std::string configPath(const std::string &model) {
  llvm::SmallString<256> p(MOE_SHARED_CONFIGS_DIR);
  llvm::sys::path::append(p, model, "config.json");
  return std::string(p);
}

/// The reference model, or nullopt when ../shared/configs is absent.
std::optional<ModelInfo> loadModel(const std::string &model,
                                   std::optional<DType> dtype = std::nullopt) {
  std::string path = configPath(model);
  if (!llvm::sys::fs::exists(path))
    return std::nullopt;
  llvm::Expected<hf::ModelConfig> c = hf::loadModelConfig(path);
  if (!c) {
    ADD_FAILURE() << llvm::toString(c.takeError());
    return std::nullopt;
  }
  llvm::Expected<ModelInfo> m = ModelInfo::build(*c, dtype);
  if (!m) {
    ADD_FAILURE() << llvm::toString(m.takeError());
    return std::nullopt;
  }
  return std::move(*m);
}

#define LOAD_OR_SKIP(var, name)                                                \
  std::optional<ModelInfo> var##Opt = loadModel(name);                         \
  if (!var##Opt)                                                               \
    GTEST_SKIP() << "reference configs not found at " MOE_SHARED_CONFIGS_DIR;  \
  const ModelInfo &var = *var##Opt

Cluster cluster(const std::string &gpu, int64_t world) {
  llvm::Expected<Cluster> c = makeCluster(gpu, world);
  EXPECT_TRUE(static_cast<bool>(c));
  if (!c) {
    llvm::consumeError(c.takeError());
    return Cluster();
  }
  return *c;
}

std::string planError(const ModelInfo &m, int64_t world, FixedDegrees f,
                      const std::string &gpu = "h100") {
  llvm::Expected<PlanResult> r =
      planSharding(m, cluster(gpu, world), Workload(), PlanOptions(), f);
  if (r)
    return "(planned " + r->chosen().layout.degrees.str() + ")";
  return llvm::toString(r.takeError());
}

LayoutEstimate estimate(const ModelInfo &m, const Cluster &c, Degrees d,
                        const Workload &w = Workload()) {
  llvm::Expected<LayoutEstimate> e = estimateLayout(m, c, w, PlanOptions(), d);
  EXPECT_TRUE(static_cast<bool>(e));
  if (!e) {
    ADD_FAILURE() << llvm::toString(e.takeError());
    return LayoutEstimate();
  }
  return *e;
}

//===----------------------------------------------------------------------===//
// Clusters
//===----------------------------------------------------------------------===//

TEST(Cluster, BuiltinsAndWorldSize) {
  Cluster h100 = cluster("h100", 2048);
  EXPECT_EQ(h100.devicesPerNode, 8);
  EXPECT_EQ(h100.nodes, 256);
  EXPECT_EQ(h100.worldSize, 2048);
  EXPECT_EQ(h100.memoryBytes, 80 * kGiB);
  EXPECT_DOUBLE_EQ(h100.peakFlops(DType::BF16), 989.4e12);
  EXPECT_DOUBLE_EQ(h100.peakFlops(DType::FP8), 1978.9e12);
  EXPECT_EQ(cluster("h100", 12).nodes, 2);
  EXPECT_EQ(cluster("h200", 8).memoryBytes, 141 * kGiB);
  EXPECT_EQ(cluster("b200", 8).memoryBytes, 180 * kGiB);
  EXPECT_DOUBLE_EQ(cluster("a100", 8).peakFlops(DType::FP8), 312e12);
  Cluster cpu = cluster("cpu", 4);
  EXPECT_EQ(cpu.devicesPerNode, 1);
  EXPECT_EQ(cpu.nodes, 4);
  EXPECT_EQ(cpu.memoryBytes, 24 * kGiB);
  EXPECT_EQ(cpu.nodeOf(3), 3);

  llvm::Expected<Cluster> bad = makeCluster("h300", 8);
  ASSERT_FALSE(static_cast<bool>(bad));
  EXPECT_EQ(llvm::toString(bad.takeError()),
            "--gpu h300: unknown machine; expected one of h100, h200, a100, "
            "b200, cpu");
  llvm::Expected<Cluster> zero = makeCluster("h100", 0);
  ASSERT_FALSE(static_cast<bool>(zero));
  EXPECT_EQ(llvm::toString(zero.takeError()),
            "--world-size 0: expected a positive integer");
  llvm::Expected<Cluster> tooMany = withWorldSize(cluster("h100", 8), 9);
  ASSERT_FALSE(static_cast<bool>(tooMany));
  EXPECT_EQ(llvm::toString(tooMany.takeError()),
            "--world-size 9: expected at most 8 (nodes x devices_per_node of "
            "h100)");
}

TEST(Cluster, FileRoundTripAndErrors) {
  Cluster h200 = cluster("h200", 32);
  std::string text;
  llvm::raw_string_ostream(text) << clusterToJSON(h200);
  llvm::Expected<Cluster> back = parseClusterJSON(text, "h200.json");
  ASSERT_TRUE(static_cast<bool>(back)) << llvm::toString(back.takeError());
  EXPECT_EQ(back->nodes, 4);
  EXPECT_EQ(back->worldSize, 32);
  EXPECT_EQ(back->memoryBytes, h200.memoryBytes);
  EXPECT_DOUBLE_EQ(back->memoryBandwidth, h200.memoryBandwidth);
  EXPECT_DOUBLE_EQ(back->interNode.bandwidth, h200.interNode.bandwidth);
  EXPECT_DOUBLE_EQ(back->peakFP8, h200.peakFP8);

  auto error = [](const std::string &json) {
    llvm::Expected<Cluster> c = parseClusterJSON(json, "my.json");
    return c ? std::string("(parsed)") : llvm::toString(c.takeError());
  };
  const std::string link =
      R"("intra_node": {"bandwidth_bytes_per_s": 4.5e11, "latency_s": 3e-6},
         "inter_node": {"bandwidth_bytes_per_s": 5e10, "latency_s": 1e-5})";
  const std::string device =
      R"("device": {"memory_bytes": 85899345920,
         "memory_bandwidth_bytes_per_s": 3.35e12,
         "peak_flops": {"bf16": 9.894e14, "fp32": 6.69e13}})";
  EXPECT_EQ(error(R"({"nodes": 2, "devices_per_node": 8, )" + device + ", " +
                  link + "}"),
            "(parsed)");
  EXPECT_EQ(error(R"({"nodes": 0, "devices_per_node": 8, )" + device + ", " +
                  link + "}"),
            "my.json: field 'nodes': expected a positive integer but got 0");
  EXPECT_EQ(error(R"({"nodes": 1, "devices_per_node": 8, "device": {}, )" +
                  link + "}"),
            "my.json: field 'device.memory_bytes': missing (required)");
  EXPECT_EQ(error(R"({"nodes": 1, "devices_per_node": 8, )" + device +
                  R"(, "intra_node": {"bandwidth_bytes_per_s": "fast",
                     "latency_s": 0}, "inter_node": {}})"),
            "my.json: field 'intra_node.bandwidth_bytes_per_s': expected a "
            "positive number but got a string");
  EXPECT_EQ(error(R"({"nodes": 1, "devcies_per_node": 8})"),
            "my.json: field 'devcies_per_node': unknown field; expected one of "
            "format, name, description, sources, nodes, devices_per_node, "
            "device, intra_node, inter_node");
  EXPECT_EQ(error("{\"nodes\": 1,,}"),
            "my.json:1:13: malformed JSON: Expected object key");
}

TEST(Cluster, ShippedMachineFilesMatchTheBuiltins) {
  llvm::SmallString<256> dir(MOE_SOURCE_DIR);
  llvm::sys::path::append(dir, "compiler", "machines");
  if (!llvm::sys::fs::is_directory(dir))
    GTEST_SKIP() << "no compiler/machines in " MOE_SOURCE_DIR;
  for (llvm::StringRef name : builtinClusterNames()) {
    llvm::SmallString<256> file(dir);
    llvm::sys::path::append(file, name + ".json");
    llvm::Expected<Cluster> c = loadClusterFile(file);
    ASSERT_TRUE(static_cast<bool>(c)) << llvm::toString(c.takeError());
    Cluster b = *builtinCluster(name);
    EXPECT_EQ(c->name, b.name);
    EXPECT_EQ(c->devicesPerNode, b.devicesPerNode) << name.str();
    EXPECT_EQ(c->memoryBytes, b.memoryBytes) << name.str();
    EXPECT_DOUBLE_EQ(c->peakBF16, b.peakBF16) << name.str();
    EXPECT_DOUBLE_EQ(c->peakFP8, b.peakFP8) << name.str();
    EXPECT_DOUBLE_EQ(c->peakFP32, b.peakFP32) << name.str();
    EXPECT_DOUBLE_EQ(c->memoryBandwidth, b.memoryBandwidth) << name.str();
    EXPECT_DOUBLE_EQ(c->intraNode.bandwidth, b.intraNode.bandwidth);
    EXPECT_DOUBLE_EQ(c->intraNode.latency, b.intraNode.latency);
    EXPECT_DOUBLE_EQ(c->interNode.bandwidth, b.interNode.bandwidth);
    EXPECT_DOUBLE_EQ(c->interNode.latency, b.interNode.latency);
  }
}

//===----------------------------------------------------------------------===//
// Degrees, coordinates, padding
//===----------------------------------------------------------------------===//

TEST(Planner, RankCoordinatesFoldOverTheSameRanks) {
  Degrees d{4, 2, 2, 4, 1}; // 16 ranks, edp = 2
  std::set<std::pair<int64_t, int64_t>> seen;
  for (int64_t r = 0; r < d.world(); ++r) {
    RankCoords c = rankCoords(d, r);
    EXPECT_EQ(attentionRank(d, c.pp, c.dp, c.tp), r);
    EXPECT_EQ(expertRank(d, c.pp, c.edp, c.ep, c.etp), r);
    EXPECT_TRUE(seen.insert({c.pp, c.edp * 100 + c.ep}).second);
  }
  // TP groups are consecutive ranks; pp is outermost.
  EXPECT_EQ(rankCoords(d, 1).tp, 1);
  EXPECT_EQ(rankCoords(d, 8).pp, 1);
  EXPECT_EQ(rankCoords(d, 8).dp, 0);
}

TEST(Planner, VocabularyPadding) {
  EXPECT_EQ(paddedVocabSize(128256, 8, 64), 128512);
  EXPECT_EQ(paddedVocabSize(128256, 8, 64) / 8, 16064);
  EXPECT_EQ(paddedVocabSize(128256, 8, 32), 128256);
  EXPECT_EQ(paddedVocabSize(128256, 8, 32) / 8, 16032);
  EXPECT_EQ(paddedVocabSize(32000, 1, 64), 32000);
  EXPECT_EQ(paddedVocabSize(151936, 3, 64), 152064);
}

TEST(Planner, LlamaVocabularySlicesAreClipped) {
  LOAD_OR_SKIP(m, "Llama-3.1-70B");
  for (int64_t padTo : {64, 32}) {
    PlanOptions o;
    o.vocabPadTo = padTo;
    FixedDegrees f;
    f.tp = 8;
    llvm::Expected<PlanResult> r =
        planSharding(m, cluster("h100", 8), Workload(), o, f);
    ASSERT_TRUE(static_cast<bool>(r)) << llvm::toString(r.takeError());
    const ShardingLayout &layout = r->chosen().layout;
    EXPECT_EQ(layout.paddedVocab, padTo == 64 ? 128512 : 128256);
    EXPECT_EQ(layout.vocabRowsPerRank(), padTo == 64 ? 16064 : 16032);
    for (int64_t rank : {0, 7}) {
      for (const WeightSlice &s : weightSlices(m, layout, rank)) {
        if (s.name != "lm_head.weight" && s.name != "model.embed_tokens.weight")
          continue;
        int64_t rows = rank == 0 ? layout.vocabRowsPerRank()
                                 : 128256 - 7 * layout.vocabRowsPerRank();
        EXPECT_EQ(s.offset[0], rank * layout.vocabRowsPerRank());
        EXPECT_EQ(s.shape[0], rows) << s.name << " rank " << rank;
        EXPECT_EQ(s.shape[1], 8192);
        EXPECT_EQ(s.bytes, rows * 8192 * 2);
      }
    }
    ASSERT_TRUE(static_cast<bool>(checkCoverage(m, layout)));
  }
}

TEST(Planner, ImpossibleFixedDegreesAreRejected) {
  LOAD_OR_SKIP(mixtral, "Mixtral-8x7B-v0.1");
  FixedDegrees f;
  f.tp = 3;
  EXPECT_EQ(planError(mixtral, 8, f),
            "--tp 3: expected a divisor of num_attention_heads (32) and "
            "num_key_value_heads (8)");
  f = {};
  f.ep = 3;
  EXPECT_EQ(planError(mixtral, 24, f),
            "--ep 3: expected a divisor of num_local_experts (8)");
  f = {};
  f.ep = 16;
  EXPECT_EQ(planError(mixtral, 16, f),
            "--ep 16: expected a divisor of num_local_experts (8)");
  f = {};
  f.etp = 3;
  EXPECT_EQ(planError(mixtral, 24, f),
            "--etp 3: expected a divisor of intermediate_size (14336)");
  f = {};
  f.tp = 4;
  EXPECT_EQ(planError(mixtral, 6, f),
            "--tp 4: does not divide the world size (6)");
  f = {};
  f.dp = 2;
  f.pp = 1;
  f.tp = 2;
  EXPECT_EQ(planError(mixtral, 8, f),
            "--dp 2 --pp 1 --tp 2: dp x pp x tp = 4 but the world size is 8");
  f = {};
  f.pp = 2;
  f.tp = 8;
  EXPECT_EQ(planError(mixtral, 8, f),
            "--pp 2 --tp 8: pp x tp = 16 does not divide the world size (8)");
  f = {};
  f.pp = 2;
  f.ep = 8;
  EXPECT_EQ(planError(mixtral, 8, f),
            "--pp 2 --ep 8: pp x ep = 16 does not divide the world size (8)");
  f = {};
  f.dp = 1;
  f.tp = 2;
  f.ep = 4;
  EXPECT_EQ(planError(mixtral, 8, f),
            "--ep 4: ep = 4 does not divide dp x tp = 2 (parallel folding: the "
            "experts of a stage use its attention ranks)");
  f = {};
  f.pp = 0;
  EXPECT_EQ(planError(mixtral, 8, f), "--pp 0: expected a positive integer");

  LOAD_OR_SKIP(llama, "Llama-3.1-70B");
  f = {};
  f.ep = 2;
  EXPECT_EQ(planError(llama, 8, f),
            "--ep 2: the model has no routed experts (llama); expected 1");
  f = {};
  f.tp = 16;
  EXPECT_EQ(planError(llama, 16, f),
            "--tp 16: expected a divisor of num_attention_heads (64) and "
            "num_key_value_heads (8)");

  LOAD_OR_SKIP(qwen, "Qwen1.5-MoE-A2.7B");
  f = {};
  f.etp = 3;
  EXPECT_EQ(planError(qwen, 24, f),
            "--etp 3: expected a divisor of moe_intermediate_size (1408)");
  f = {};
  f.ep = 8;
  EXPECT_EQ(planError(qwen, 8, f),
            "--ep 8: expected a divisor of num_experts (60)");

  LOAD_OR_SKIP(ds, "DeepSeek-V3");
  f = {};
  f.pp = 64;
  EXPECT_EQ(planError(ds, 64, f),
            "--pp 64: expected at most num_hidden_layers (61)");
  f = {};
  f.tp = 256;
  EXPECT_EQ(planError(ds, 256, f),
            "--tp 256: expected a divisor of num_attention_heads (128)");
  f = {};
  f.ep = 7;
  EXPECT_EQ(planError(ds, 56, f),
            "--ep 7: expected a divisor of n_routed_experts (256)");
  // Too few ranks: 0.67 TB of its published FP8 weights do not fit in 8
  // H100s; 1.34 TB of bf16 ones not in 16 either, the FP8 ones do.
  std::string eight = planError(ds, 8, {});
  EXPECT_EQ(eight.rfind("no layout of 8 x h100 fits: the smallest need is ", 0),
            0u)
      << eight;
  EXPECT_NE(eight.find("> 72.0 GiB usable (90% of 80.0 GiB); add ranks or use "
                       "a device with more memory"),
            std::string::npos)
      << eight;
  std::optional<ModelInfo> dsBf16 = loadModel("DeepSeek-V3", DType::BF16);
  ASSERT_TRUE(dsBf16.has_value());
  EXPECT_EQ(planError(*dsBf16, 16, {}).rfind("no layout of 16 x h100 fits", 0), 0u);
  EXPECT_EQ(planError(ds, 16, {}).rfind("(planned ", 0), 0u) << planError(ds, 16, {});
  // A fixed layout that cannot fit on its own.
  f = {};
  f.pp = 1;
  f.ep = 1;
  f.etp = 1;
  EXPECT_EQ(planError(ds, 64, f).rfind("no layout of 64 x h100 fits", 0), 0u);
}

TEST(Planner, GpuWorkspaceHoldsTheDequantisedFp8Weight) {
  // The CUDA device dequantises an FP8 weight for each GEMM into one
  // scratch (bf16 here): the largest weight, DeepSeek-V3's dense MLP
  // (18432 x 7168, split by TP), or as many 2048 x 7168 experts as 256 MiB
  // of f32 holds (4). BF16 weights need none.
  LOAD_OR_SKIP(ds, "DeepSeek-V3");
  std::optional<ModelInfo> dsBf16 = loadModel("DeepSeek-V3", DType::BF16);
  ASSERT_TRUE(dsBf16.has_value());
  EXPECT_EQ(ds.fp8TpSplit, 18432 * 7168);
  EXPECT_EQ(ds.fp8Expert, 2048 * 7168);
  for (auto [d, scratch] : {std::pair{Degrees{8, 4, 2, 16, 1}, int64_t(18432) * 7168 / 2 * 2},
                            std::pair{Degrees{16, 4, 1, 16, 1}, int64_t(18432) * 7168 * 2},
                            std::pair{Degrees{2, 4, 8, 16, 1}, int64_t(4) * 2048 * 7168 * 2}}) {
    Cluster c = cluster("h100", d.world());
    EXPECT_EQ(estimate(ds, c, d).memory.workspace - estimate(*dsBf16, c, d).memory.workspace,
              scratch)
        << d.str();
  }
}

TEST(Planner, WorkloadAndOptionsAreValidated) {
  LOAD_OR_SKIP(m, "Mixtral-8x7B-v0.1");
  Workload w;
  w.maxBatchTokens = 0;
  llvm::Expected<PlanResult> r =
      planSharding(m, cluster("h100", 8), w, PlanOptions());
  ASSERT_FALSE(static_cast<bool>(r));
  EXPECT_EQ(llvm::toString(r.takeError()),
            "--max-batch-tokens 0: expected a positive integer");
  PlanOptions o;
  o.vocabPadTo = 0;
  r = planSharding(m, cluster("h100", 8), Workload(), o);
  ASSERT_FALSE(static_cast<bool>(r));
  EXPECT_EQ(llvm::toString(r.takeError()),
            "--vocab-pad-to 0: expected a positive integer");
}

//===----------------------------------------------------------------------===//
// Plans of the reference models
//===----------------------------------------------------------------------===//

/// The chosen plan fits, its weights are what the slices add up to, and
/// every element has exactly one owner per replica.
void checkPlan(const ModelInfo &m, const std::string &gpu, int64_t world,
               bool coverage = true) {
  SCOPED_TRACE(m.config.modelType + " on " + std::to_string(world) + " x " +
               gpu);
  Cluster c = cluster(gpu, world);
  llvm::Expected<PlanResult> r = planSharding(m, c, Workload(), PlanOptions());
  ASSERT_TRUE(static_cast<bool>(r)) << llvm::toString(r.takeError());
  const LayoutEstimate &e = r->chosen();
  const Degrees &d = e.layout.degrees;
  EXPECT_EQ(d.world(), world);
  EXPECT_EQ(d.edp() * d.pp * d.ep * d.etp, world);
  EXPECT_TRUE(e.fits);
  EXPECT_LE(e.memory.peak, e.memoryBudget);
  EXPECT_LE(e.memoryBudget, c.memoryBytes);
  EXPECT_GT(e.time.total, 0);
  EXPECT_EQ(r->layoutsConsidered,
            int64_t(r->ranked.size() + r->rejected.size()));
  for (const Rejection &x : r->rejected)
    EXPECT_FALSE(x.reason.empty());
  for (size_t i = 1; i < r->ranked.size(); ++i)
    EXPECT_GE(r->ranked[i - 1].tokensPerSecond * (1 + 1e-5),
              r->ranked[i].tokensPerSecond);
  // Stages: contiguous, non-empty, all layers.
  ASSERT_EQ(int64_t(e.layout.stageBegin.size()), d.pp + 1);
  int64_t layers = 0;
  for (const StageEstimate &s : e.stages) {
    EXPECT_GT(s.numLayers, 0);
    layers += s.numLayers;
    EXPECT_LE(s.memory.peak, e.memoryBudget);
  }
  EXPECT_EQ(layers, m.numLayers());
  // The estimate's weights are the slices' bytes of each stage's largest
  // rank; no rank of the stage has more.
  for (int64_t s = 0; s < d.pp; ++s) {
    int64_t first = attentionRank(d, s, 0, 0);
    EXPECT_EQ(rankWeightBytes(m, e.layout, first), e.stages[s].memory.weights);
    int64_t last = attentionRank(d, s, d.dp - 1, d.tp - 1);
    EXPECT_LE(rankWeightBytes(m, e.layout, last), e.stages[s].memory.weights);
    EXPECT_EQ(rankMemory(m, e, first).peak, e.stages[s].memory.peak);
  }
  // One replica's primary slices add up to the checkpoint.
  {
    int64_t primary = 0;
    for (int64_t p = 0; p < d.pp; ++p)
      for (int64_t t = 0; t < d.tp; ++t)
        for (const WeightSlice &s :
             weightSlices(m, e.layout, attentionRank(d, p, 0, t)))
          if (s.primary && s.split != Split::Expert &&
              s.split != Split::FusedExperts)
            primary += s.bytes;
    for (int64_t p = 0; p < d.pp; ++p)
      for (int64_t x = 0; x < d.ep; ++x)
        for (int64_t y = 0; y < d.etp; ++y)
          for (const WeightSlice &s :
               weightSlices(m, e.layout, expertRank(d, p, 0, x, y)))
            if (s.split == Split::Expert || s.split == Split::FusedExperts)
              primary += s.bytes;
    EXPECT_EQ(primary, m.totalBytes);
  }
  if (coverage) {
    llvm::Expected<CoverageReport> cov = checkCoverage(m, e.layout);
    ASSERT_TRUE(static_cast<bool>(cov)) << llvm::toString(cov.takeError());
    EXPECT_EQ(cov->replicas, d.dp + (m.isMoE() ? d.edp() : 0));
  }
}

TEST(Planner, MixtralPlans) {
  LOAD_OR_SKIP(m, "Mixtral-8x7B-v0.1");
  for (int64_t world : {8, 16, 64})
    checkPlan(m, "h100", world);
  checkPlan(m, "a100", 8);
}

TEST(Planner, Qwen15MoEPlans) {
  LOAD_OR_SKIP(m, "Qwen1.5-MoE-A2.7B");
  for (int64_t world : {1, 8, 16, 64})
    checkPlan(m, "h100", world);
  checkPlan(m, "cpu", 2);
}

TEST(Planner, Qwen3MoEPlans) {
  LOAD_OR_SKIP(m, "Qwen3-30B-A3B");
  for (int64_t world : {8, 16, 64})
    checkPlan(m, "h100", world);
  checkPlan(m, "b200", 8);
}

TEST(Planner, DeepSeekV3Plans) {
  LOAD_OR_SKIP(m, "DeepSeek-V3");
  for (int64_t world : {64, 256})
    checkPlan(m, "h100", world);
  checkPlan(m, "h200", 16);
}

TEST(Planner, LlamaPlans) {
  LOAD_OR_SKIP(m, "Llama-3.1-70B");
  for (int64_t world : {8, 16, 64})
    checkPlan(m, "h100", world);
  checkPlan(m, "cpu", 8);
}

TEST(Planner, EveryReferenceConfigPlansAndCovers) {
  std::error_code ec;
  llvm::sys::fs::directory_iterator it(MOE_SHARED_CONFIGS_DIR, ec), end;
  if (ec)
    GTEST_SKIP() << "reference configs not found at " MOE_SHARED_CONFIGS_DIR;
  int planned = 0;
  for (; it != end && !ec; it.increment(ec)) {
    std::string name = llvm::sys::path::filename(it->path()).str();
    if (!llvm::sys::fs::exists(configPath(name)))
      continue;
    SCOPED_TRACE(name);
    llvm::Expected<hf::ModelConfig> c = hf::loadModelConfig(configPath(name));
    ASSERT_TRUE(static_cast<bool>(c)) << llvm::toString(c.takeError());
    llvm::Expected<ModelInfo> m = ModelInfo::build(*c);
    if (c->modelType == "dbrx" || c->modelType == "switch_transformers") {
      ASSERT_FALSE(static_cast<bool>(m));
      EXPECT_NE(llvm::toString(m.takeError())
                    .find("not supported by the sharding planner yet"),
                std::string::npos);
      continue;
    }
    ASSERT_TRUE(static_cast<bool>(m)) << llvm::toString(m.takeError());
    // Every tensor at its stored size: the dtype's, FP8 blocks' one byte
    // plus their f32 scales and the f32 correction bias (DeepSeek-V3's
    // published checkpoint).
    int64_t stored = 0;
    for (const hf::TensorSpec &s : hf::withBlockScales(hf::checkpointTensors(*c)))
      stored += s.numel() * (s.isFp8()                      ? 1
                             : s.blockScales || s.storedF32 ? 4
                                                            : dtypeBytes(m->weightDtype));
    EXPECT_EQ(m->totalBytes, stored);
    if (!c->fp8)
      EXPECT_EQ(m->totalBytes, hf::countParameters(*c).total * dtypeBytes(m->weightDtype));
    EXPECT_EQ(m->fp8Blocks, c->fp8.has_value());
    for (int64_t world : {8, 32}) {
      llvm::Expected<PlanResult> r =
          planSharding(*m, cluster("h100", world), Workload(), PlanOptions());
      if (!r) {
        // Only DeepSeek-V3 is too large for 8 H100s.
        std::string error = llvm::toString(r.takeError());
        EXPECT_EQ(name + " " + std::to_string(world), "DeepSeek-V3 8") << error;
        continue;
      }
      ++planned;
      // The choice, and the best pipelined, ETP and TP layouts (tied
      // embeddings, fused experts, MLA, q/k norms, biases...).
      std::vector<const LayoutEstimate *> layouts{&r->chosen()};
      for (auto pick : {+[](const Degrees &d) { return d.pp > 1; },
                        +[](const Degrees &d) { return d.etp > 1; },
                        +[](const Degrees &d) { return d.tp > 2; }})
        for (const LayoutEstimate &e : r->ranked)
          if (pick(e.layout.degrees)) {
            layouts.push_back(&e);
            break;
          }
      for (const LayoutEstimate *e : layouts) {
        llvm::Expected<CoverageReport> cov = checkCoverage(*m, e->layout);
        EXPECT_TRUE(static_cast<bool>(cov)) << e->layout.degrees.str() << ": "
                                            << llvm::toString(cov.takeError());
      }
    }
  }
  EXPECT_GE(planned, 20);
}

TEST(Planner, FixedPipelineLayoutsCover) {
  // Layouts the search would not pick: pp stages with the tied / untied
  // head, ETP, and EP spanning nodes.
  LOAD_OR_SKIP(m, "DeepSeek-V3");
  for (Degrees d : {Degrees{4, 8, 2, 8, 1}, Degrees{2, 4, 8, 4, 4},
                    Degrees{1, 16, 4, 4, 1}}) {
    LayoutEstimate e = estimate(m, cluster("h100", d.world()), d);
    EXPECT_EQ(int64_t(e.stages.size()), d.pp);
    llvm::Expected<CoverageReport> cov = checkCoverage(m, e.layout);
    EXPECT_TRUE(static_cast<bool>(cov))
        << d.str() << ": " << llvm::toString(cov.takeError());
    if (cov)
      EXPECT_EQ(cov->replicas, d.dp + d.edp());
  }
  LOAD_OR_SKIP(q, "Qwen3-30B-A3B");
  LayoutEstimate e = estimate(q, cluster("h100", 16), Degrees{2, 4, 2, 2, 2});
  EXPECT_TRUE(static_cast<bool>(checkCoverage(q, e.layout)));
}

TEST(Planner, DeepSeekDenseLayersShapeTheStages) {
  LOAD_OR_SKIP(m, "DeepSeek-V3");
  LayoutEstimate e = estimate(m, cluster("h100", 64), Degrees{8, 8, 1, 8, 1});
  ASSERT_EQ(e.stages.size(), 8u);
  EXPECT_EQ(e.stages[0].denseLayers, 3);
  // Balanced: no stage more than ~1 MoE layer slower than the mean.
  double sum = 0, most = 0;
  for (const StageEstimate &s : e.stages) {
    sum += s.microbatch.total;
    most = std::max(most, s.microbatch.total);
  }
  double mean = sum / 8;
  EXPECT_LT(most, mean * 1.25);
  // Dense layers are cheaper here, so stage 0 (3 dense + embedding) takes
  // at least as many layers as the last (LM head).
  EXPECT_GE(e.stages[0].numLayers, e.stages[7].numLayers);
}

TEST(Planner, MixtralEP8TP1BeatsEP4TP2OnEightH100) {
  // Megatron-Core MoE guidance: for Mixtral 8x7B on 8 H100s, EP8 TP1 is
  // faster than EP4 TP2.
  LOAD_OR_SKIP(m, "Mixtral-8x7B-v0.1");
  Cluster c = cluster("h100", 8);
  for (int64_t tokens : {512, 4096}) {
    Workload w;
    w.maxBatchTokens = tokens;
    LayoutEstimate ep8 = estimate(m, c, Degrees{8, 1, 1, 8, 1}, w);
    LayoutEstimate ep4 = estimate(m, c, Degrees{4, 1, 2, 4, 1}, w);
    EXPECT_TRUE(ep8.fits);
    EXPECT_TRUE(ep4.fits);
    EXPECT_GT(ep8.tokensPerSecond, ep4.tokensPerSecond) << tokens;
    EXPECT_EQ(ep4.time.allReduce > 0, true);
    EXPECT_EQ(ep8.time.allReduce, 0);
  }
}

TEST(Planner, TiesAreBrokenDeterministically) {
  LOAD_OR_SKIP(m, "Qwen3-30B-A3B");
  Cluster c = cluster("h100", 16);
  llvm::Expected<PlanResult> a = planSharding(m, c, Workload(), PlanOptions());
  llvm::Expected<PlanResult> b = planSharding(m, c, Workload(), PlanOptions());
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->ranked.size(), b->ranked.size());
  for (size_t i = 0; i < a->ranked.size(); ++i)
    EXPECT_EQ(a->ranked[i].layout.degrees, b->ranked[i].layout.degrees);
}

TEST(Planner, SearchIsFast) {
  LOAD_OR_SKIP(ds, "DeepSeek-V3");
  auto start = std::chrono::steady_clock::now();
  llvm::Expected<PlanResult> r =
      planSharding(ds, cluster("h100", 2048), Workload(), PlanOptions());
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_TRUE(static_cast<bool>(r)) << llvm::toString(r.takeError());
  EXPECT_LT(seconds, 1.0);
  EXPECT_GT(r->layoutsConsidered, 100);
  EXPECT_TRUE(r->chosen().fits);
  std::cout << explainPlan(ds, cluster("h100", 2048), Workload(), *r, 3);

  LOAD_OR_SKIP(mx, "Mixtral-8x7B-v0.1");
  start = std::chrono::steady_clock::now();
  llvm::Expected<PlanResult> r2 =
      planSharding(mx, cluster("h100", 8), Workload(), PlanOptions());
  seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_TRUE(static_cast<bool>(r2)) << llvm::toString(r2.takeError());
  EXPECT_LT(seconds, 1.0);
  std::cout << explainPlan(mx, cluster("h100", 8), Workload(), *r2, 3);
}

TEST(Planner, DeepSeekOn2048Covers) {
  LOAD_OR_SKIP(ds, "DeepSeek-V3");
  llvm::Expected<PlanResult> r =
      planSharding(ds, cluster("h100", 2048), Workload(), PlanOptions());
  ASSERT_TRUE(static_cast<bool>(r)) << llvm::toString(r.takeError());
  llvm::Expected<CoverageReport> cov = checkCoverage(ds, r->chosen().layout);
  ASSERT_TRUE(static_cast<bool>(cov)) << llvm::toString(cov.takeError());
}

TEST(Planner, JsonHasTheBreakdown) {
  LOAD_OR_SKIP(m, "Mixtral-8x7B-v0.1");
  llvm::Expected<PlanResult> r =
      planSharding(m, cluster("h100", 8), Workload(), PlanOptions());
  ASSERT_TRUE(static_cast<bool>(r));
  llvm::json::Value v = toJSON(*r);
  const llvm::json::Object *chosen = v.getAsObject()->getObject("chosen");
  ASSERT_TRUE(chosen);
  EXPECT_TRUE(chosen->getObject("memory")->getInteger("peak"));
  EXPECT_TRUE(chosen->getObject("time")->getNumber("all_to_all"));
  EXPECT_TRUE(chosen->getObject("degrees")->getInteger("edp"));
}

} // namespace

TEST(Planner, DynamicFp8KeepsInputGroupsWhole) {
  // Qwen3-30B-A3B as its FP8 release stores it (128 x 128 blocks): the
  // experts' down_proj has 768 input columns, o_proj 4096.
  std::string path = configPath("Qwen3-30B-A3B");
  if (!llvm::sys::fs::exists(path))
    GTEST_SKIP() << "reference configs not found at " MOE_SHARED_CONFIGS_DIR;
  llvm::Expected<hf::ModelConfig> c = hf::loadModelConfig(path);
  ASSERT_TRUE(static_cast<bool>(c)) << llvm::toString(c.takeError());
  c->fp8 = hf::ModelConfig::Fp8Quantization();
  llvm::Expected<ModelInfo> m = ModelInfo::build(*c);
  ASSERT_TRUE(static_cast<bool>(m)) << llvm::toString(m.takeError());
  // fp8GroupCut says what the slices say: some rank's FP8 slice starts or
  // ends its input columns inside a group.
  for (Degrees d : {Degrees{2, 1, 4, 1, 4}, Degrees{4, 1, 2, 1, 2}, Degrees{2, 1, 4, 4, 1},
                    Degrees{1, 2, 4, 1, 4}, Degrees{2, 1, 4, 1, 8}}) {
    LayoutEstimate e = estimate(*m, cluster("h100", d.world()), d);
    bool cut = false;
    for (int64_t rank = 0; rank < d.world() && !cut; ++rank)
      for (const WeightSlice &s : weightSlices(*m, e.layout, rank)) {
        if (s.block.size() != 2 || s.shape.size() != 2)
          continue;
        const int64_t begin = s.offset[1], end = begin + s.shape[1];
        if (begin % s.block[1] || (end % s.block[1] && end != s.globalShape[1]))
          cut = true;
      }
    std::optional<std::string> said = fp8GroupCut(*m, d);
    EXPECT_EQ(said.has_value(), cut) << d.str();
    if (d.etp == 4)
      EXPECT_EQ(said.value_or(""), "model.layers.0.mlp.experts.0.down_proj.weight: etp=4 "
                                   "splits its 768 input columns into 192-column slices, "
                                   "cutting its 128-column groups");
  }
  // The planner ranks only whole-group layouts when asked.
  FixedDegrees f;
  f.tp = 4;
  f.ep = 1;
  PlanOptions whole;
  whole.wholeFp8Groups = true;
  for (auto [options, etp] : {std::pair{PlanOptions(), 4}, std::pair{whole, 2}}) {
    llvm::Expected<PlanResult> r = planSharding(*m, cluster("h100", 8), Workload(), options, f);
    ASSERT_TRUE(static_cast<bool>(r)) << llvm::toString(r.takeError());
    EXPECT_EQ(r->chosen().layout.degrees.etp, etp);
    for (const LayoutEstimate &e : r->ranked)
      EXPECT_EQ(fp8GroupCut(*m, e.layout.degrees).has_value() && options.wholeFp8Groups, false);
    size_t cutting = 0;
    for (const Rejection &x : r->rejected) {
      cutting += x.rule == Rejection::Rule::Fp8Group;
      EXPECT_TRUE(x.rule != Rejection::Rule::Fp8Group || fp8GroupCut(*m, x.degrees))
          << x.degrees.str();
    }
    EXPECT_EQ(cutting > 0, options.wholeFp8Groups); // ETP 4 and 8
  }
  f.etp = 8;
  llvm::Expected<PlanResult> r = planSharding(*m, cluster("h100", 8), Workload(), whole, f);
  ASSERT_FALSE(static_cast<bool>(r));
  EXPECT_EQ(llvm::toString(r.takeError()),
            "no layout of 8 x h100 both fits and keeps every FP8 input group whole, as "
            "dynamic FP8 activations (quantization_config.activation_scheme) need: dp=2 pp=1 "
            "tp=4 ep=1 etp=8: model.layers.0.mlp.experts.0.down_proj.weight: etp=8 splits its "
            "768 input columns into 96-column slices, cutting its 128-column groups; choose "
            "other degrees (a smaller --tp or --etp), or compile with --fp8-activations none");
}
