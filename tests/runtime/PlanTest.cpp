// Units of Plan (format 2): collective groups and pipeline peers of ranks
// for several degree combinations against hand-computed rank lists, a
// minimal hand-written plan that loads, and malformed variants of it, each
// failing with the plan and the field named.
#include "moert/Error.h"
#include "moert/PlanSeal.h"
#include "moert/Plan.h"

#include "PlanJson.h"

#include "gtest/gtest.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include <unistd.h>

using namespace moert;
namespace fs = std::filesystem;
using nlohmann::json;
using namespace moert::test;

namespace {

/// A plan of the given degrees whose ranks have the coordinates of the
/// attention fold (rank = (pp * DP + dp) * TP + tp) and the expert fold
/// (rank = ((pp * EDP + edp) * EP + ep) * ETP + etp).
Plan meshPlan(int64_t dp, int64_t pp, int64_t tp, int64_t ep, int64_t etp) {
  Plan plan;
  plan.degrees = {dp, pp, tp, ep, etp, dp * tp / (ep * etp)};
  plan.worldSize = dp * pp * tp;
  for (int64_t r = 0; r < plan.worldSize; ++r) {
    PlanRank rank;
    rank.rank = r;
    RankCoords &c = rank.coords;
    c.tp = r % tp;
    c.dp = r / tp % dp;
    c.pp = r / (tp * dp);
    c.etp = r % etp;
    c.ep = r / etp % ep;
    c.edp = r / (etp * ep) % plan.degrees.edp;
    plan.ranks.push_back(rank);
  }
  return plan;
}

using Mesh = CollectiveGroup::Mesh;
using Axis = CollectiveGroup::Axis;

std::vector<int> group(const Plan &plan, int64_t rank, Mesh mesh, Axis axis) {
  CollectiveGroup g;
  g.mesh = mesh;
  g.axis = axis;
  return plan.groupOf(rank, g);
}

} // namespace

TEST(PlanGroups, DataAndExpertParallel) { // dp 2, ep 2
  Plan plan = meshPlan(2, 1, 1, 2, 1);
  EXPECT_EQ(group(plan, 0, Mesh::Experts, Axis::EP), (std::vector<int>{0, 1}));
  EXPECT_EQ(group(plan, 1, Mesh::Experts, Axis::EP), (std::vector<int>{0, 1}));
  EXPECT_EQ(group(plan, 1, Mesh::Attention, Axis::DP), (std::vector<int>{0, 1}));
  EXPECT_EQ(group(plan, 1, Mesh::Attention, Axis::TP), (std::vector<int>{1}));
  EXPECT_EQ(group(plan, 0, Mesh::Experts, Axis::ETP), (std::vector<int>{0}));
}

TEST(PlanGroups, TensorAndExpertParallel) { // tp 2, ep 2
  Plan plan = meshPlan(1, 1, 2, 2, 1);
  EXPECT_EQ(group(plan, 1, Mesh::Attention, Axis::TP), (std::vector<int>{0, 1}));
  EXPECT_EQ(group(plan, 0, Mesh::Experts, Axis::EP), (std::vector<int>{0, 1}));
  EXPECT_EQ(group(plan, 0, Mesh::Attention, Axis::DP), (std::vector<int>{0}));
}

TEST(PlanGroups, PipelineAndTensorParallel) { // pp 2, tp 2: rank = pp * 2 + tp
  Plan plan = meshPlan(1, 2, 2, 1, 1);
  EXPECT_EQ(group(plan, 3, Mesh::Attention, Axis::TP), (std::vector<int>{2, 3}));
  EXPECT_EQ(group(plan, 1, Mesh::Attention, Axis::PP), (std::vector<int>{1, 3}));
  EXPECT_EQ(group(plan, 2, Mesh::Experts, Axis::EDP), (std::vector<int>{2, 3}));
  EXPECT_EQ(plan.stageRank(1, 1), 3);
  EXPECT_EQ(plan.stageRank(2, 0), 0);
  EXPECT_EQ(plan.stageRank(3, 0), 1);
}

