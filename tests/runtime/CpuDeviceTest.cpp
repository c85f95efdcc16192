// The CPU device on hand-written plans (format 2) of one small MoE model:
//  - one rank, routed experts lowered to dispatch / expert_ffn / combine and
//    an LM head padded past the vocabulary (a copied box with zero rows,
//    dropped by a split);
//  - two ranks (tp 2, ep 2) as two threads over an in-process Comm:
//    vocab-sharded embedding + all_reduce, row parts, all_to_all both ways,
//    the sharded head + all_gather;
// each rank's logits equal those of the kernels called directly on the
// whole model; an empty batch runs; the memory figures add up.
#include "moert/Checkpoint.h"
#include "moert/PlanSeal.h"
#include "moert/Comm.h"
#include "moert/RankExecutor.h"
#include "moert/Error.h"
#include "moert/Parallel.h"
#include "moert/Plan.h"
#include "moert/SafetensorsWriter.h"
#include "moert/cpu/Kernels.h"

#include "../../runtime/src/DeviceMemory.h"
#include "../../runtime/src/RankProgram.h"
#include "PlanJson.h"

#include "gtest/gtest.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

using namespace moert;
namespace fs = std::filesystem;
using nlohmann::json;
using namespace moert::test;

namespace {

/// memcpy that accepts empty copies from null pointers (an empty batch's
/// buffers), which memcpy itself does not.
void copyBytes(void *dst, const void *src, size_t bytes) {
  if (bytes)
    std::memcpy(dst, src, bytes);
}

/// A world of one: every group is this rank; collectives copy.
class SoloComm final : public Comm {
public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void prepare(const Plan &) override {}
  void setTimeout(double) override {}
  void allReduceSum(float *, int64_t, const std::vector<int> &, const std::string &) override {}
  void allGather(const void *in, int64_t bytes, void *out, const std::vector<int> &,
                 const std::string &) override {
    std::memmove(out, in, static_cast<size_t>(bytes));
  }
  void exchange(const std::vector<Piece> &sends, const std::vector<Piece> &recvs,
                const std::vector<int> &, const std::string &) override {
    for (size_t i = 0; i < sends.size() && i < recvs.size(); ++i)
      std::memmove(recvs[i].data, sends[i].data, static_cast<size_t>(sends[i].bytes));
  }
  void send(const void *, int64_t, int, const std::string &) override {}
  void recv(void *, int64_t, int, const std::string &) override {}
  void broadcast(void *, int64_t, int, const std::vector<int> &, const std::string &) override {}
  int64_t allReduceMax(int64_t value, const std::string &) override { return value; }
  void abort(const std::string &message, int) override { throw RuntimeError(message); }
};

/// Ranks as threads of one process: each collective is a meeting of its
/// group (everyone posts its data, reads the others', and leaves together);
/// send / recv go through mailboxes.
class World {
public:
  struct Meeting {
    std::mutex mutex;
    std::condition_variable cv;
    size_t arrived = 0;
    int64_t generation = 0;
    std::vector<const void *> posted;
  };
  Meeting &meeting(const std::vector<int> &group) {
    std::lock_guard<std::mutex> lock(mutex);
    std::unique_ptr<Meeting> &m = meetings[group];
    if (!m) {
      m = std::make_unique<Meeting>();
      m->posted.resize(group.size());
    }
    return *m;
  }
  static void barrier(Meeting &m) {
    std::unique_lock<std::mutex> lock(m.mutex);
    int64_t generation = m.generation;
    if (++m.arrived == m.posted.size()) {
      m.arrived = 0;
      ++m.generation;
      m.cv.notify_all();
    } else {
      m.cv.wait(lock, [&] { return m.generation != generation; });
    }
  }
  void post(int from, int to, const void *data, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    const char *p = static_cast<const char *>(data);
    mail[{from, to}].emplace_back(p, p + bytes);
    mailArrived.notify_all();
  }
  void take(int from, int to, void *data, int64_t bytes) {
    std::unique_lock<std::mutex> lock(mutex);
    auto &box = mail[{from, to}];
    mailArrived.wait(lock, [&] { return !box.empty(); });
    if (static_cast<int64_t>(box.front().size()) != bytes)
      throw RuntimeError("recv of another size than the send");
    copyBytes(data, box.front().data(), static_cast<size_t>(bytes));
    box.pop_front();
  }

private:
  std::mutex mutex;
  std::condition_variable mailArrived;
  std::map<std::vector<int>, std::unique_ptr<Meeting>> meetings;
  std::map<std::pair<int, int>, std::deque<std::vector<char>>> mail;
};

class ThreadComm final : public Comm {
public:
  ThreadComm(World &world, int me, int worldSize) : world(world), me(me), worldSize(worldSize) {}
  int rank() const override { return me; }
  int size() const override { return worldSize; }
  void prepare(const Plan &) override {}
  void setTimeout(double) override {}

