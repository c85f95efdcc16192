// Units of PlanLayout: the rank slice lists of multi-rank plans (with
// weights_of_rank replicas), the whole tensors of single-rank plans, and one
// malformed field per check, each message naming the plan and the field.
#include "moert/Error.h"
#include "moert/PlanSeal.h"
#include "moert/PlanLayout.h"

#include "gtest/gtest.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <unistd.h>

using namespace moert;
namespace fs = std::filesystem;

namespace {

const char *kHeader = R"("format": "moe-plan", "version": 4,
  "model": {"model_type": "mixtral", "source": "/m/config.json"},
  "degrees": {"dp": 2, "tp": 2},)";

const char *kSlices = R"([
  {"name": "w", "global_shape": [5, 4], "offset": [0, 0], "shape": [3, 4], "dtype": "F32",
   "bytes": 48},
  {"name": "n", "global_shape": [4], "offset": [0], "shape": [4], "dtype": "BF16", "bytes": 8,
   "primary": false}])";

std::string writePlan(const std::string &body) {
  std::string path = (fs::temp_directory_path() / "moert-layout-XXXXXX").string();
  int fd = ::mkstemp(path.data());
  EXPECT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path) << sealPlanText(std::string("{") + kHeader + body + "}");
  return path;
}

std::string loadError(const std::string &body) {
  std::string path = writePlan(body);
  std::string message;
  try {
    PlanLayout::load(path);
  } catch (const InputError &e) {
    message = e.what();
    message.replace(0, path.size(), "PLAN");
  }
  fs::remove(path);
  return message;
}

std::string multiRank(const std::string &slices) {
  return std::string(R"("world_size": 3, "ranks": [{"rank": 0, "weights": )") + slices +
         R"(}, {"rank": 1, "weights": []}, {"rank": 2, "weights_of_rank": 0}])";
}

} // namespace

TEST(PlanLayout, MultiRankSlices) {
  std::string path = writePlan(multiRank(kSlices));
  PlanLayout layout = PlanLayout::load(path);
  fs::remove(path);
  EXPECT_EQ(layout.worldSize, 3);
  EXPECT_EQ(layout.modelType, "mixtral");
  EXPECT_EQ(layout.source, "/m/config.json");
  EXPECT_EQ(layout.degrees.at("tp"), 2);
  ASSERT_EQ(layout.ranks.size(), 3u);
  ASSERT_EQ(layout.ranks[0].size(), 2u);
  EXPECT_EQ(layout.ranks[0][0].shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(layout.ranks[0][0].globalShape, (std::vector<int64_t>{5, 4}));
  EXPECT_TRUE(layout.ranks[0][0].primary);
  EXPECT_FALSE(layout.ranks[0][1].primary);
  EXPECT_EQ(layout.ranks[0][1].dtype, DType::BF16);
  EXPECT_TRUE(layout.ranks[1].empty());
  ASSERT_EQ(layout.ranks[2].size(), 2u); // a replica of rank 0: copies only
  EXPECT_FALSE(layout.ranks[2][0].primary);
}

TEST(PlanLayout, SingleRankExpandsExpertStacks) {
  std::string path = writePlan(R"("world_size": 1, "ranks": [{"rank": 0}],
    "weights": [{"name": "e.{e}.w", "shape": [3, 2, 4], "dtype": "F16", "bytes": 48, "experts": 3},
                {"name": "n", "shape": [4], "dtype": "F32", "bytes": 16}])");
  PlanLayout layout = PlanLayout::load(path);
  fs::remove(path);
  ASSERT_EQ(layout.ranks.size(), 1u);
  ASSERT_EQ(layout.ranks[0].size(), 4u);
  EXPECT_EQ(layout.ranks[0][2].name, "e.2.w");
  EXPECT_EQ(layout.ranks[0][2].globalShape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(layout.ranks[0][2].offset, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(layout.ranks[0][3].name, "n");
  EXPECT_TRUE(layout.ranks[0][3].primary);
}

TEST(PlanLayout, BadFieldsAreNamed) {
  EXPECT_EQ(loadError(multiRank(R"([{"name": "w", "global_shape": [5, 4], "offset": [3, 0],
      "shape": [3, 4], "dtype": "F32", "bytes": 48}])")),
            "PLAN: ranks[0].weights[0].shape: box at offset [3, 0] of shape [3, 4] runs past "
            "global_shape [5, 4]");
  EXPECT_EQ(loadError(multiRank(R"([{"name": "w", "global_shape": [5, 4], "offset": [0, 0],
      "shape": [3, 4], "dtype": "F32", "bytes": 47}])")),
            "PLAN: ranks[0].weights[0].bytes: expected 48 (shape x dtype size) but got 47");
  EXPECT_EQ(loadError(multiRank(R"([{"name": "w", "global_shape": [5, 4], "offset": [0],
      "shape": [3, 4], "dtype": "F32", "bytes": 48}])")),
            "PLAN: ranks[0].weights[0].shape: offset [0] and shape [3, 4] must have the rank of "
            "global_shape [5, 4]");
  EXPECT_EQ(loadError(multiRank(R"([{"name": "w", "global_shape": [5, 4], "offset": [0, 0],
      "shape": [3, 4], "dtype": "I32", "bytes": 48}])")),
            "PLAN: ranks[0].weights[0].dtype: unsupported dtype 'I32' (expected F32, BF16, F16 or "
            "F8_E4M3)");
  EXPECT_EQ(loadError(R"("world_size": 2, "ranks": [{"rank": 0, "weights_of_rank": 1},
      {"rank": 1, "weights": []}])"),
            "PLAN: ranks[0].weights_of_rank: expected an earlier rank with a weights list but "
            "got 1");
  EXPECT_EQ(loadError(R"("world_size": 2, "ranks": [{"rank": 0, "weights": []}])"),
            "PLAN: ranks: expected world_size 2 entries but got 1");
}