TEST(PlanGroups, DataTensorAndExpertParallel) { // dp 2, tp 2, ep 4, etp 1: edp 1
  Plan plan = meshPlan(2, 1, 2, 4, 1);
  EXPECT_EQ(group(plan, 2, Mesh::Attention, Axis::TP), (std::vector<int>{2, 3}));
  EXPECT_EQ(group(plan, 1, Mesh::Attention, Axis::DP), (std::vector<int>{1, 3}));
  EXPECT_EQ(group(plan, 2, Mesh::Experts, Axis::EP), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(group(plan, 2, Mesh::Experts, Axis::EDP), (std::vector<int>{2}));
}

TEST(PlanGroups, ExpertTensorParallel) { // tp 4, ep 2, etp 2: expert rank = ep * 2 + etp
  Plan plan = meshPlan(1, 1, 4, 2, 2);
  EXPECT_EQ(group(plan, 1, Mesh::Experts, Axis::ETP), (std::vector<int>{0, 1}));
  EXPECT_EQ(group(plan, 1, Mesh::Experts, Axis::EP), (std::vector<int>{1, 3}));
  EXPECT_EQ(group(plan, 3, Mesh::Attention, Axis::TP), (std::vector<int>{0, 1, 2, 3}));
}

TEST(PlanGroups, PipelineDataAndExpertParallel) { // pp 2, dp 2, ep 2: edp 1
  Plan plan = meshPlan(2, 2, 1, 2, 1);
  EXPECT_EQ(group(plan, 3, Mesh::Experts, Axis::EP), (std::vector<int>{2, 3}));
  EXPECT_EQ(group(plan, 1, Mesh::Attention, Axis::PP), (std::vector<int>{1, 3}));
  EXPECT_EQ(group(plan, 2, Mesh::Attention, Axis::DP), (std::vector<int>{2, 3}));
  EXPECT_EQ(plan.stageRank(0, 1), 2);
  EXPECT_EQ(plan.stageRank(3, 0), 1);
}

//===----------------------------------------------------------------------===//
// Loading
//===----------------------------------------------------------------------===//

namespace {

/// A one-rank model of vocabulary 8, hidden 4, 2 experts of intermediate 3,
/// top-2, max_batch_tokens 4: embedding, router, dispatch (dropless: C = 4),
/// expert_ffn, combine, LM head.
json minimalPlan() {
  json weights = json::array({weight("embed", {8, 4}), weight("router", {2, 4}),
                              weight("e.{e}.w1", {2, 3, 4}, 2), weight("e.{e}.w3", {2, 3, 4}, 2),
                              weight("e.{e}.w2", {2, 4, 3}, 2), weight("head", {8, 4})});
  json buffers = json::array({
      buffer(4, 1, "I32"),  // 0 tokens
      buffer(4, 1, "I32"),  // 1 positions
      buffer(4, 4),         // 2 hidden
      buffer(4, 2),         // 3 routing weights
      buffer(4, 2, "I32"),  // 4 routing experts
      buffer(8, 4),         // 5 dispatch buffer (E x C = 2 x 4 rows)
      buffer(1, 2, "I32"),  // 6 counts
      buffer(4, 2, "I32"),  // 7 slots
      buffer(8, 4),         // 8 expert outputs
      buffer(4, 4),         // 9 moe output
      buffer(4, 8),         // 10 logits
  });
  json routing = {{"scoring", "softmax"}, {"top_k", 2}, {"topk_on", "scores"},
                  {"normalize", true}, {"scaling_factor", 1.0}, {"num_groups", 1},
                  {"topk_groups", 1}, {"group_score", "top2_sum"}, {"compute_type", "F32"}};
  json dispatch = {{"num_experts", 2}, {"capacity", 4}, {"capacity_factor", 0.0}, {"top_k", 2},
                   {"row_parts", 1}, {"row_part_stride", 1}};
  json steps = json::array({
      step("embedding", {0}, {0}, {2}),
      step("router", {2}, {1}, {3, 4}, {{"routing", routing}}),
      step("dispatch", {2, 4}, {}, {5, 6, 7}, dispatch),
      step("expert_ffn", {5, 6}, {2, 3, 4}, {8}, {{"activation", "silu"}}),
      step("combine", {8, 7, 3}, {}, {9}),
      step("linear", {9}, {5}, {10}, {{"head", true}}),
  });
  json program = {{"stage", 0},
                  {"weights", weights},
                  {"buffers", buffers},
                  {"kv_caches", json::array()},
                  {"inputs", {{"tokens", 0}, {"positions", 1}}},
                  {"logits", 10},
                  {"memory", {{"weights", 0}, {"activations", 0}, {"kv_cache", 0}, {"peak", 0}}},
                  {"steps", steps}};
  json rank = {{"rank", 0},
               {"program", 0},
               {"coords", {{"dp", 0}, {"pp", 0}, {"tp", 0}, {"edp", 0}, {"ep", 0}, {"etp", 0}}},
               {"memory", {{"weights", 0}, {"peak", 0}}}};
  return {{"format", "moe-plan"},
          {"version", 4},
          {"producer", "test"},
          {"model", {{"model_type", "mixtral"}, {"source", "/m/config.json"}, {"vocab_size", 8},
                     {"max_position_embeddings", 64}, {"eos_token_ids", {2}}}},
          {"workload", {{"max_batch_tokens", 4}, {"max_seq_len", 16}, {"max_sequences", 2}}},
          {"world_size", 1},
          {"degrees", {{"dp", 1}, {"pp", 1}, {"tp", 1}, {"ep", 1}, {"etp", 1}}},
          {"vocab", {{"size", 8}, {"padded", 8}, {"pad_to", 1}}},
          {"stage_begin", {0}},
          {"weights", weights},
          {"programs", {program}},
          {"ranks", {rank}}};
}

/// A temporary file holding `text`.
std::string writeText(const std::string &text) {
  std::string path = (fs::temp_directory_path() / "moert-plan-XXXXXX").string();
  int fd = ::mkstemp(path.data());
  EXPECT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path) << text;
  return path;
}

std::string writePlan(const json &plan) { return writeText(planText(plan)); }

/// The message of loading the plan file `text`, with its path replaced by
/// PLAN ("" if it loads).
std::string loadMessage(const std::string &text) {
  std::string path = writeText(text);
  std::string message;
  try {
    Plan::load(path);
  } catch (const InputError &e) {
    message = e.what();
    message.replace(0, path.size(), "PLAN");
  }
  fs::remove(path);
  return message;
}

/// The message of loading minimalPlan() changed by `edit` (steps linked
/// after the edit, as moec would).
std::string loadError(const std::function<void(json &)> &edit) {
  json plan = minimalPlan();
  edit(plan);
  return loadMessage(planText(plan));
}

} // namespace

/// The minimal plan with a decode entry beside its program (renamed
/// "prefill"): a copy of it, compiled for as many tokens a step.
json withDecodeEntry() {
  json plan = minimalPlan();
  json decode = plan["programs"][0];
  plan["programs"][0]["entry"] = "prefill";
  decode["entry"] = "decode";
  decode["max_batch_tokens"] = plan["workload"]["max_batch_tokens"];
  plan["programs"].push_back(decode);
  plan["schedule"] = {{"prefill", "prefill"}, {"decode", "decode"}};
  return plan;
}

