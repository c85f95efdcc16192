// A device's memory as the runtime sees it: the device interface's memory
// half (the other half is StepKernels: a step's kernels by kernel id).
// Addresses are host pointers on the CPU and device pointers on CUDA; the
// program's buffers and KV caches (RankProgram.h) are allocated through it,
// the batch goes in and the logits come out through it, and the collective
// protocols (Collectives.h) read and copy through it.
#pragma once

#include "Collectives.h"
#include "moert/HostBlock.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace moert {

class DeviceMemory : public collectives::Memory {
public:
  /// `bytes` zero-filled bytes, 256-byte aligned, valid until released or
  /// while the memory lives.
  virtual void *allocate(int64_t bytes) = 0;
  /// Gives back an allocation of `bytes` bytes.
  virtual void release(void *device, int64_t bytes) = 0;
  /// `bytes` bytes of host memory into device memory, ordered before the
  /// kernels launched after it.
  virtual void write(void *device, const void *host, int64_t bytes) = 0;
  /// Bytes allocated and not released.
  int64_t allocatedBytes() const { return allocated; }

protected:
  int64_t allocated = 0;
};

/// Host memory: the CPU device's.
class HostMemory final : public DeviceMemory {
public:
  void *allocate(int64_t bytes) override;
  void release(void *device, int64_t bytes) override;
  void write(void *device, const void *host, int64_t bytes) override;
  void read(void *host, const void *device, int64_t bytes) override;
  void copy2d(void *dst, int64_t dstPitch, const void *src, int64_t srcPitch, int64_t width,
              int64_t height) override;

private:
  std::vector<HostBlock> blocks;
};

} // namespace moert