  void allReduceSum(float *data, int64_t n, const std::vector<int> &group,
                    const std::string &) override {
    std::vector<float> sum(static_cast<size_t>(n), 0.0f);
    meet(group, data, [&](const std::vector<const void *> &all) {
      for (const void *p : all)
        for (int64_t i = 0; i < n; ++i)
          sum[i] += static_cast<const float *>(p)[i];
    });
    std::copy(sum.begin(), sum.end(), data);
  }
  void allGather(const void *in, int64_t bytes, void *out, const std::vector<int> &group,
                 const std::string &) override {
    std::vector<char> all(static_cast<size_t>(bytes) * group.size());
    meet(group, in, [&](const std::vector<const void *> &posted) {
      for (size_t q = 0; q < posted.size(); ++q)
        copyBytes(all.data() + q * bytes, posted[q], static_cast<size_t>(bytes));
    });
    copyBytes(out, all.data(), all.size());
  }
  void exchange(const std::vector<Piece> &sends, const std::vector<Piece> &recvs,
                const std::vector<int> &group, const std::string &what) override {
    const int q = static_cast<int>(std::find(group.begin(), group.end(), me) - group.begin());
    meet(group, &sends, [&](const std::vector<const void *> &posted) {
      for (size_t m = 0; m < posted.size(); ++m) {
        // Member m's pieces for q, in order, into q's receives from m.
        std::vector<const Piece *> from, into;
        for (const Piece &p : *static_cast<const std::vector<Piece> *>(posted[m]))
          if (p.member == q)
            from.push_back(&p);
        for (const Piece &p : recvs)
          if (p.member == static_cast<int>(m))
            into.push_back(&p);
        if (from.size() != into.size())
          throw RuntimeError(what + ": received another number of pieces than expected");
        for (size_t i = 0; i < from.size(); ++i) {
          if (from[i]->bytes != into[i]->bytes)
            throw RuntimeError(what + ": received another size than expected");
          copyBytes(into[i]->data, from[i]->data, static_cast<size_t>(into[i]->bytes));
        }
      }
    });
  }
  void send(const void *data, int64_t bytes, int peer, const std::string &) override {
    world.post(me, peer, data, bytes);
  }
  void recv(void *data, int64_t bytes, int peer, const std::string &) override {
    world.take(peer, me, data, bytes);
  }
  void broadcast(void *data, int64_t bytes, int root, const std::vector<int> &group,
                 const std::string &) override {
    std::vector<char> copy(static_cast<size_t>(bytes));
    meet(group, data, [&](const std::vector<const void *> &posted) {
      copyBytes(copy.data(), posted[root], copy.size());
    });
    copyBytes(data, copy.data(), copy.size());
  }
  int64_t allReduceMax(int64_t value, const std::string &) override { return value; }
  void abort(const std::string &message, int) override { throw RuntimeError(message); }

private:
  /// Everyone posts `mine`; `read` sees every member's post (in group
  /// order) while no member has left, so posted buffers stay valid.
  template <typename Read>
  void meet(const std::vector<int> &group, const void *mine, Read read) {
    World::Meeting &m = world.meeting(group);
    size_t q = std::find(group.begin(), group.end(), me) - group.begin();
    {
      std::lock_guard<std::mutex> lock(m.mutex);
      m.posted[q] = mine;
    }
    World::barrier(m);
    read(m.posted);
    World::barrier(m);
  }