TEST(PlanLoad, EntriesAndTheirSchedule) {
  std::string path = writePlan(withDecodeEntry());
  Plan plan = Plan::load(path);
  fs::remove(path);
  ASSERT_EQ(plan.programs.size(), 2u);
  EXPECT_EQ(plan.prefillEntry, "prefill");
  EXPECT_EQ(plan.decodeEntry, "decode");
  std::vector<const PlanProgram *> entries = plan.entriesOf(0);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0], &plan.programs[0]);
  EXPECT_EQ(entries[1]->entry, "decode");
  EXPECT_EQ(entries[0]->maxBatchTokens, plan.maxBatchTokens);
  EXPECT_EQ(entries[1]->maxBatchTokens, plan.maxBatchTokens);
  // The rank's prediction: the shared weights and caches once, each
  // entry's buffers.
  EXPECT_EQ(plan.ranks[0].predictedPeakBytes,
            entries[0]->weightBytes + entries[0]->cacheBytes + entries[0]->activationBytes +
                entries[1]->activationBytes);

  // A plan without entries runs "forward" for every phase.
  path = writePlan(minimalPlan());
  Plan one = Plan::load(path);
  fs::remove(path);
  EXPECT_EQ(one.prefillEntry, "forward");
  EXPECT_EQ(one.decodeEntry, "forward");
  EXPECT_EQ(one.entriesOf(0).size(), 1u);

  auto entryError = [](const std::function<void(json &)> &edit) {
    json plan = withDecodeEntry();
    edit(plan);
    return loadMessage(planText(plan));
  };
  EXPECT_EQ(entryError([](json &) {}), "");
  EXPECT_EQ(entryError([](json &p) { p.erase("schedule"); }),
            "PLAN: schedule: missing: the programs have entries 'prefill' and 'decode'");
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["entry"] = "prefill"; }),
            "PLAN: schedule: missing: no phase runs entry 'prefill'");
  EXPECT_EQ(entryError([](json &p) { p["schedule"]["decode"] = "prefill"; }),
            "PLAN: schedule.decode: no phase runs entry 'decode'");
  EXPECT_EQ(entryError([](json &p) { p["schedule"]["decode"] = "forward"; }),
            "PLAN: schedule.decode: 'forward' is not an entry of the programs");
  EXPECT_EQ(entryError([](json &p) { p["schedule"].erase("prefill"); }),
            "PLAN: schedule.prefill: missing");
  EXPECT_EQ(entryError([](json &p) { p["schedule"]["backward"] = "decode"; }),
            "PLAN: schedule.backward: unknown field");
  // The entries of a stage share the rank's weights and KV caches (a
  // program's weights are bound by its steps, in order: two entries of
  // one model differ in them only by their local shapes).
  EXPECT_EQ(entryError([](json &p) {
              const int64_t rows = p["workload"]["max_sequences"].get<int64_t>() *
                                   p["workload"]["max_seq_len"].get<int64_t>();
              p["programs"][1]["kv_caches"].push_back(
                  {{"key_width", 8}, {"value_width", 8}, {"bytes", rows * 16 * 4}});
            }),
            "PLAN: programs[1]: its KV caches differ from those of entry 'prefill' of stage 0 "
            "(the entries of a stage share them)");
  EXPECT_EQ(entryError([](json &p) { p["programs"][1]["entry"] = "prefill"; }),
            "PLAN: programs[0]: entry 'prefill' has 2 programs of stage 0 (expected one)");
  EXPECT_EQ(entryError([](json &p) { p["ranks"][0]["program"] = 1; }),
            "PLAN: ranks[0].program: program 1 is of entry 'decode', not the first entry "
            "('prefill')");
  EXPECT_EQ(entryError([](json &p) { p["programs"][1]["max_batch_tokens"] = 100000; })
                .substr(0, 48),
            "PLAN: programs[1].max_batch_tokens: expected a v");
  // An entry's steps are checked against its own workload: a dispatch
  // sized for more tokens than the entry's is refused.
  EXPECT_EQ(entryError([](json &p) { p["programs"][1]["max_batch_tokens"] = 2; }),
            "PLAN: programs[1].steps[2] (dispatch): capacity 4 is not c(max_batch_tokens) = 2 "
            "(capacity_factor 0)");
}

TEST(PlanLoad, MinimalPlanLoads) {
  std::string path = writePlan(minimalPlan());
  Plan plan = Plan::load(path);
  fs::remove(path);
  ASSERT_EQ(plan.programs.size(), 1u);
  ASSERT_EQ(plan.ranks.size(), 1u);
  const PlanProgram &program = plan.programOf(0);
  EXPECT_EQ(program.logitsBuffer, 10);
  EXPECT_EQ(program.buffers[5].rows, 8);
  ASSERT_EQ(program.steps.size(), 6u);
  EXPECT_EQ(program.steps[2].op->name, "dispatch");
  EXPECT_EQ(program.steps[2].dispatch.capacity, 4);
  EXPECT_EQ(program.steps[3].op->name, "expert_ffn");
  EXPECT_TRUE(program.steps[5].head);
  EXPECT_EQ(plan.paddedVocab, 8);
  EXPECT_EQ(plan.degrees.edp, 1);
}

