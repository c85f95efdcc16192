// The CPU execution layer for emitted CUDA kernels (test infrastructure
// only; README.md). Force-included (`-include cuda_host.h`) into a .cu file
// that moec emitted, it lets g++ compile the same source as C++:
// __global__/__device__/__shared__ become plain C++ (shared memory: static
// thread_local, one copy per host thread, which runs one block at a time),
// and moe_host_launch() runs a grid: blocks one after another, the threads
// of a block as fibers (ucontext) scheduled round-robin, switching only at
// __syncthreads() and warp shuffles. A barrier waits for every live thread
// of the block (or of the warp, for shuffles); a shuffle publishes the
// lane's value, waits for the warp, reads the source lane's value and waits
// again, so all 32 lanes exchange values exactly as a warp does.
//
// Every emitted kernel has a trampoline `<kernel>__host(const unsigned long
// long *args)` (under MOE_HOST_EMULATION) that casts the table's 8-byte
// arguments to the kernel's parameter types; moe_host_launch() takes it.
#pragma once
#define MOE_HOST_EMULATION 1

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <memory>
#include <vector>

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
struct float4 {
  float x, y, z, w;
};
struct uint2 {
  unsigned x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static thread_local
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
// Round-to-nearest single operations that the CUDA compiler never fuses
// into an FMA; on the host, plain float arithmetic (no -ffp-contract here).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }

namespace moe_host {

using Trampoline = void (*)(const unsigned long long *);

struct Fiber {
  ucontext_t ctx;
  std::unique_ptr<char[]> stack;
  uint3 tid;
  bool done = false;
};

/// The block being run on this host thread.
struct Block {
  std::vector<Fiber> fibers;
  ucontext_t sched;
  int cur = 0;
  unsigned nthreads = 0, live = 0;
  unsigned barGen = 0, barCount = 0;
  std::vector<unsigned> warpGen, warpCount, warpLive;
  std::vector<unsigned long long> lanes; // shuffle values, one per thread
  uint3 blockIdx;
  dim3 gridDim, blockDim;
  Trampoline kernel = nullptr;
  const unsigned long long *args = nullptr;
};

constexpr size_t kStackBytes = 128 * 1024;

inline Block &block() {
  static thread_local Block b;
  return b;
}
inline unsigned linearTid() { return static_cast<unsigned>(block().cur); }

inline void yield() {
  Block &b = block();
  swapcontext(&b.fibers[b.cur].ctx, &b.sched);
}

inline void syncthreads() {
  Block &b = block();
  const unsigned gen = b.barGen;
  if (++b.barCount >= b.live) {
    b.barCount = 0;
    ++b.barGen;
    return;
  }
  while (b.barGen == gen)
    yield();
}

inline void syncwarp() {
  Block &b = block();
  const unsigned w = linearTid() / 32, gen = b.warpGen[w];
  if (++b.warpCount[w] >= b.warpLive[w]) {
    b.warpCount[w] = 0;
    ++b.warpGen[w];
    return;
  }
  while (b.warpGen[w] == gen)
    yield();
}

template <class T> T shuffle(T v, int srcLane) {
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  Block &b = block();
  const unsigned t = linearTid(), w = t / 32;
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  b.lanes[t] = bits;
  syncwarp();
  unsigned src = w * 32 + (static_cast<unsigned>(srcLane) & 31u);
  if (src >= b.nthreads)
    src = t;
  const unsigned long long got = b.lanes[src];
  syncwarp();
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}

inline void fiberEntry() {
  Block &b = block();
  b.kernel(b.args);
  b.fibers[b.cur].done = true;
  // uc_link returns to the scheduler.
}

/// Runs the grid: every block in turn, each with blockDim threads.
inline void launch(Trampoline kernel, dim3 grid, dim3 blockDim, const unsigned long long *args) {
  Block &b = block();
  const unsigned n = blockDim.x * blockDim.y * blockDim.z;
  if (n == 0 || n > 1024) {
    std::fprintf(stderr, "moe_host_launch: block of %u threads\n", n);
    std::abort();
  }
  if (b.fibers.size() < n) {
    b.fibers.resize(n);
    for (Fiber &f : b.fibers)
      if (!f.stack)
        f.stack.reset(new char[kStackBytes]);
  }
  const unsigned warps = (n + 31) / 32;
  b.warpGen.assign(warps, 0);
  b.warpCount.assign(warps, 0);
  b.warpLive.assign(warps, 0);
  b.lanes.assign(n, 0);
  b.nthreads = n;
  b.gridDim = grid;
  b.blockDim = blockDim;
  b.kernel = kernel;
  b.args = args;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        b.blockIdx = uint3{bx, by, bz};
        b.barGen = b.barCount = 0;
        for (unsigned w = 0; w < warps; ++w) {
          b.warpCount[w] = 0;
          b.warpLive[w] = std::min(32u, n - w * 32);
        }
        b.live = n;
        for (unsigned i = 0; i < n; ++i) {
          Fiber &f = b.fibers[i];
          f.done = false;
          f.tid = uint3{i % blockDim.x, (i / blockDim.x) % blockDim.y,
                        i / (blockDim.x * blockDim.y)};
          getcontext(&f.ctx);
          f.ctx.uc_stack.ss_sp = f.stack.get();
          f.ctx.uc_stack.ss_size = kStackBytes;
          f.ctx.uc_link = &b.sched;
          makecontext(&f.ctx, fiberEntry, 0);
        }
        while (b.live > 0) {
          for (unsigned i = 0; i < n; ++i) {
            if (b.fibers[i].done)
              continue;
            b.cur = static_cast<int>(i);
            swapcontext(&b.sched, &b.fibers[i].ctx);
            if (b.fibers[i].done) {
              // A finished thread no longer takes part in barriers.
              --b.live;
              const unsigned w = i / 32;
              --b.warpLive[w];
              if (b.barCount > 0 && b.barCount >= b.live) {
                b.barCount = 0;
                ++b.barGen;
              }
              if (b.warpCount[w] > 0 && b.warpCount[w] >= b.warpLive[w]) {
                b.warpCount[w] = 0;
                ++b.warpGen[w];
              }
            }
          }
        }
      }
}

} // namespace moe_host