  World &world;
  int me, worldSize;
};

/// Runs a test body with `threads` pool threads, restoring the old count.
struct ThreadCount {
  int old;
  explicit ThreadCount(int threads) : old(numThreads()) { setNumThreads(threads); }
  ~ThreadCount() { setNumThreads(old); }
};

// The model: vocabulary 6 (padded to 8), hidden 4, 4 experts of
// intermediate 3, top-2, max_batch_tokens 4.
constexpr int64_t kVocab = 6, kPadded = 8, kHidden = 4, kExperts = 4, kInter = 3, kTokens = 4;
constexpr int64_t kCapacity = kTokens; // dropless: c(max_batch_tokens) = max_batch_tokens

json routing() {
  return {{"scoring", "softmax"}, {"top_k", 2}, {"topk_on", "scores"}, {"normalize", true},
          {"scaling_factor", 1.0}, {"num_groups", 1}, {"topk_groups", 1},
          {"group_score", "top2_sum"}, {"compute_type", "F32"}};
}

json logicalWeights() {
  return json::array({weight("embed", {kVocab, kHidden}), weight("router", {kExperts, kHidden}),
                      weight("e.{e}.w1", {kExperts, kInter, kHidden}, kExperts),
                      weight("e.{e}.w3", {kExperts, kInter, kHidden}, kExperts),
                      weight("e.{e}.w2", {kExperts, kHidden, kInter}, kExperts),
                      weight("head", {kVocab, kHidden})});
}

json header(int64_t worldSize, json degrees, json weights, json programs, json ranks) {
  return {{"format", "moe-plan"}, {"version", 4}, {"producer", "test"},
          {"model", {{"model_type", "mixtral"}, {"source", "/m/config.json"},
                     {"vocab_size", kVocab}, {"max_position_embeddings", 64},
                     {"eos_token_ids", {2}}}},
          {"workload", {{"max_batch_tokens", kTokens}, {"max_seq_len", 16}, {"max_sequences", 2}}},
          {"world_size", worldSize}, {"degrees", degrees},
          {"vocab", {{"size", kVocab}, {"padded", kPadded}, {"pad_to", kPadded}}},
          {"weights", weights}, {"programs", programs}, {"ranks", ranks}};
}

json program(json weights, json buffers, json steps, int64_t logits) {
  return {{"stage", 0}, {"weights", weights}, {"buffers", buffers},
          {"kv_caches", json::array()}, {"inputs", {{"tokens", 0}, {"positions", 1}}},
          {"logits", logits},
          {"memory", {{"weights", 0}, {"activations", 0}, {"kv_cache", 0}, {"peak", 0}}},
          {"steps", steps}};
}

json rankEntry(int64_t r, int64_t tp, int64_t ep) {
  return {{"rank", r}, {"program", 0},
          {"coords", {{"dp", 0}, {"pp", 0}, {"tp", tp}, {"edp", 0}, {"ep", ep}, {"etp", 0}}},
          {"memory", {{"weights", 0}, {"peak", 0}}}};
}

/// One rank: embedding -> router -> dispatch -> expert_ffn -> combine ->
/// head (padded to 8 rows) -> split off the padding.
json singleRankPlan() {
  json local = logicalWeights();
  local[5] = weight("head", {kPadded, kHidden});
  json buffers = json::array({
      buffer(kTokens, 1, "I32"), buffer(kTokens, 1, "I32"), buffer(kTokens, kHidden),
      buffer(kTokens, 2), buffer(kTokens, 2, "I32"), buffer(kExperts * kCapacity, kHidden),
      buffer(1, kExperts, "I32"), buffer(kTokens, 2, "I32"),
      buffer(kExperts * kCapacity, kHidden), buffer(kTokens, kHidden),
      buffer(kTokens, kVocab), buffer(kTokens, kPadded), buffer(kTokens, kPadded - kVocab)});
  json dispatch = {{"num_experts", kExperts}, {"capacity", kCapacity}, {"capacity_factor", 0.0},
                   {"top_k", 2}, {"row_parts", 1}, {"row_part_stride", 1}};
  json steps = json::array({
      step("embedding", {0}, {0}, {2}),
      step("router", {2}, {1}, {3, 4}, {{"routing", routing()}}),
      step("dispatch", {2, 4}, {}, {5, 6, 7}, dispatch),
      step("expert_ffn", {5, 6}, {2, 3, 4}, {8}, {{"activation", "silu"}}),
      step("combine", {8, 7, 3}, {}, {9}),
      step("linear", {9}, {5}, {11}, {{"head", true}}),
      step("split", {11}, {}, {10, 12}, {{"widths", {kVocab, kPadded - kVocab}}}),
  });
  return header(1, {{"dp", 1}, {"pp", 1}, {"tp", 1}, {"ep", 1}, {"etp", 1}}, logicalWeights(),
                {program(local, buffers, steps, 10)}, {rankEntry(0, 0, 0)});
}

/// tp 2 x ep 2 on two ranks (rank r: tp r, ep r): vocab_shard embedding +
/// all_reduce over tp, router, dispatch of row part r, all_to_all over ep,
/// expert_ffn on experts 2r, 2r+1, all_to_all back, combine, all_reduce
/// over tp, head on vocabulary rows [4r, 4r+4), all_gather over tp, split.
json tensorExpertPlan() {
  const int64_t El = kExperts / 2, R = kPadded / 2;
  json local = json::array({weight("embed", {R, kHidden}), weight("router", {kExperts, kHidden}),
                            weight("e.{e}.w1", {El, kInter, kHidden}, El),
                            weight("e.{e}.w3", {El, kInter, kHidden}, El),
                            weight("e.{e}.w2", {El, kHidden, kInter}, El),
                            weight("head", {R, kHidden})});
  const int64_t rows = kExperts * kCapacity;
  json buffers = json::array({
      buffer(kTokens, 1, "I32"), buffer(kTokens, 1, "I32"), buffer(kTokens, kHidden), // 0-2
      buffer(kTokens, 2), buffer(kTokens, 2, "I32"),                                 // 3-4
      buffer(rows, kHidden), buffer(1, kExperts, "I32"), buffer(kTokens, 2, "I32"),   // 5-7
      buffer(rows, kHidden), buffer(1, kExperts, "I32"),                             // 8-9
      buffer(rows, kHidden), buffer(rows, kHidden), buffer(1, kExperts, "I32"),       // 10-12
      buffer(kTokens, kHidden), buffer(kTokens, R), buffer(kTokens, kPadded),        // 13-15
      buffer(kTokens, kVocab), buffer(kTokens, kPadded - kVocab)});                  // 16-17
  json tp = {{"mesh", "mesh"}, {"axis", "tp"}}, ep = {{"mesh", "experts"}, {"axis", "ep"}};
  json dispatch = {{"num_experts", kExperts}, {"capacity", kCapacity}, {"capacity_factor", 0.0},
                   {"top_k", 2}, {"row_parts", 2}, {"row_part_stride", 1}};
  json steps = json::array({
      step("embedding", {0}, {0}, {2}, {{"vocab_shard", true}}),
      step("all_reduce", {2}, {}, {2}, tp),
      step("router", {2}, {1}, {3, 4}, {{"routing", routing()}}),
      step("dispatch", {2, 4}, {}, {5, 6, 7}, dispatch),
      step("all_to_all", {5, 6}, {}, {8, 9}, ep),
      step("expert_ffn", {8, 9}, {2, 3, 4}, {10}, {{"activation", "silu"}}),
      step("all_to_all", {10, 9}, {}, {11, 12}, ep),
      step("combine", {11, 7, 3}, {}, {13}),
      step("all_reduce", {13}, {}, {13}, tp),
      step("linear", {13}, {5}, {14}, {{"head", true}}),
      step("all_gather", {14}, {}, {15}, tp),
      step("split", {15}, {}, {16, 17}, {{"widths", {kVocab, kPadded - kVocab}}}),
  });
  json ranks = json::array();
  for (int64_t r = 0; r < 2; ++r) {
    json entry = rankEntry(r, r, r);
    // Vocabulary rows [4r, 4r + 4) of the padded 8: rank 1 holds the
    // checkpoint's rows 4 and 5, its rows 6 and 7 are padding.
    int64_t vocabRows = std::min(R, kVocab - r * R);
    json slices = {slice("embed", {kVocab, kHidden}, {r * R, 0}, {vocabRows, kHidden}),
                   slice("router", {kExperts, kHidden}, {0, 0}, {kExperts, kHidden}),
                   slice("head", {kVocab, kHidden}, {r * R, 0}, {vocabRows, kHidden})};
    for (int64_t e = r * El; e < (r + 1) * El; ++e) {
      slices.push_back(slice(fmt::format("e.{}.w1", e), {kInter, kHidden}, {0, 0}, {kInter, kHidden}));
      slices.push_back(slice(fmt::format("e.{}.w3", e), {kInter, kHidden}, {0, 0}, {kInter, kHidden}));
      slices.push_back(slice(fmt::format("e.{}.w2", e), {kHidden, kInter}, {0, 0}, {kHidden, kInter}));
    }
    entry["weights"] = slices;
    ranks.push_back(entry);
  }
  return header(2, {{"dp", 1}, {"pp", 1}, {"tp", 2}, {"ep", 2}, {"etp", 1}}, logicalWeights(),
                {program(local, buffers, steps, 16)}, ranks);
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::string p = (fs::temp_directory_path() / "moert-device-XXXXXX").string();
    path = ::mkdtemp(p.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

cpu::Matrix matrixOf(const std::vector<float> &v, int64_t rows, int64_t cols) {
  return cpu::Matrix{DType::F32, v.data(), rows, cols, cols};
}

/// Random weights for the model, written to DIR/model.safetensors; logits
/// through the kernels called directly (cpu::experts, unpadded head).
struct Model {
  std::map<std::string, std::vector<float>> values;

  explicit Model(const fs::path &dir) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> uniform(-0.5f, 0.5f);
    std::vector<TensorToWrite> tensors;
    auto add = [&](const std::string &name, std::vector<int64_t> shape) {
      std::vector<float> &v = values[name];
      v.resize(shape[0] * shape[1]);
      for (float &x : v)
        x = uniform(rng);
      tensors.push_back({name, DType::F32, shape, [&v](char *out) {
                           std::memcpy(out, v.data(), v.size() * 4);
                         }});
    };
    add("embed", {kVocab, kHidden});
    add("router", {kExperts, kHidden});
    add("head", {kVocab, kHidden});
    for (int64_t e = 0; e < kExperts; ++e) {
      add(fmt::format("e.{}.w1", e), {kInter, kHidden});
      add(fmt::format("e.{}.w3", e), {kInter, kHidden});
      add(fmt::format("e.{}.w2", e), {kHidden, kInter});
    }
    writeSafetensors((dir / "model.safetensors").string(), tensors);
  }

  int64_t bytes() const {
    int64_t n = 0;
    for (auto &[name, v] : values)
      n += static_cast<int64_t>(v.size()) * 4;
    return n;
  }

  std::vector<float> logits(const Batch &batch, const cpu::RoutingParams &params) {
    const int64_t T = batch.size(), k = 2;
    std::vector<float> x(T * kHidden), routerLogits(T * kExperts), w(T * k), moe(T * kHidden);
    std::vector<int32_t> ids(T * k);
    cpu::embedding(matrixOf(values["embed"], kVocab, kHidden), batch.tokens.data(), T, x.data());
    cpu::linear(x.data(), T, matrixOf(values["router"], kExperts, kHidden), nullptr,
                routerLogits.data());
    cpu::route(routerLogits.data(), T, kExperts, nullptr, params, w.data(), ids.data());
    std::vector<cpu::Matrix> gate, up, down;
    for (int64_t e = 0; e < kExperts; ++e) {
      gate.push_back(matrixOf(values[fmt::format("e.{}.w1", e)], kInter, kHidden));
      up.push_back(matrixOf(values[fmt::format("e.{}.w3", e)], kInter, kHidden));
      down.push_back(matrixOf(values[fmt::format("e.{}.w2", e)], kHidden, kInter));
    }
    cpu::experts(x.data(), T, kHidden, w.data(), ids.data(), k, gate, up, down,
                 cpu::Activation::Silu, moe.data());
    const int64_t R = static_cast<int64_t>(batch.logitRows.size());
    std::vector<float> out(R * kVocab);
    for (int64_t r = 0; r < R; ++r)
      cpu::linear(moe.data() + batch.logitRows[r] * kHidden, 1,
                  matrixOf(values["head"], kVocab, kHidden), nullptr, out.data() + r * kVocab);
    return out;
  }
};

Batch sampleBatch() {
  Batch batch;
  batch.tokens = {3, 0, 5, 4};
  batch.positions = {0, 1, 2, 3};
  batch.slots = {0, 0, 0, 0};
  batch.logitRows = {1, 3};
  return batch;
}

void expectNear(const std::vector<float> &got, const std::vector<float> &want,
                const std::string &what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5) << what << ": logit " << i;
}

} // namespace