TEST(PlanLoad, BadFieldsAreNamed) {
  EXPECT_EQ(loadError([](json &) {}), "");
  EXPECT_EQ(loadError([](json &p) { p["version"] = 1; }),
            "PLAN: version: this moert reads plan format 4 but the plan is format 1");
  EXPECT_EQ(loadError([](json &p) { p["ranks"][0]["program"] = 1; }),
            "PLAN: ranks[0].program: program 1 out of range (the plan has 1)");
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["steps"][4]["in"][1] = 11; }),
            "PLAN: programs[0].steps[4].in: buffer 11 out of range");
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["steps"][2]["attrs"]["capacity"] = 3; }),
            "PLAN: programs[0].steps[2] (dispatch): capacity 3 is not c(max_batch_tokens) = 4 "
            "(capacity_factor 0)");
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["buffers"][5] = buffer(6, 4); }),
            "PLAN: programs[0].steps[2] (dispatch): buffer 5 has 6 rows but num_experts x "
            "capacity is 8");
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["buffers"][2] = buffer(3, 4); }),
            "PLAN: programs[0].steps[0] (embedding): buffer 2 has 3 rows, fewer than "
            "max_batch_tokens (4)");
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["steps"][3]["weights"] = {2, 3, 1}; }),
            "PLAN: programs[0].steps[3] (expert_ffn): weight 'router' has rank 2 but the op "
            "needs rank 3");
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["steps"][5]["attrs"] = json::object(); }),
            "PLAN: programs[0].steps: the last stage has no LM head (a linear with \"head\": "
            "true)");
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["weights"][0]["name"] = "nope"; }),
            "PLAN: programs[0].weights[0].name: 'nope' is not among the plan's weights");
  EXPECT_EQ(loadError([](json &p) { p["ranks"][0]["coords"]["tp"] = 1; }),
            "PLAN: ranks[0].coords.tp: expected a value below the degree 1 but got 1");
  EXPECT_EQ(loadError([](json &p) { p["degrees"]["tp"] = 2; }),
            "PLAN: degrees.dp: dp x pp x tp = 2 but world_size is 1");
  EXPECT_EQ(loadError([](json &p) {
              p["programs"][0]["steps"][4] = step("all_reduce", {9}, {}, {9},
                                                  {{"mesh", "mesh"}, {"axis", "ep"}});
            }),
            "PLAN: programs[0].steps[4].attrs.axis: \"ep\" is not an axis of @mesh (pp, dp, tp)");
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["steps"][0] = step("send", {2}, {}, {}); }),
            "PLAN: programs[0].steps[0] (send): a send on stage 0 of 1 with stage 1: expected a "
            "neighbouring stage");
  // A program's entry (its exec.program's): forward runs; an entry this
  // moert does not run is refused by name, not run as if it were one.
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["entry"] = "forward"; }), "");
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["entry"] = "backward"; }),
            "PLAN: programs[0].entry: 'backward': not supported yet (this moert runs forward, "
            "prefill, decode, train and optimizer programs)");
  // A train program reads labels and gives the loss instead of logits; no
  // other program reads labels.
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["entry"] = "train"; }),
            "PLAN: programs[0].inputs.labels: missing: a train program reads the labels");
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["inputs"]["labels"] = 0; }),
            "PLAN: programs[0].inputs.labels: only a train program reads labels");
  EXPECT_EQ(loadError([](json &p) {
              p["programs"][0]["entry"] = "train";
              p["programs"][0]["inputs"]["labels"] = 0;
            }),
            "PLAN: programs[0].loss: missing: the last stage of a train program gives the "
            "loss");
  EXPECT_EQ(loadError([](json &p) {
              p["programs"][0]["entry"] = "train";
              p["programs"][0]["inputs"]["labels"] = 0;
              p["programs"][0]["loss"] = 1;
            }),
            "PLAN: programs[0].loss: expected an F32 buffer of 1 row of 4 (loss, ce, aux, z)");
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["loss"] = 1; }),
            "PLAN: programs[0].loss: expected -1 (only the last stage of a train program gives "
            "the loss)");
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["entry"] = 3; }),
            "PLAN: programs[0].entry: expected a string");
  // Members not in the plan schema (moe/PlanSchema.h) are refused by name
  // wherever they are: a misspelt field never silently means its default.
  EXPECT_EQ(loadError([](json &p) { p["programz"] = json::array(); }),
            "PLAN: programz: unknown field");
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["steps"][1]["weight"] = {0}; }),
            "PLAN: programs[0].steps[1].weight: unknown field");
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["buffers"][0]["stride"] = 4; }),
            "PLAN: programs[0].buffers[0].stride: unknown field");
  EXPECT_EQ(loadError([](json &p) { p["model"]["tie_word_embeddings"] = true; }),
            "PLAN: model.tie_word_embeddings: unknown field");
  EXPECT_EQ(loadError([](json &p) { p["ranks"][0]["memory"]["gpu"] = 0; }),
            "PLAN: ranks[0].memory.gpu: unknown field");
}

