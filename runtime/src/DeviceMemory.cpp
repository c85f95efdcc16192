#include "DeviceMemory.h"

#include "moert/Error.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace moert {

void HostMemory::Free::operator()(void *p) const { std::free(p); }

void *HostMemory::allocate(int64_t bytes) {
  if (bytes < 0)
    runtimeError("host memory: allocation of {} bytes", bytes);
  const size_t size = (static_cast<size_t>(bytes) + 255) / 256 * 256;
  void *p = size ? std::aligned_alloc(256, size) : nullptr;
  if (size && !p)
    throw std::bad_alloc(); // moert: "out of memory: ... do not fit this machine"
  if (p)
    std::memset(p, 0, size);
  blocks.emplace_back(p);
  allocated += bytes;
  return p;
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