TEST(CpuDevice, CapacityExpertsAndPaddedHead) {
  TempDir dir;
  std::ofstream(dir.path / "plan.json") << planText(singleRankPlan());
  Plan plan = Plan::load((dir.path / "plan.json").string());
  Model model(dir.path);
  auto ckpt = Checkpoint::open(dir.path.string());
  checkNoUnexpectedTensors(plan, *ckpt);

  SoloComm comm;
  auto device = RankExecutor::create(DeviceKind::Cpu);
  device->prepare(plan, 0, *ckpt, comm);
  // Every tensor is read whole; the head is a copy padded to 8 rows.
  EXPECT_EQ(device->loadedWeightBytes(), model.bytes());
  EXPECT_EQ(device->weightBytes(), model.bytes() + (kPadded - kVocab) * kHidden * 4);
  // The workspace: the executor's program memory (buffers and caches) and
  // the device's scratch; with the weights, the peak.
  const PlanProgram &program = plan.programs[0];
  int64_t programBytes = 0;
  for (const PlanBuffer &b : program.buffers)
    programBytes += b.rows * b.width * 4;
  for (const PlanCache &c : program.caches)
    programBytes += plan.maxSequences * plan.maxSeqLen * (c.keyWidth + c.valueWidth) * 4;
  EXPECT_GE(device->workspaceBytes(), programBytes);
  EXPECT_EQ(device->peakBytes(), device->weightBytes() + device->workspaceBytes());

  Batch batch = sampleBatch();
  std::vector<float> logits;
  device->forward(batch, logits);
  expectNear(logits, model.logits(batch, plan.programs[0].steps[1].routing), "rank 0");
  // The CPU's kernels finish in their step: every step is timed.
  std::vector<double> seconds = device->stepSeconds();
  ASSERT_EQ(seconds.size(), program.steps.size());
  EXPECT_GT(std::accumulate(seconds.begin(), seconds.end(), 0.0), 0.0);

  // An empty batch runs every step with no rows and leaves no logits.
  device->forward(Batch{}, logits);
  EXPECT_TRUE(logits.empty());
}