// Issue 14: the CUDA kernel table is read with the plan, every field and
// reference checked, so that the CUDA device never meets a bad one while it
// launches (it used to parse "buf:3" per launch and could throw
// std::out_of_range).
namespace {

json kernelLaunch(const char *name, json params) {
  return {{"kernel", name},
          {"grid", {{1, 1, 0}, {0, 1, 1}, {0, 1, 1}}},
          {"block", 128},
          {"shared_bytes", 0},
          {"params", std::move(params)}};
}

json gemmLaunch(const char *a, const char *b, const char *c, json m, int64_t n, int64_t k) {
  return {{"gemm", {{"a", a}, {"b", b}, {"c", c}, {"m", std::move(m)}, {"n", n}, {"k", k},
                    {"lda", k}, {"ldb", k}, {"ldc", n}, {"b_dtype", "F32"}, {"batch", 1}}}};
}

/// minimalPlan() with a kernel table as moec --target cuda writes one.
json cudaPlan() {
  json plan = minimalPlan();
  json none = {{"rows", "T"}, {"launches", json::array()}};
  json experts = gemmLaunch("buf:5", "weight:2", "scratch:0", "4", 3, 4);
  experts["gemm"]["batch"] = 2;
  experts["gemm"]["stride_a"] = 16;
  experts["gemm"]["stride_b"] = 12;
  experts["gemm"]["stride_c"] = 12;
  experts["gemm"]["b_batch_modulo"] = 2;
  experts["gemm"]["rows_from_counts"] = "buf:6";
  plan["programs"][0]["cuda"] = {
      {"format", 2},
      {"source", "stage0.cu"},
      {"code", "extern \"C\" __global__ void moe_s0_embedding() {}"},
      {"fatbin", "UO1VugEAEAB4VjQSAAAAAAAAAAA="}, // 20 bytes, 0xBA55ED50 first
      {"scratch", {{{"bytes", 96}}}},
      {"rope_tables", json::array()},
      {"steps",
       {{{"rows", "T"},
         {"launches", {kernelLaunch("moe_s0_embedding", {"buf:2", "buf:0", "weight:0", "T"})}}},
        {{"rows", "T"}, {"launches", {gemmLaunch("buf:2", "weight:1", "buf:3", "T", 2, 4)}}},
        none,
        {{"rows", "T"}, {"launches", {experts}}},
        none,
        {{"rows", "T"}, {"launches", {gemmLaunch("buf:9", "weight:5", "buf:10", "R", 8, 4)}}}}},
      {"sampling",
       {{"argmax", kernelLaunch("moe_s6_argmax", {"buf:10", "batch:argmax", "R", "const:-3"})}}}};
  return plan;
}

std::string cudaError(const std::function<void(json &)> &edit) {
  json plan = cudaPlan();
  edit(plan["programs"][0]["cuda"]);
  return loadMessage(planText(plan));
}

} // namespace

// The unfused routing (moec compile --no-fuse): the gate's linear into a
// logits buffer, then a route step; both checked by their op definitions.
TEST(PlanLoad, UnfusedRoutingIsChecked) {
  auto unfused = [](json &p) {
    json &program = p["programs"][0];
    program["buffers"].push_back(buffer(4, 2)); // 11: router logits
    json &steps = program["steps"];
    json route = steps[1];
    route["op"] = "route";
    route["in"] = {11};
    route["weights"] = json::array();
    steps[1] = step("linear", {2}, {1}, {11});
    steps.insert(steps.begin() + 2, route);
  };
  json plan = minimalPlan();
  unfused(plan);
  std::string path = writePlan(plan);
  Plan loaded = Plan::load(path);
  fs::remove(path);
  const PlanProgram &program = loaded.programOf(0);
  ASSERT_EQ(program.steps.size(), 7u);
  EXPECT_EQ(program.steps[1].op->name, "linear");
  EXPECT_EQ(program.steps[2].op->name, "route");
  EXPECT_EQ(program.steps[2].routing.topK, 2);

  EXPECT_EQ(loadError([&](json &p) {
              unfused(p);
              p["programs"][0]["steps"][2]["attrs"]["routing"]["top_k"] = 3;
            }),
            "PLAN: programs[0].steps[2] (route): top_k exceeds the number of experts");
  EXPECT_EQ(loadError([&](json &p) {
              unfused(p);
              p["programs"][0]["steps"][2]["weights"] = {0};
            }),
            "PLAN: programs[0].steps[2] (route): weight 'embed' has rank 2 but the op needs "
            "rank 1");
  EXPECT_EQ(loadError([&](json &p) {
              unfused(p);
              p["programs"][0]["steps"][2]["op"] = "routes";
            }),
            "PLAN: programs[0].steps[2].op: unknown op 'routes'");
}