#define threadIdx (moe_host::block().fibers[moe_host::block().cur].tid)
#define blockIdx (moe_host::block().blockIdx)
#define blockDim (moe_host::block().blockDim)
#define gridDim (moe_host::block().gridDim)
#define __syncthreads() moe_host::syncthreads()
#define __syncwarp(...) moe_host::syncwarp()
template <class T> inline T __shfl_sync(unsigned, T v, int src) { return moe_host::shuffle(v, src); }
template <class T> inline T __shfl_xor_sync(unsigned, T v, int mask) {
  return moe_host::shuffle(v, static_cast<int>(moe_host::linearTid() % 32) ^ mask);
}
template <class T> inline T __shfl_down_sync(unsigned, T v, unsigned delta) {
  const unsigned lane = moe_host::linearTid() % 32;
  return moe_host::shuffle(v, static_cast<int>(lane + delta < 32 ? lane + delta : lane));
}
template <class T> inline T __shfl_up_sync(unsigned, T v, unsigned delta) {
  const unsigned lane = moe_host::linearTid() % 32;
  return moe_host::shuffle(v, static_cast<int>(lane >= delta ? lane - delta : lane));
}
// Fibers of a block never run concurrently: plain read-modify-write.
template <class T> inline T atomicAdd(T *p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}

// Defined here (the header is included into exactly one file, the kernels'
// shared library): the entry point the test driver dlsym()s.
extern "C" void moe_host_launch(moe_host::Trampoline kernel, unsigned gx, unsigned gy,
                                       unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                       const unsigned long long *args) {
  moe_host::launch(kernel, dim3{gx, gy, gz}, dim3{bx, by, bz}, args);
}