TEST(CpuDevice, TensorAndExpertParallelRanks) {
  ThreadCount serial(1); // the kernels' pool serves one caller at a time
  TempDir dir;
  std::ofstream(dir.path / "plan.json") << planText(tensorExpertPlan());
  Plan plan = Plan::load((dir.path / "plan.json").string());
  Model model(dir.path);
  auto ckpt = Checkpoint::open(dir.path.string());
  checkNoUnexpectedTensors(plan, *ckpt);
  Batch batch = sampleBatch();
  std::vector<float> want = model.logits(batch, plan.programs[0].steps[2].routing);

  World world;
  std::vector<float> logits[2], empty[2] = {{1.0f}, {1.0f}};
  int64_t loaded[2] = {};
  std::exception_ptr failure[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        ThreadComm comm(world, r, 2);
        auto device = RankExecutor::create(DeviceKind::Cpu);
        device->prepare(plan, r, *ckpt, comm);
        loaded[r] = device->loadedWeightBytes();
        device->forward(batch, logits[r]);
        device->forward(Batch{}, empty[r]); // every collective with no rows
      } catch (...) {
        failure[r] = std::current_exception();
      }
    });
  for (std::thread &t : ranks)
    t.join();
  for (int r = 0; r < 2; ++r) {
    if (failure[r])
      std::rethrow_exception(failure[r]);
    expectNear(logits[r], want, fmt::format("rank {}", r));
    EXPECT_TRUE(empty[r].empty());
  }
  // Between them the ranks read the embedding and head once, the router
  // twice and each expert once.
  EXPECT_EQ(loaded[0] + loaded[1], model.bytes() + kExperts * kHidden * 4);
}