// split then concat between the embedding and the router: the concat's
// parts are checked against its inputs and its output.
TEST(PlanLoad, ConcatIsChecked) {
  auto joined = [](json &p) {
    json &program = p["programs"][0];
    program["buffers"].push_back(buffer(4, 3)); // 11
    program["buffers"].push_back(buffer(4, 1)); // 12
    program["buffers"].push_back(buffer(4, 4)); // 13
    json &steps = program["steps"];
    steps.insert(steps.begin() + 1, step("split", {2}, {}, {11, 12}, {{"widths", {3, 1}}}));
    steps.insert(steps.begin() + 2, step("concat", {11, 12}, {}, {13}, {{"widths", {3, 1}}}));
    steps[3]["in"] = {13}; // router
    steps[4]["in"][0] = 13; // dispatch
  };
  json plan = minimalPlan();
  joined(plan);
  std::string path = writePlan(plan);
  Plan loaded = Plan::load(path);
  fs::remove(path);
  EXPECT_EQ(loaded.programOf(0).steps[2].op->name, "concat");
  EXPECT_EQ(loaded.programOf(0).steps[2].widths, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(loadError([&](json &p) {
              joined(p);
              p["programs"][0]["steps"][2]["attrs"]["widths"] = {2, 1};
            }),
            "PLAN: programs[0].steps[2] (concat): widths do not add up to the output width");
  EXPECT_EQ(loadError([&](json &p) {
              joined(p);
              p["programs"][0]["steps"][2]["attrs"]["widths"] = {1, 3};
            }),
            "PLAN: programs[0].steps[2] (concat): input narrower than its part");
}

TEST(PlanLoad, AddNormIsChecked) {
  // combine's output + the hidden state, normed before the head; the sum
  // is not read again (the step's two outputs are one buffer).
  auto fused = [](json &p, const std::string &norm) {
    json &program = p["programs"][0];
    p["weights"].insert(p["weights"].begin() + 5, weight("norm", {4}));
    program["weights"].insert(program["weights"].begin() + 5, weight("norm", {4}));
    program["buffers"].push_back(buffer(4, 4)); // 11
    json &steps = program["steps"];
    steps.insert(steps.begin() + 5,
                 step("add_norm", {2, 9}, {5}, {11, 11}, {{"eps", 1e-5}, {"norm", norm}}));
    steps[6]["in"] = {11};
    steps[6]["weights"] = {6};
  };
  for (const char *norm : {"rms_norm", "layer_norm"}) {
    json plan = minimalPlan();
    fused(plan, norm);
    std::string path = writePlan(plan);
    Plan loaded = Plan::load(path);
    fs::remove(path);
    const PlanStep &s = loaded.programOf(0).steps[5];
    EXPECT_EQ(s.op->name, "add_norm");
    EXPECT_EQ(s.layerNorm, std::string(norm) == "layer_norm");
    EXPECT_EQ(s.eps, 1e-5);
  }
  EXPECT_EQ(loadError([&](json &p) { fused(p, "batch_norm"); }),
            "PLAN: programs[0].steps[5].attrs.norm: expected \"rms_norm\" or \"layer_norm\" but "
            "got \"batch_norm\"");
  EXPECT_EQ(loadError([&](json &p) {
              fused(p, "rms_norm");
              p["programs"][0]["steps"][5]["out"] = {11};
            }),
            "PLAN: programs[0].steps[5] (add_norm): expected 2 inputs, 1-1 weights and 2 outputs "
            "but got 2, 1 and 1");
  EXPECT_EQ(loadError([&](json &p) {
              fused(p, "layer_norm");
              p["weights"][5] = weight("norm", {2});
              p["programs"][0]["weights"][5] = weight("norm", {2});
            }),
            "PLAN: programs[0].steps[5] (add_norm): layer_norm weight must span the row");
  EXPECT_EQ(loadError([&](json &p) {
              fused(p, "rms_norm");
              p["programs"][0]["steps"][5]["in"] = {2, 3};
            }),
            "PLAN: programs[0].steps[5] (add_norm): operand widths differ");
}

TEST(PlanLoad, KernelTableIsTyped) {
  std::string path = writePlan(cudaPlan());
  Plan plan = Plan::load(path);
  fs::remove(path);
  const std::shared_ptr<const KernelTable> &t = plan.programOf(0).cuda;
  ASSERT_TRUE(t);
  ASSERT_EQ(t->fatbin.size(), 20u);
  EXPECT_EQ(static_cast<unsigned char>(t->fatbin[0]), 0x50);
  EXPECT_EQ(static_cast<unsigned char>(t->fatbin[3]), 0xBA);
  EXPECT_EQ(static_cast<unsigned char>(t->fatbin[8]), 0x78);
  EXPECT_EQ(t->code.rfind("extern", 0), 0u);
  ASSERT_EQ(t->steps.size(), 6u);
  const KernelLaunch &embed = t->steps[0].launches.at(0);
  EXPECT_EQ(embed.kind, KernelLaunch::Kind::Kernel);
  ASSERT_EQ(embed.params.size(), 4u);
  EXPECT_EQ(embed.params[2].kind, KernelRef::Kind::Weight);
  EXPECT_EQ(embed.params[2].value, 0);
  EXPECT_EQ(embed.params[3].kind, KernelRef::Kind::T);
  const KernelGemm &experts = t->steps[3].launches.at(0).gemm;
  EXPECT_EQ(experts.rows, KernelGemm::Rows::Fixed);
  EXPECT_EQ(experts.m, 4);
  EXPECT_EQ(experts.batch, 2);
  ASSERT_TRUE(experts.rowsFromCounts.has_value());
  EXPECT_EQ(experts.rowsFromCounts->value, 6);
  EXPECT_EQ(t->steps[5].launches.at(0).gemm.rows, KernelGemm::Rows::R);
  EXPECT_FALSE(experts.transposeA);
  EXPECT_TRUE(experts.transposeB); // a weight [out, in] unless it says otherwise
  EXPECT_FALSE(experts.accumulate);
  EXPECT_EQ(experts.kRows, KernelGemm::Rows::Fixed);
  ASSERT_EQ(t->sampling.size(), 1u);
  EXPECT_EQ(t->sampling[0].params[3].kind, KernelRef::Kind::Const);
  EXPECT_EQ(t->sampling[0].params[3].value, -3);
  EXPECT_FALSE(t->hasAllToAll);
}

TEST(PlanLoad, BadKernelTableFieldsAreNamed) {
  const std::string launch0 = "PLAN: programs[0].cuda.steps[0].launches[0].";
  EXPECT_EQ(cudaError([](json &) {}), "");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][0]["launches"][0]["params"][1] = "buf:11"; }),
            launch0 + "params[1]: 'buf:11' is out of range (the program has 11 buffers)");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][0]["launches"][0]["params"][1] = "buf:1x"; }),
            launch0 + "params[1]: 'buf:1x' is out of range (the program has 11 buffers)");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][0]["launches"][0]["params"][2] = "weight:-1"; }),
            launch0 + "params[2]: 'weight:-1' is out of range (the program has 6 weights)");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][0]["launches"][0]["params"][0] = "cache_keys:0"; }),
            launch0 + "params[0]: 'cache_keys:0' is out of range (the program has 0 KV caches)");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][0]["launches"][0]["params"][0] = "wat:1"; }),
            launch0 + "params[0]: unknown reference 'wat:1'");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][0]["launches"][0]["params"][0] = 3; }),
            launch0 + "params[0]: expected a reference such as \"buf:3\" or \"T\"");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][0]["launches"][0]["grid"][1] = {0, 0, 1}; }),
            launch0 + "grid[1]: expected integers a, c in [0, 2147483647] and b in [1, "
                      "2147483647]");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][0]["launches"][0]["grid"].erase(2); }),
            launch0 + "grid: expected 3 dimensions but got 2");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][0]["launches"][0]["block"] = 2048; }),
            launch0 + "block: expected a value <= 1024 (moert's limit) but got 2048");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][0]["launches"][0]["kernel"] = "a;b"; }),
            launch0 + "kernel: expected a kernel name (letters, digits and _)");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][1]["launches"][0]["gemm"]["m"] = "X"; }),
            "PLAN: programs[0].cuda.steps[1].launches[0].gemm.m: expected \"T\", \"R\" or a row "
            "count");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][1]["launches"][0]["gemm"]["b_dtype"] = "I8"; }),
            "PLAN: programs[0].cuda.steps[1].launches[0].gemm.b_dtype: expected F32, BF16 or "
            "F16 but got 'I8'");
  EXPECT_EQ(cudaError([](json &c) {
              c["steps"][3]["launches"][0]["gemm"]["rows_from_counts"] = "buf:2";
            }),
            "PLAN: programs[0].cuda.steps[3].launches[0].gemm.rows_from_counts: expected an I32 "
            "buffer or a scratch entry of at least 2 counts");
  // The backward pass's forms: a weight gradient dy^T x over the step's
  // rows, B stored [k, n], accumulating.
  auto gradient = [](json &c) {
    json &g = c["steps"][1]["launches"][0]["gemm"];
    g["b"] = "buf:2";
    g["transpose_a"] = true;
    g["transpose_b"] = false;
    g["k_rows"] = "T";
    g["accumulate"] = true;
    g["lda"] = 2;
  };
  EXPECT_EQ(cudaError(gradient), "");
  EXPECT_EQ(cudaError([&](json &c) {
              gradient(c);
              c["steps"][1]["launches"][0]["gemm"]["k_rows"] = "8";
            }),
            "PLAN: programs[0].cuda.steps[1].launches[0].gemm.k_rows: expected \"T\" or \"R\" "
            "but got '8'");
  EXPECT_EQ(cudaError([&](json &c) {
              gradient(c);
              c["steps"][1]["launches"][0]["gemm"]["ldb"] = 1;
            }),
            "PLAN: programs[0].cuda.steps[1].launches[0].gemm.ldb: expected at least n (2)");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][1]["launches"][0]["gemm"]["lda"] = 3; }),
            "PLAN: programs[0].cuda.steps[1].launches[0].gemm.lda: expected at least k (4)");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][3]["launches"][0]["gemm"]["k_rows"] = "T"; }),
            "PLAN: programs[0].cuda.steps[3].launches[0].gemm.batch: a batched GEMM has a fixed "
            "k (its blocks' rows come from counts)");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][2]["launches"] = {{{"collective", "all_to_all"}}}; }),
            "PLAN: programs[0].cuda.steps[2].launches[0].collective: 'all_to_all' is not the "
            "step's op (dispatch)");
  EXPECT_EQ(cudaError([](json &c) { c["steps"].erase(5); }),
            "PLAN: programs[0].cuda.steps: expected one entry per plan step (6) but got 5");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][4]["rows"] = "N"; }),
            "PLAN: programs[0].cuda.steps[4].rows: expected \"T\" or \"R\" but got \"N\"");
  EXPECT_EQ(cudaError([](json &c) { c["steps"][5]["rows"] = "R"; }),
            "PLAN: programs[0].cuda.steps[5].rows: expected \"T\": the step runs before the LM "
            "head's logit rows");
  EXPECT_EQ(cudaError([](json &c) { c["fatbin"] = "p.stage0.fatbin"; }),
            "PLAN: programs[0].cuda.fatbin: expected nvcc's fatbin in base64");
  EXPECT_EQ(cudaError([](json &c) { c["fatbin"] = "UO1VugEAEAB4VjQSAAAAAAAAAA=A"; }),
            "PLAN: programs[0].cuda.fatbin: expected nvcc's fatbin in base64");
  EXPECT_EQ(cudaError([](json &c) { c.erase("code"); }),
            "PLAN: programs[0].cuda.code: missing");
  EXPECT_EQ(cudaError([](json &c) { c["format"] = 1; }),
            "PLAN: programs[0].cuda.format: this moert reads kernel table format 2, not 1");
  EXPECT_EQ(cudaError([](json &c) { c["scratch"] = json::array(); }),
            "PLAN: programs[0].cuda.steps[3].launches[0].gemm.c: 'scratch:0' is out of range "
            "(the program has 0 scratch entries)");
}

