// Device memory of the CUDA driver: the arena the driver's own pieces come
// from (weights, scratch, RoPE tables, the batch's index arrays), and the
// device memory (DeviceMemory) the program's buffers and KV caches are
// allocated in and the batch, the logits and the collectives copy through.
#pragma once

#include "../DeviceMemory.h"
#include "CudaApi.h"

#include "moert/Error.h"

#include <cstdint>
#include <vector>

namespace moert::cuda {

/// One allocation, sub-allocated in 256-byte aligned pieces.
class Arena {
public:
  void reserve(int64_t bytes) { size += align(bytes); }
  void allocate(const cuda::Api &api) {
    if (size)
      check(api.cuMemAlloc(&base, static_cast<size_t>(size)), "cuMemAlloc (the plan's arena)");
  }
  CUdeviceptr take(int64_t bytes) {
    CUdeviceptr p = base + static_cast<CUdeviceptr>(used);
    used += align(bytes);
    if (used > size)
      runtimeError("CUDA arena: {} bytes taken of {}", used, size);
    return p;
  }
  void release(const cuda::Api &api) {
    if (base)
      api.cuMemFree(base);
    base = 0;
  }
  int64_t bytes() const { return size; }

private:
  static int64_t align(int64_t n) { return (n + 255) / 256 * 256; }
  CUdeviceptr base = 0;
  int64_t size = 0, used = 0;
};

/// Device memory: allocations of their own (cuMemAlloc, zero-filled),
/// copies on the device's stream.
class Memory final : public DeviceMemory {
public:
  void bind(const cuda::Api &a, CUstream s) {
    api = &a;
    stream = s;
  }
  /// Frees every allocation (before the context goes).
  void release() {
    for (CUdeviceptr p : blocks)
      if (p)
        api->cuMemFree(p);
    blocks.clear();
  }
  void *allocate(int64_t bytes) override {
    if (bytes <= 0)
      return nullptr;
    CUdeviceptr p = 0;
    check(api->cuMemAlloc(&p, static_cast<size_t>(bytes)), "cuMemAlloc (the program's memory)");
    blocks.push_back(p);
    allocated += bytes;
    check(api->cuMemsetD8Async(p, 0, static_cast<size_t>(bytes), stream), "cuMemsetD8Async");
    return reinterpret_cast<void *>(static_cast<uintptr_t>(p));
  }
  void release(void *device, int64_t bytes) override {
    for (CUdeviceptr &p : blocks)
      if (p && p == address(device)) {
        api->cuMemFree(p);
        p = 0;
        allocated -= bytes;
        return;
      }
  }
  void write(void *device, const void *host, int64_t bytes) override {
    if (bytes <= 0)
      return;
    check(api->cuMemcpyHtoDAsync(address(device), host, static_cast<size_t>(bytes), stream),
          "cuMemcpyHtoDAsync");
  }
  void read(void *host, const void *device, int64_t bytes) override {
    if (bytes <= 0)
      return;
    check(api->cuMemcpyDtoHAsync(host, address(device), static_cast<size_t>(bytes), stream),
          "cuMemcpyDtoHAsync (collective)");
    check(api->cuStreamSynchronize(stream), "cuStreamSynchronize (collective)");
  }
  void copy2d(void *dst, int64_t dstPitch, const void *src, int64_t srcPitch, int64_t width,
              int64_t height) override {
    if (width <= 0 || height <= 0)
      return;
    CUDA_MEMCPY2D copy{};
    copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    copy.srcDevice = address(src);
    copy.srcPitch = static_cast<size_t>(srcPitch);
    copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    copy.dstDevice = address(dst);
    copy.dstPitch = static_cast<size_t>(dstPitch);
    copy.WidthInBytes = static_cast<size_t>(width);
    copy.Height = static_cast<size_t>(height);
    check(api->cuMemcpy2DAsync(&copy, stream), "cuMemcpy2DAsync (collective)");
  }

private:
  static CUdeviceptr address(const void *p) {
    return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p));
  }
  const cuda::Api *api = nullptr;
  CUstream stream = nullptr;
  std::vector<CUdeviceptr> blocks;
};

} // namespace moert::cuda
