// The token data readers of moert train (moert/TokenData.h).
#include "moert/Error.h"
#include "moert/Npy.h"
#include "moert/TokenData.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

using namespace moert;

namespace {

std::string tempPath(const char *name) {
  return ::testing::TempDir() + "/loss_test_" + name;
}

TEST(TokenDataTest, NpyOfEveryIntegerWidth) {
  const std::string path = tempPath("ids.npy");
  writeNpy(path, {5}, std::vector<int64_t>{0, 7, 250, 3, 1});
  EXPECT_EQ(readTokenData(path, 251), (std::vector<int32_t>{0, 7, 250, 3, 1}));
  writeNpy(path, {3}, std::vector<int32_t>{4, 5, 6});
  EXPECT_EQ(readTokenData(path, 7), (std::vector<int32_t>{4, 5, 6}));
  try {
    readTokenData(path, 6);
    FAIL() << "an id outside the vocabulary was accepted";
  } catch (const InputError &e) {
    EXPECT_NE(std::string(e.what()).find("token 2 is id 6, outside the model's vocabulary [0, 6)"),
              std::string::npos)
        << e.what();
  }
  writeNpy(path, {2}, std::vector<int32_t>{-1, 2});
  EXPECT_THROW(readTokenData(path, 10), InputError);
  writeNpy(path, {1, 2}, std::vector<float>{1, 2});
  EXPECT_THROW(readTokenData(path, 10), InputError);
  std::remove(path.c_str());
}

TEST(TokenDataTest, WindowsShareOneToken) {
  EXPECT_EQ(windowCount(0, 4), 0);
  EXPECT_EQ(windowCount(1, 4), 0);
  EXPECT_EQ(windowCount(4, 4), 0);
  EXPECT_EQ(windowCount(5, 4), 1);
  EXPECT_EQ(windowCount(9, 4), 2);
  EXPECT_EQ(windowCount(12, 4), 2);
}

} // namespace

namespace {

TEST(TokenDataTest, WindowOrderIsASeededPermutationPerPass) {
  const std::vector<int64_t> identity = moert::windowOrder(10, -1, 3);
  for (int64_t i = 0; i < 10; ++i)
    EXPECT_EQ(identity[static_cast<size_t>(i)], i);
  const std::vector<int64_t> a = moert::windowOrder(1000, 7, 0);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i)
    ASSERT_EQ(sorted[static_cast<size_t>(i)], i) << "a permutation";
  EXPECT_EQ(a, moert::windowOrder(1000, 7, 0)); // the seed and the pass alone decide it
  EXPECT_NE(a, moert::windowOrder(1000, 7, 1));
  EXPECT_NE(a, moert::windowOrder(1000, 8, 0));
  EXPECT_NE(a, sorted);
}

} // namespace