// Two pipeline stages of one rank each: stage 0 embeds and sends, stage 1
// receives and runs the head; the recvs must match the sends.
// Issue 11: a weight id swapped for another of the same shape, or bound
// twice, passes every shape check; the binding order catches it.
TEST(PlanLoad, WeightsAreBoundOnceInOrder) {
  // The embedding table and the LM head are both [8, 4].
  EXPECT_EQ(loadError([](json &p) {
              p["programs"][0]["steps"][0]["weights"] = {5};
              p["programs"][0]["steps"][5]["weights"] = {0};
            }),
            "PLAN: programs[0].steps[0].weights: weight 5 ('head') is bound before weight 0 "
            "('embed'); steps bind a program's weights in order (a swapped weight id?)");
  // The experts' gate stack [2, 3, 4] in place of the up stack.
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["steps"][3]["weights"] = {2, 2, 4}; }),
            "PLAN: programs[0].steps[3].weights: weight 2 ('e.{e}.w1') is already bound by "
            "step 3; only a tied embedding table is shared (with the LM head), or a "
            "recomputed step's");
  EXPECT_EQ(loadError([](json &p) { p["programs"][0]["steps"][5]["weights"] = {0}; }),
            "PLAN: programs[0].weights: weight 5 ('head') is bound by no step");
  // Tied embeddings: the LM head reuses the embedding table.
  EXPECT_EQ(loadError([](json &p) {
              p["programs"][0]["steps"][5]["weights"] = {0};
              p["programs"][0]["weights"].erase(5);
            }),
            "");
}

