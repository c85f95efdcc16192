// A zeroed block of host memory that is freed with its owner: what the CPU
// device's buffers (HostMemory) and the runtime's own copies of weights
// (RankWeights) are made of.
#pragma once

#include <cstddef>
#include <utility>

namespace moert {

/// Small blocks come from the heap, cleared. From kMappedBytes on, a block
/// is anonymous memory, cleared and made resident by the kernel when it is
/// made, starting at a 2 MiB boundary and marked for transparent huge
/// pages (a hint the kernel may refuse): a training run's buffers,
/// optimizer states and weight copies are gigabytes, and 4 KiB pages each
/// faulted in by memset took most of `moert train`'s start.
class HostBlock {
public:
  static constexpr size_t kMappedBytes = size_t(4) << 20;

  HostBlock() = default;
  /// `bytes` zeroed bytes, aligned to at least 256; throws std::bad_alloc.
  explicit HostBlock(size_t bytes);
  HostBlock(HostBlock &&o) noexcept
      : ptr(std::exchange(o.ptr, nullptr)), mapped(std::exchange(o.mapped, 0)) {}
  HostBlock &operator=(HostBlock &&o) noexcept {
    std::swap(ptr, o.ptr);
    std::swap(mapped, o.mapped);
    return *this;
  }
  HostBlock(const HostBlock &) = delete;
  HostBlock &operator=(const HostBlock &) = delete;
  ~HostBlock() { reset(); }

  void *get() const { return ptr; }
  /// Frees the block now.
  void reset();

private:
  void *ptr = nullptr;
  size_t mapped = 0; // the mapping's length; 0: from the heap
};

} // namespace moert