// The device memory interface on the host: zero-filled, 256-byte aligned
// allocations, counted until released; writes, reads and 2-D copies.
TEST(HostMemory, AllocatesZeroedAlignedAndCountsWhatItHolds) {
  HostMemory memory;
  auto *a = static_cast<float *>(memory.allocate(40));
  auto *b = static_cast<float *>(memory.allocate(1000));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 256, 0u);
  for (int i = 0; i < 250; ++i)
    EXPECT_EQ(b[i], 0.0f);
  EXPECT_EQ(memory.allocatedBytes(), 1040);
  const float in[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  memory.write(a, in, sizeof in);
  float out[10] = {};
  memory.read(out, a, sizeof out);
  EXPECT_EQ(std::memcmp(in, out, sizeof in), 0);
  // Rows 0 and 1 of a [2, 5] block into columns [1, 3) of a [2, 4] one.
  memory.copy2d(b + 1, 16, a, 20, 8, 2);
  EXPECT_EQ(b[1], 1.0f);
  EXPECT_EQ(b[2], 2.0f);
  EXPECT_EQ(b[5], 6.0f);
  EXPECT_EQ(b[6], 7.0f);
  EXPECT_EQ(b[3], 0.0f);
  memory.release(b, 1000);
  EXPECT_EQ(memory.allocatedBytes(), 40);
  EXPECT_EQ(memory.allocate(0), nullptr);
}