TEST(PlanLoad, InputsComeFromTheStepsThePlanNames) {
  // The steps as moec linked them, then edited without relinking: each
  // input's "in_from" no longer names the step that last wrote it.
  auto edited = [](const std::function<void(json &)> &edit) {
    json plan = minimalPlan();
    linkPlan(plan);
    edit(plan["programs"][0]["steps"]);
    return loadMessage(sealPlanText(plan.dump()));
  };
  EXPECT_EQ(edited([](json &) {}), "");
  // A weightless step duplicated: the LM head reads the copy's output.
  EXPECT_EQ(edited([](json &steps) { steps.insert(steps.begin() + 4, steps[4]); }),
            "PLAN: programs[0].steps[6].in_from: input 0 (buffer 9) was last written by step 5, "
            "but the plan says by step 4: a step dropped, duplicated or moved");
  // A step that rewrites a buffer moved before its reader's producer... and
  // an input that names the program's input for a computed buffer.
  EXPECT_EQ(edited([](json &steps) { steps[1]["in_from"][0] = -1; }),
            "PLAN: programs[0].steps[1].in_from: input 0 (buffer 2) was last written by step 0, "
            "but the plan says by the program's input: a step dropped, duplicated or moved");
  EXPECT_EQ(edited([](json &steps) { steps[4]["in_from"] = {3, 2}; }),
            "PLAN: programs[0].steps[4].in_from: expected one entry per input (3) but got 2");
  EXPECT_EQ(edited([](json &steps) { steps[4].erase("in_from"); }),
            "PLAN: programs[0].steps[4].in_from: missing");
}

TEST(PlanLoad, PipelineStages) {
  json plan = minimalPlan();
  json first = plan["programs"][0], second = first;
  first["stage"] = 0;
  first["logits"] = -1;
  first["steps"] = {step("embedding", {0}, {0}, {2}), step("send", {2}, {}, {})};
  first["weights"] = {first["weights"][0]}; // each stage holds the weights it binds
  second["weights"] = {second["weights"][5]};
  second["stage"] = 1;
  second["inputs"]["tokens"] = -1;
  second["steps"] = {step("recv", {}, {}, {9}), step("linear", {9}, {0}, {10}, {{"head", true}})};
  plan["programs"] = {first, second};
  plan["world_size"] = 2;
  plan["degrees"]["pp"] = 2;
  plan["stage_begin"] = {0, 1};
  // Each rank's slices (moec writes them for every plan of several ranks).
  auto slice = [](const char *name) {
    return json{{"name", name},     {"global_shape", {8, 4}}, {"offset", {0, 0}},
                {"shape", {8, 4}}, {"dtype", "F32"},         {"bytes", 128}};
  };
  plan["ranks"][0]["weights"] = {slice("embed")};
  json rank1 = plan["ranks"][0];
  rank1["rank"] = 1;
  rank1["program"] = 1;
  rank1["coords"]["pp"] = 1;
  rank1["weights"] = {slice("head")};
  plan["ranks"].push_back(rank1);
  std::string path = writePlan(plan);
  Plan loaded = Plan::load(path);
  EXPECT_EQ(loaded.programOf(1).stage, 1);
  EXPECT_EQ(loaded.programOf(0).logitsBuffer, -1);
  EXPECT_EQ(loaded.stageRank(0, 1), 1);

  // A second recv (of width 2) that no send matches; the head still reads
  // what the first recv wrote.
  plan["programs"][1]["steps"] = {step("recv", {}, {}, {3}), step("recv", {}, {}, {9}),
                                  step("linear", {9}, {0}, {10}, {{"head", true}})};
  std::ofstream(path) << planText(plan);
  std::string message;
  try {
    Plan::load(path);
  } catch (const InputError &e) {
    message = e.what();
  }
  fs::remove(path);
  EXPECT_EQ(message, path + ": programs[1]: its recvs from stage 0 (widths [2, 4]) differ from "
                            "the sends of programs[0] (widths [4])");

  // A decode entry of stage 0 only: every entry runs on every stage.
  plan["programs"][1]["steps"] = {step("recv", {}, {}, {9}),
                                  step("linear", {9}, {0}, {10}, {{"head", true}})};
  json decode = plan["programs"][0];
  decode["entry"] = "decode";
  plan["programs"][0]["entry"] = plan["programs"][1]["entry"] = "prefill";
  plan["programs"].push_back(decode);
  plan["schedule"] = {{"prefill", "prefill"}, {"decode", "decode"}};
  std::ofstream(path) << planText(plan);
  message.clear();
  try {
    Plan::load(path);
  } catch (const InputError &e) {
    message = e.what();
  }
  fs::remove(path);
  EXPECT_EQ(message, path + ": programs: entry 'decode' has programs for 1 of the 2 stages");
}
