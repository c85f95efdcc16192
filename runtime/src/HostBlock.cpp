#include "moert/HostBlock.h"
#include "moert/Parallel.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

namespace moert {
namespace {

constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kPopulateChunk = size_t(64) << 20; // (a multiple of kHugePage)

/// `size` (a multiple of the page size) zeroed and resident bytes starting
/// at a 2 MiB boundary, or null. Only whole aligned 2 MiB ranges can be
/// huge pages; the tail past the last one stays in small pages (no memory
/// beyond `size` is touched).
void *mapZeroed(size_t size) {
  const size_t span = size + kHugePage; // room to align the start
  void *p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start)
    ::munmap(p, aligned - start);
  if (const size_t tail = start + span - (aligned + size))
    ::munmap(reinterpret_cast<void *>(aligned + size), tail);
  auto *block = reinterpret_cast<char *>(aligned);
#ifdef MADV_HUGEPAGE
  ::madvise(block, size, MADV_HUGEPAGE);
#endif
  // Populated now, as the heap's memset did: the first step's time stays
  // the step's, and memory the kernel cannot give is refused here (ENOMEM:
  // null, which the caller reports) rather than at a later first touch.
  // By all threads, a chunk each at a time: a VM's first touch of memory
  // its host has not backed yet runs at ~1 GB/s a thread (AMD EPYC VM, 8
  // GiB: 9.5 s on one thread, 3-8 s on two), and moert train populates
  // gigabytes of masters, moments and buffers before its first step.
  const int64_t chunks = static_cast<int64_t>((size + kPopulateChunk - 1) / kPopulateChunk);
  std::atomic<int> failure{0}; // an errno of MADV_POPULATE_WRITE
  parallelFor(chunks, [&](int64_t c0, int64_t c1) {
    char *begin = block + static_cast<size_t>(c0) * kPopulateChunk;
    const size_t length = std::min(size, static_cast<size_t>(c1) * kPopulateChunk) -
                          static_cast<size_t>(c0) * kPopulateChunk;
#ifdef MADV_POPULATE_WRITE
    if (failure.load() == 0 && ::madvise(begin, length, MADV_POPULATE_WRITE) == 0)
      return;
    int expected = 0;
    failure.compare_exchange_strong(expected, errno);
    if (failure.load() != EINVAL) // (EINVAL: a kernel without it, before Linux 5.14)
      return;
#endif
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    for (size_t i = 0; i < length; i += page)
      static_cast<volatile char *>(begin)[i] = 0;
  });
  if (failure.load() != 0 && failure.load() != EINVAL) {
    ::munmap(block, size);
    return nullptr;
  }
  return block;
}

} // namespace

HostBlock::HostBlock(size_t bytes) {
  if (bytes == 0)
    return;
  if (bytes >= kMappedBytes) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t size = (bytes + page - 1) / page * page;
    ptr = mapZeroed(size);
    mapped = size;
  } else {
    const size_t size = (bytes + 255) / 256 * 256;
    ptr = std::aligned_alloc(256, size);
    if (ptr)
      std::memset(ptr, 0, size);
  }
  if (!ptr) {
    mapped = 0;
    throw std::bad_alloc();
  }
}

void HostBlock::reset() {
  if (!ptr)
    return;
  if (mapped)
    ::munmap(ptr, mapped);
  else
    std::free(ptr);
  ptr = nullptr;
  mapped = 0;
}

} // namespace moert
