#include "DeviceMemory.h"

#include "moert/Error.h"

#include <cstring>

namespace moert {

void *HostMemory::allocate(int64_t bytes) {
  if (bytes < 0)
    runtimeError("host memory: allocation of {} bytes", bytes);
  // (std::bad_alloc from the block: moert says "out of memory: ... do not
  // fit this machine".)
  blocks.emplace_back(static_cast<size_t>(bytes));
  allocated += bytes;
  return blocks.back().get();
}

void HostMemory::release(void *device, int64_t bytes) {
  for (auto &b : blocks)
    if (b.get() == device && device) {
      b.reset();
      allocated -= bytes;
      return;
    }
}

void HostMemory::write(void *device, const void *host, int64_t bytes) {
  if (bytes > 0 && device != host)
    std::memmove(device, host, static_cast<size_t>(bytes));
}

void HostMemory::read(void *host, const void *device, int64_t bytes) {
  if (bytes > 0 && host != device)
    std::memmove(host, device, static_cast<size_t>(bytes));
}

void HostMemory::copy2d(void *dst, int64_t dstPitch, const void *src, int64_t srcPitch,
                        int64_t width, int64_t height) {
  for (int64_t r = 0; r < height; ++r)
    std::memmove(static_cast<char *>(dst) + r * dstPitch,
                 static_cast<const char *>(src) + r * srcPitch, static_cast<size_t>(width));
}

} // namespace moert
