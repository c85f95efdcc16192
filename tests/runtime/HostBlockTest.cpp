// HostBlock (the CPU device's buffers and the runtime's weight copies):
// small and mapped blocks are zeroed and writable at the alignment the
// kernels assume, a mapped block starts at a 2 MiB boundary (where huge
// pages can back it), moves hand the memory over, and reset frees it.
#include "moert/HostBlock.h"

#include "../../runtime/src/DeviceMemory.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

using namespace moert;

namespace {

bool allZero(const void *p, size_t bytes) {
  const auto *b = static_cast<const unsigned char *>(p);
  return std::all_of(b, b + bytes, [](unsigned char c) { return c == 0; });
}

/// This process's resident anonymous memory (kB), from /proc/self/status.
int64_t residentAnonKb() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("RssAnon:", 0) == 0)
      return std::stoll(line.substr(8));
  return -1;
}

} // namespace

TEST(HostBlockTest, SmallAndMappedBlocksAreZeroedAndAligned) {
  for (size_t bytes : {size_t(1), size_t(1000), HostBlock::kMappedBytes - 1,
                       HostBlock::kMappedBytes, HostBlock::kMappedBytes + 12345}) {
    HostBlock block(bytes);
    ASSERT_NE(block.get(), nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(block.get()) % 256, 0u) << bytes;
    if (bytes >= HostBlock::kMappedBytes)
      EXPECT_EQ(reinterpret_cast<uintptr_t>(block.get()) % (2 << 20), 0u) << bytes;
    EXPECT_TRUE(allZero(block.get(), bytes)) << bytes;
    std::memset(block.get(), 0xab, bytes); // every byte writable
    EXPECT_EQ(static_cast<unsigned char *>(block.get())[bytes - 1], 0xab);
  }
  HostBlock empty(0);
  EXPECT_EQ(empty.get(), nullptr);
}

TEST(HostBlockTest, MovesHandTheMemoryOverAndResetFreesIt) {
  const size_t bytes = 64 << 20;
  const int64_t before = residentAnonKb();
  HostBlock a(bytes);
  void *p = a.get();
  std::memset(p, 1, bytes);
  HostBlock b(std::move(a));
  EXPECT_EQ(a.get(), nullptr);
  EXPECT_EQ(b.get(), p);
  HostBlock c;
  c = std::move(b);
  EXPECT_EQ(c.get(), p);
  EXPECT_GE(residentAnonKb() - before, 60 << 10); // touched: resident
  c.reset();
  EXPECT_EQ(c.get(), nullptr);
  EXPECT_LT(residentAnonKb() - before, 4 << 10); // unmapped: gone
}

TEST(HostBlockTest, MoreThanTheAddressSpaceIsBadAlloc) {
  // (1 PiB: more than any x86-64 process can map, whatever the overcommit
  // policy; moert reports std::bad_alloc as "out of memory".)
  EXPECT_THROW(HostBlock(size_t(1) << 50), std::bad_alloc);
  HostMemory memory;
  EXPECT_THROW(memory.allocate(int64_t(1) << 50), std::bad_alloc);
  EXPECT_EQ(memory.allocatedBytes(), 0);
}

TEST(HostBlockTest, HostMemoryCountsAndReleasesItsBlocks) {
  HostMemory memory;
  void *small = memory.allocate(100);
  void *large = memory.allocate(int64_t(8) << 20);
  EXPECT_EQ(memory.allocatedBytes(), 100 + (int64_t(8) << 20));
  EXPECT_TRUE(allZero(small, 100));
  EXPECT_TRUE(allZero(large, size_t(8) << 20));
  memory.release(large, int64_t(8) << 20);
  EXPECT_EQ(memory.allocatedBytes(), 100);
  EXPECT_EQ(memory.allocate(0), nullptr);
}