// A rank's program on a device's memory: every buffer and KV cache in the
// plan's layout, the batch in, the logits out, a batch too large refused.
TEST(RankProgram, AllocatesThePlansLayoutAndMovesTheBatchAndLogits) {
  TempDir dir;
  std::ofstream(dir.path / "plan.json") << planText(singleRankPlan());
  Plan plan = Plan::load((dir.path / "plan.json").string());
  const PlanProgram &program = plan.programOf(0);
  HostMemory memory;
  RankProgram rank;
  rank.prepare(plan, 0, memory, nullptr, RankProgram::Staging::OnDemand);
  int64_t want = 0;
  for (const PlanBuffer &b : program.buffers)
    want += b.rows * b.width * 4;
  for (const PlanCache &c : program.caches)
    want += plan.maxSequences * plan.maxSeqLen * (c.keyWidth + c.valueWidth) * 4;
  EXPECT_EQ(rank.bytes(), want);
  EXPECT_EQ(memory.allocatedBytes(), want);
  for (size_t i = 0; i < program.buffers.size(); ++i)
    EXPECT_EQ(rank.collectives().address(static_cast<int64_t>(i)),
              rank.buffer(static_cast<int64_t>(i)));

  Batch batch = sampleBatch();
  rank.writeInputs(batch);
  const auto *tokens = static_cast<const int32_t *>(rank.buffer(program.tokensBuffer));
  EXPECT_EQ(std::vector<int32_t>(tokens, tokens + 4), batch.tokens);
  auto *logitsBuffer = static_cast<float *>(rank.buffer(program.logitsBuffer));
  for (int64_t i = 0; i < 2 * plan.vocabSize; ++i)
    logitsBuffer[i] = static_cast<float>(i);
  std::vector<float> logits;
  rank.readOutput(2, logits);
  ASSERT_EQ(logits.size(), static_cast<size_t>(2 * plan.vocabSize));
  EXPECT_EQ(logits.back(), static_cast<float>(2 * plan.vocabSize - 1));

  Batch tooLarge;
  tooLarge.tokens.assign(static_cast<size_t>(plan.maxBatchTokens + 1), 1);
  tooLarge.positions = tooLarge.tokens;
  EXPECT_THROW(rank.writeInputs(tooLarge), RuntimeError);
  Batch mismatched = batch;
  mismatched.positions.pop_back();
  EXPECT_THROW(rank.writeInputs(mismatched), RuntimeError);
}

// all_gather's staging: grown to each gather's bytes on demand (the old
// block given back), or reserved at prepare and never exceeded.
TEST(RankProgram, StagesGathersOnDemandOrWithinTheReservation) {
  TempDir dir;
  std::ofstream(dir.path / "plan.json") << planText(tensorExpertPlan());
  Plan plan = Plan::load((dir.path / "plan.json").string());
  HostMemory memory;
  RankProgram onDemand;
  onDemand.prepare(plan, 0, memory, nullptr, RankProgram::Staging::OnDemand);
  const int64_t program = onDemand.bytes();
  void *small = onDemand.collectives().gatherStage(64);
  EXPECT_EQ(onDemand.bytes(), program + 64);
  EXPECT_EQ(onDemand.collectives().gatherStage(32), small);
  onDemand.collectives().gatherStage(4096);
  EXPECT_EQ(onDemand.bytes(), program + 4096);
  EXPECT_EQ(memory.allocatedBytes(), program + 4096);

  HostMemory other;
  RankProgram reserved;
  reserved.prepare(plan, 0, other, nullptr, RankProgram::Staging::Reserved);
  const int64_t reservation = reserved.bytes() - program;
  EXPECT_GT(reservation, 0); // the head's all_gather: max_batch_tokens rows
  EXPECT_NE(reserved.collectives().gatherStage(reservation), nullptr);
  EXPECT_THROW(reserved.collectives().gatherStage(reservation + 1), RuntimeError);
}
