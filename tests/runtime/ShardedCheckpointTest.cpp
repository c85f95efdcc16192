// Units of the sharded checkpoint: CRC32C against its published check
// values, the box copies, and the coverage checker (every element of a
// tensor in exactly one box), each failure a message naming the tensor and
// the files.
#include "moert/Error.h"
#include "moert/ShardedCheckpoint.h"

#include "gtest/gtest.h"

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

using namespace moert;

namespace {

std::string coverError(const std::vector<int64_t> &shape, const std::vector<BoxRef> &boxes) {
  try {
    checkBoxCover("ckpt/manifest.json", "w", shape, boxes);
  } catch (const InputError &e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST(Crc32c, CheckValues) {
  // RFC 3720 (iSCSI) B.4 and the common "123456789" check value.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xff), inc(32);
  std::iota(inc.begin(), inc.end(), 0);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c(inc.data(), inc.size()), 0x46DD794Eu);
}

TEST(Crc32c, IncrementalEqualsWhole) {
  std::string text(1000, '\0');
  for (size_t i = 0; i < text.size(); ++i)
    text[i] = static_cast<char>(i * 131 + 7);
  uint32_t whole = crc32c(text.data(), text.size());
  for (size_t cut : {0, 1, 7, 8, 13, 999, 1000})
    EXPECT_EQ(crc32c(text.data() + cut, text.size() - cut, crc32c(text.data(), cut)), whole);
  std::string flipped = text;
  flipped[500] ^= 1;
  EXPECT_NE(crc32c(flipped.data(), flipped.size()), whole);
}

TEST(Boxes, CopyOutAndInRoundTrip) {
  const std::vector<int64_t> shape{3, 4, 5};
  std::vector<float> global(60), back(60, -1.f);
  std::iota(global.begin(), global.end(), 0.f);
  // Split along every dimension into two boxes each: 8 boxes.
  for (int64_t a : {0, 2})
    for (int64_t b : {0, 1})
      for (int64_t c : {0, 3}) {
        std::vector<int64_t> offset{a, b, c};
        std::vector<int64_t> box{a ? 1 : 2, b ? 3 : 1, c ? 2 : 3};
        std::vector<float> part(box[0] * box[1] * box[2]);
        copyBoxOut(reinterpret_cast<const char *>(global.data()), shape, offset, box, 4,
                   reinterpret_cast<char *>(part.data()));
        EXPECT_EQ(part[0], global[(a * 4 + b) * 5 + c]);
        copyBoxIn(reinterpret_cast<const char *>(part.data()), shape, offset, box, 4,
                  reinterpret_cast<char *>(back.data()));
      }
  EXPECT_EQ(back, global);
}

TEST(BoxCover, ExactCoverPasses) {
  EXPECT_EQ(coverError({251, 64}, {{{0, 0}, {128, 64}, "a"}, {{128, 0}, {123, 64}, "b"}}), "");
  EXPECT_EQ(coverError({64, 64}, {{{0, 0}, {64, 32}, "a"}, {{0, 32}, {64, 32}, "b"}}), "");
  EXPECT_EQ(coverError({}, {{{}, {}, "a"}}), "");
  EXPECT_EQ(coverError({0, 4}, {}), "");
}

TEST(BoxCover, GapIsNamed) {
  EXPECT_EQ(coverError({251, 64}, {{{0, 0}, {128, 64}, "a"}, {{128, 0}, {122, 64}, "b"}}),
            "ckpt/manifest.json: tensor 'w': its 2 boxes cover 16000 of its 16064 elements "
            "(shape [251, 64])");
  EXPECT_NE(coverError({4}, {}).find("its 0 boxes cover 0 of its 4 elements"), std::string::npos);
}

TEST(BoxCover, OverlapIsNamed) {
  // Same volume as the whole, but two boxes share rows and one row is missing.
  std::string error =
      coverError({4, 2}, {{{0, 0}, {2, 2}, "rank-0"}, {{1, 0}, {2, 2}, "rank-1"}});
  EXPECT_EQ(error, "ckpt/manifest.json: tensor 'w': box at offset [1, 0] of shape [2, 2] in "
                   "rank-1 overlaps the box at offset [0, 0] of shape [2, 2] in rank-0");
}

TEST(BoxCover, OutsideIsNamed) {
  EXPECT_EQ(coverError({4, 2}, {{{0, 0}, {4, 2}, "a"}, {{3, 0}, {2, 2}, "b"}}),
            "ckpt/manifest.json: tensor 'w': box at offset [3, 0] of shape [2, 2] in b lies "
            "outside its shape [4, 2]");
  EXPECT_NE(coverError({4, 2}, {{{0}, {4}, "a"}}).find("lies outside"), std::string::npos);
}
