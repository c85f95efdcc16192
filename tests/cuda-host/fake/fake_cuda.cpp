// A fake CUDA driver and cuBLAS that execute on the host (test
// infrastructure only; README.md). One shared library exports every driver
// and cuBLAS entry point moert's CUDA device loads (runtime/src/cuda/
// CudaApi.cpp), by the versioned names of the CUDA 13 headers (this file
// includes them, so the signatures are the toolkit's). Installed under the
// names the device dlopens (libcuda.so.1, libcublas.so.13, ...) as symlinks
// to one file, so both names load one object and share its state.
//
// - Device memory is host memory: a CUdeviceptr is the pointer's value.
// - cuModuleLoad(X.fatbin) compiles X.cu (beside it) for the host with the
//   CPU execution layer (tests/cuda-host/cuda_host.h) and dlopens it;
//   kernels are the source's `<name>__host` trampolines, run by its
//   moe_host_launch().
// - Streams execute in order at once (synchronous); while one captures, its
//   launches, copies and GEMMs are recorded (argument values copied) into a
//   graph that cuGraphLaunch replays.
// - cuBLAS GemmEx / GemmStridedBatchedEx: column-major reference loops with
//   cuBLAS' argument checks and type combinations.
#include <cublas_v2.h>
#include <cuda.h>

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#ifndef MOE_FAKE_CUDA_DEFAULT_CXX
#define MOE_FAKE_CUDA_DEFAULT_CXX "c++ -std=c++17 -O1 -shared -fPIC -x c++"
#endif

namespace {

using Op = std::function<void()>;

struct Graph {
  std::vector<Op> ops;
};
struct Stream {
  bool capturing = false;
  bool invalidated = false; // an illegal call during capture
  Graph *graph = nullptr;
};
struct Module;
struct Kernel {
  Module *module = nullptr;
  using Trampoline = void (*)(const unsigned long long *);
  Trampoline fn = nullptr;
  int params = 0;
  unsigned maxThreads = 1024;
  std::string name;
};
struct Module {
  void *handle = nullptr;
  void (*launch)(Kernel::Trampoline, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                 const unsigned long long *) = nullptr;
  std::map<std::string, Kernel *> kernels;
};
struct Handle {
  Stream *stream = nullptr;
};

std::mutex mutex; // guards `cache`
std::map<std::string, std::string> cache; // source path -> compiled .so
int initialized = 0;
int contextRefs = 0;
int dummyContext;

/// What ran, printed at exit with MOE_FAKE_CUDA_STATS=1 (tests check that
/// graphs were captured and replayed).
struct Stats {
  long launches = 0, gemms = 0, captures = 0, graphLaunches = 0, modules = 0;
  ~Stats() {
    if (std::getenv("MOE_FAKE_CUDA_STATS"))
      std::fprintf(stderr,
                   "fake-cuda: %ld module(s), %ld kernel launch(es), %ld GEMM call(s), %ld "
                   "graph(s) captured, %ld graph launch(es)\n",
                   modules, launches, gemms, captures, graphLaunches);
  }
} stats;

bool verbose() {
  static bool v = std::getenv("MOE_FAKE_CUDA_VERBOSE") != nullptr;
  return v;
}

/// A call that real CUDA forbids while `s` captures: invalidates the capture.
bool illegalDuringCapture(Stream *s) {
  if (s && s->capturing) {
    s->invalidated = true;
    return true;
  }
  return false;
}

/// Runs `op` now or records it into the capturing stream's graph.
CUresult enqueue(Stream *s, Op op) {
  if (s && s->capturing) {
    s->graph->ops.push_back(std::move(op));
    return CUDA_SUCCESS;
  }
  op();
  return CUDA_SUCCESS;
}

std::string readText(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Compiles `source` with $MOE_FAKE_CUDA_CXX into a cached shared object
/// ($MOE_FAKE_CUDA_CACHE, else /tmp/moe-fake-cuda-<uid>), keyed by the
/// source text and the command.
std::string compile(const std::string &source, std::string &error) {
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(source); it != cache.end())
    return it->second;
  const char *env = std::getenv("MOE_FAKE_CUDA_CXX");
  std::string cxx = env && *env ? env : MOE_FAKE_CUDA_DEFAULT_CXX;
  std::string text = readText(source);
  if (text.empty()) {
    error = source + ": cannot read the kernels' source";
    return "";
  }
  const char *dirEnv = std::getenv("MOE_FAKE_CUDA_CACHE");
  std::string dir = dirEnv && *dirEnv ? dirEnv : "/tmp/moe-fake-cuda-" + std::to_string(getuid());
  mkdir(dir.c_str(), 0755);
  char key[32];
  std::snprintf(key, sizeof key, "%016zx", std::hash<std::string>()(cxx + '\n' + text));
  std::string so = dir + "/" + key + ".so";
  struct stat st;
  if (stat(so.c_str(), &st) != 0) {
    std::string tmp = so + "." + std::to_string(getpid()) + ".tmp";
    std::string command = cxx + " '" + source + "' -o '" + tmp + "'";
    if (verbose())
      std::fprintf(stderr, "fake-cuda: %s\n", command.c_str());
    if (std::system(command.c_str()) != 0 || std::rename(tmp.c_str(), so.c_str()) != 0) {
      std::remove(tmp.c_str());
      error = "fake-cuda: host compile failed: " + command;
      return "";
    }
  }
  cache[source] = so;
  return so;
}

/// Parameter count and __launch_bounds__ of each kernel, from the source:
/// the driver knows them from the fatbin's metadata.
void scanKernels(const std::string &text, std::map<std::string, std::pair<int, unsigned>> &out) {
  std::istringstream in(text);
  std::string line;
  const std::string kernelHead = "extern \"C\" __global__ void ";
  const std::string hostHead = "extern \"C\" void ";
  while (std::getline(in, line)) {
    if (line.rfind(kernelHead, 0) == 0) {
      size_t paren = line.find('(');
      std::string head = line.substr(kernelHead.size(), paren - kernelHead.size());
      unsigned bound = 1024;
      if (head.rfind("__launch_bounds__", 0) == 0) {
        bound = static_cast<unsigned>(std::stoul(line.substr(paren + 1)));
        size_t close = line.find(')', paren);
        size_t open = line.find('(', close);
        head = line.substr(close + 2, open - close - 2);
      }
      out[head].second = bound;
    } else if (line.rfind(hostHead, 0) == 0 && line.find("__host(const unsigned long long") !=
                                                    std::string::npos) {
      size_t end = line.find("__host(");
      std::string name = line.substr(hostHead.size(), end - hostHead.size());
      int n = 0;
      for (size_t at = line.find("args["); at != std::string::npos; at = line.find("args[", at + 1))
        ++n;
      out[name].first = n;
      if (!out[name].second)
        out[name].second = 1024;
    }
  }
}

float loadElement(const void *p, cudaDataType t, size_t i) {
  switch (t) {
  case CUDA_R_32F:
    return static_cast<const float *>(p)[i];
  case CUDA_R_16BF: {
    uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t *>(p)[i]) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  case CUDA_R_16F: {
    uint16_t h = static_cast<const uint16_t *>(p)[i];
    uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
      if (man == 0) {
        bits = sign;
      } else { // subnormal
        int e = -1;
        do {
          ++e;
          man <<= 1;
        } while (!(man & 0x400));
        bits = sign | ((127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
      }
    } else if (exp == 31) {
      bits = sign | 0x7f800000u | (man << 13);
    } else {
      bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  default:
    return 0;
  }
}

size_t elementSize(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

/// cuBLAS' checks of a GemmEx call (cublas docs: "CUBLAS_STATUS_INVALID_VALUE
/// if m, n, k < 0, lda/ldb/ldc too small ...", and the table of supported
/// type combinations: A and B of one type; C f32, or A's 16-bit type).
cublasStatus_t checkGemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                         cudaDataType at, int lda, cudaDataType bt, int ldb, cudaDataType ct,
                         int ldc, cublasComputeType_t compute) {
  auto op = [](cublasOperation_t o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T; };
  if (!op(ta) || !op(tb) || m < 0 || n < 0 || k < 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (lda < std::max(1, ta == CUBLAS_OP_N ? m : k) ||
      ldb < std::max(1, tb == CUBLAS_OP_N ? k : n) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  auto known = [](cudaDataType t) {
    return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F;
  };
  if (!known(at) || at != bt || !(ct == CUDA_R_32F || ct == at))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (ct != CUDA_R_32F) // 16-bit outputs are not needed by moert
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return CUBLAS_STATUS_SUCCESS;
}

void gemmOne(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
             const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt, int ldb,
             float beta, float *C, int ldc) {
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      float sum = 0;
      for (int l = 0; l < k; ++l) {
        size_t ai = ta == CUBLAS_OP_N ? i + static_cast<size_t>(l) * lda
                                      : l + static_cast<size_t>(i) * lda;
        size_t bi = tb == CUBLAS_OP_N ? l + static_cast<size_t>(j) * ldb
                                      : j + static_cast<size_t>(l) * ldb;
        sum += loadElement(A, at, ai) * loadElement(B, bt, bi);
      }
      float &c = C[i + static_cast<size_t>(j) * ldc];
      // beta == 0: C is not read (it may hold NaN), as cuBLAS.
      c = beta == 0.0f ? alpha * sum : alpha * sum + beta * c;
    }
}

} // namespace

extern "C" {

//===----------------------------------------------------------------------===//
// Driver API
//===----------------------------------------------------------------------===//

CUresult cuInit(unsigned int flags) {
  if (flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  initialized = 1;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  *count = 1;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal != 0)
    return CUDA_ERROR_INVALID_DEVICE;
  *device = 0;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice device) {
  if (device != 0)
    return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "%s", "moe fake CUDA device (host)");
  return CUDA_SUCCESS;
}

// The device's compute capability as major * 10 + minor: 90 (sm_90), or
// MOE_FAKE_CUDA_SM (e.g. 80: the tests of the device's sm_80 paths). The
// fake cuBLASLt (fake_cublaslt.cpp) answers for this device too.
int moe_fake_cuda_sm() {
  static int sm = [] {
    const char *v = std::getenv("MOE_FAKE_CUDA_SM");
    return v && std::atoi(v) > 0 ? std::atoi(v) : 90;
  }();
  return sm;
}

CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attrib, CUdevice device) {
  if (device != 0)
    return CUDA_ERROR_INVALID_DEVICE;
  switch (attrib) {
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = moe_fake_cuda_sm() / 10; break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = moe_fake_cuda_sm() % 10; break;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 132; break;
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
  case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *value = 49152; break;
  default: *value = 0; break;
  }
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (device != 0)
    return CUDA_ERROR_INVALID_DEVICE;
  ++contextRefs;
  *ctx = reinterpret_cast<CUcontext>(&dummyContext);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
  if (device != 0 || contextRefs == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  --contextRefs;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  return !ctx || ctx == reinterpret_cast<CUcontext>(&dummyContext) ? CUDA_SUCCESS
                                                                   : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult cuMemGetInfo(size_t *free, size_t *total) {
  *free = size_t(64) << 30;
  *total = size_t(80) << 30;
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
  switch (error) {
  case CUDA_SUCCESS: *text = "no error"; break;
  case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; break;
  case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; break;
  case CUDA_ERROR_NOT_INITIALIZED: *text = "initialization error"; break;
  case CUDA_ERROR_INVALID_CONTEXT: *text = "invalid device context"; break;
  case CUDA_ERROR_INVALID_HANDLE: *text = "invalid resource handle"; break;
  case CUDA_ERROR_NOT_FOUND: *text = "named symbol not found"; break;
  case CUDA_ERROR_INVALID_SOURCE: *text = "device kernel image is invalid"; break;
  case CUDA_ERROR_FILE_NOT_FOUND: *text = "file not found"; break;
  case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: *text = "too many resources requested for launch"; break;
  case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
    *text = "operation not permitted when stream is capturing";
    break;
  case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
    *text = "operation failed due to a previous error during capture";
    break;
  case CUDA_ERROR_ILLEGAL_STATE: *text = "illegal state"; break;
  default: *text = "unknown error (fake CUDA)"; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytes) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if (bytes == 0)
    return CUDA_ERROR_INVALID_VALUE;
  void *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!p)
    return CUDA_ERROR_OUT_OF_MEMORY;
  // Fresh device memory holds garbage: poison it (NaN bytes) so that reads of
  // never-written memory show up.
  std::memset(p, 0xff, bytes);
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr dptr) {
  std::free(reinterpret_cast<void *>(dptr));
  return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t bytes) {
  std::memcpy(reinterpret_cast<void *>(dst), src, bytes);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t bytes) {
  std::memcpy(dst, reinterpret_cast<const void *>(src), bytes);
  return CUDA_SUCCESS;
}

// Copies between device memory and pageable host memory cannot be captured
// (CUDA: "operation not permitted when stream is capturing"); moert's host
// buffers are pageable.
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t bytes, CUstream hs) {
  auto *s = reinterpret_cast<Stream *>(hs);
  if (illegalDuringCapture(s))
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  std::memcpy(reinterpret_cast<void *>(dst), src, bytes);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t bytes, CUstream hs) {
  auto *s = reinterpret_cast<Stream *>(hs);
  if (illegalDuringCapture(s))
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  std::memcpy(dst, reinterpret_cast<const void *>(src), bytes);
  return CUDA_SUCCESS;
}

CUresult cuMemcpy2DAsync(const CUDA_MEMCPY2D *c, CUstream hs) {
  auto *s = reinterpret_cast<Stream *>(hs);
  if (c->srcMemoryType != CU_MEMORYTYPE_DEVICE || c->dstMemoryType != CU_MEMORYTYPE_DEVICE) {
    if (illegalDuringCapture(s))
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (c->srcPitch < c->WidthInBytes + c->srcXInBytes && c->Height > 1)
    return CUDA_ERROR_INVALID_VALUE;
  if (c->dstPitch < c->WidthInBytes + c->dstXInBytes && c->Height > 1)
    return CUDA_ERROR_INVALID_VALUE;
  auto base = [](CUmemorytype t, const void *host, CUdeviceptr dev) -> char * {
    return t == CU_MEMORYTYPE_HOST ? const_cast<char *>(static_cast<const char *>(host))
                                   : reinterpret_cast<char *>(dev);
  };
  char *src = base(c->srcMemoryType, c->srcHost, c->srcDevice) + c->srcXInBytes +
              c->srcY * c->srcPitch;
  char *dst = base(c->dstMemoryType, c->dstHost, c->dstDevice) + c->dstXInBytes +
              c->dstY * c->dstPitch;
  const size_t width = c->WidthInBytes, height = c->Height, sp = c->srcPitch, dp = c->dstPitch;
  return enqueue(s, [=] {
    for (size_t r = 0; r < height; ++r)
      std::memcpy(dst + r * dp, src + r * sp, width);
  });
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream hs) {
  auto *p = reinterpret_cast<void *>(dst);
  return enqueue(reinterpret_cast<Stream *>(hs), [=] { std::memset(p, value, n); });
}

CUresult cuStreamCreate(CUstream *stream, unsigned int) {
  *stream = reinterpret_cast<CUstream>(new Stream);
  return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream hs) {
  auto *s = reinterpret_cast<Stream *>(hs);
  if (s && s->capturing)
    return CUDA_ERROR_ILLEGAL_STATE;
  delete s;
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream hs) {
  if (illegalDuringCapture(reinterpret_cast<Stream *>(hs)))
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture(CUstream hs, CUstreamCaptureMode) {
  auto *s = reinterpret_cast<Stream *>(hs);
  if (!s) // the legacy NULL stream cannot capture
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (s->capturing)
    return CUDA_ERROR_ILLEGAL_STATE;
  s->capturing = true;
  s->invalidated = false;
  s->graph = new Graph;
  return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream hs, CUgraph *graph) {
  auto *s = reinterpret_cast<Stream *>(hs);
  if (!s || !s->capturing)
    return CUDA_ERROR_ILLEGAL_STATE;
  s->capturing = false;
  if (s->invalidated) {
    delete s->graph;
    s->graph = nullptr;
    *graph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  *graph = reinterpret_cast<CUgraph>(s->graph);
  s->graph = nullptr;
  ++stats.captures;
  return CUDA_SUCCESS;
}

CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, unsigned long long) {
  if (!graph)
    return CUDA_ERROR_INVALID_VALUE;
  *exec = reinterpret_cast<CUgraphExec>(new Graph(*reinterpret_cast<Graph *>(graph)));
  return CUDA_SUCCESS;
}

CUresult cuGraphLaunch(CUgraphExec exec, CUstream hs) {
  if (!exec)
    return CUDA_ERROR_INVALID_VALUE;
  auto *g = reinterpret_cast<Graph *>(exec);
  ++stats.graphLaunches;
  return enqueue(reinterpret_cast<Stream *>(hs), [g] {
    for (const Op &op : g->ops)
      op();
  });
}

// For the fake NCCL (fake_nccl.cpp, which links this library): whether a
// stream is capturing, and recording one of its operations into the graph
// (run at each replay; `release` frees `arg` with the last copy of the op).
int moe_fake_cuda_capturing(CUstream hs) {
  auto *s = reinterpret_cast<Stream *>(hs);
  return s && s->capturing;
}

CUresult moe_fake_cuda_record(CUstream hs, void (*run)(void *), void *arg,
                              void (*release)(void *)) {
  auto *s = reinterpret_cast<Stream *>(hs);
  if (!s || !s->capturing)
    return CUDA_ERROR_ILLEGAL_STATE;
  std::shared_ptr<void> owned(arg, release);
  s->graph->ops.push_back([run, owned] { run(owned.get()); });
  return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(CUgraphExec exec) {
  delete reinterpret_cast<Graph *>(exec);
  return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph graph) {
  delete reinterpret_cast<Graph *>(graph);
  return CUDA_SUCCESS;
}

CUresult cuModuleLoad(CUmodule *module, const char *fname) {
  if (!initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  std::string path = fname;
  const std::string suffix = ".fatbin";
  struct stat st;
  if (stat(fname, &st) != 0)
    return CUDA_ERROR_FILE_NOT_FOUND;
  if (path.size() < suffix.size() || path.compare(path.size() - suffix.size(), suffix.size(),
                                                  suffix) != 0)
    return CUDA_ERROR_INVALID_SOURCE;
  std::string source = path.substr(0, path.size() - suffix.size()) + ".cu";
  std::string error;
  std::string so = compile(source, error);
  if (so.empty()) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return CUDA_ERROR_INVALID_SOURCE;
  }
  void *handle = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    std::fprintf(stderr, "fake-cuda: %s\n", dlerror());
    return CUDA_ERROR_INVALID_SOURCE;
  }
  auto *m = new Module;
  m->handle = handle;
  m->launch = reinterpret_cast<decltype(m->launch)>(dlsym(handle, "moe_host_launch"));
  if (!m->launch) {
    dlclose(handle);
    delete m;
    return CUDA_ERROR_INVALID_SOURCE;
  }
  std::map<std::string, std::pair<int, unsigned>> shapes;
  scanKernels(readText(source), shapes);
  for (auto &[name, shape] : shapes) {
    auto fn = reinterpret_cast<Kernel::Trampoline>(dlsym(handle, (name + "__host").c_str()));
    if (!fn)
      continue;
    auto *k = new Kernel;
    k->fn = fn;
    k->params = shape.first;
    k->maxThreads = shape.second ? shape.second : 1024;
    k->name = name;
    k->module = m;
    m->kernels[name] = k;
  }
  ++stats.modules;
  *module = reinterpret_cast<CUmodule>(m);
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule module) {
  auto *m = reinterpret_cast<Module *>(module);
  if (!m)
    return CUDA_ERROR_INVALID_HANDLE;
  for (auto &[name, k] : m->kernels)
    delete k;
  dlclose(m->handle);
  delete m;
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule module, const char *name) {
  auto *m = reinterpret_cast<Module *>(module);
  if (!m)
    return CUDA_ERROR_INVALID_HANDLE;
  auto it = m->kernels.find(name);
  if (it == m->kernels.end())
    return CUDA_ERROR_NOT_FOUND;
  *f = reinterpret_cast<CUfunction>(it->second);
  return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int *value, CUfunction_attribute attrib, CUfunction f) {
  auto *k = reinterpret_cast<Kernel *>(f);
  if (!k)
    return CUDA_ERROR_INVALID_HANDLE;
  switch (attrib) {
  case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = static_cast<int>(k->maxThreads); break;
  case CU_FUNC_ATTRIBUTE_NUM_REGS: *value = 32; break;
  default: *value = 0; break;
  }
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned sharedBytes, CUstream hs,
                        void **kernelParams, void **extra) {
  auto *k = reinterpret_cast<Kernel *>(f);
  if (!k)
    return CUDA_ERROR_INVALID_HANDLE;
  if (extra || (k->params > 0 && !kernelParams))
    return CUDA_ERROR_INVALID_VALUE;
  if (!gx || !gy || !gz || !bx || !by || !bz || gy > 65535 || gz > 65535 || bz > 64 ||
      sharedBytes > 49152)
    return CUDA_ERROR_INVALID_VALUE;
  if (static_cast<unsigned long long>(bx) * by * bz > k->maxThreads)
    return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  // The argument values are copied at launch (and at capture), as CUDA does.
  std::vector<unsigned long long> args(static_cast<size_t>(k->params));
  for (int i = 0; i < k->params; ++i)
    std::memcpy(&args[i], kernelParams[i], 8);
  auto launch = k->module->launch;
  auto fn = k->fn;
  if (verbose())
    std::fprintf(stderr, "fake-cuda: launch %s <<<(%u,%u,%u),(%u,%u,%u)>>>\n", k->name.c_str(),
                 gx, gy, gz, bx, by, bz);
  return enqueue(reinterpret_cast<Stream *>(hs), [=] {
    ++stats.launches;
    launch(fn, gx, gy, gz, bx, by, bz, args.data());
  });
}

//===----------------------------------------------------------------------===//
// cuBLAS
//===----------------------------------------------------------------------===//

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
  if (!initialized)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  *handle = reinterpret_cast<cublasHandle_t>(new Handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (!handle)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  delete reinterpret_cast<Handle *>(handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  reinterpret_cast<Handle *>(handle)->stream = reinterpret_cast<Stream *>(stream);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t) {
  if (!handle)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  if (cublasStatus_t s = checkGemm(transa, transb, m, n, k, Atype, lda, Btype, ldb, Ctype, ldc,
                                   computeType))
    return s;
  // Host pointer mode (the default): the scalars are read at the call.
  const float a = *static_cast<const float *>(alpha), b = *static_cast<const float *>(beta);
  auto *c = static_cast<float *>(C);
  if (m == 0 || n == 0)
    return CUBLAS_STATUS_SUCCESS;
  enqueue(reinterpret_cast<Handle *>(handle)->stream, [=] {
    ++stats.gemms;
    gemmOne(transa, transb, m, n, k, a, A, Atype, lda, B, Btype, ldb, b, c, ldc);
  });
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
    int k, const void *alpha, const void *A, cudaDataType Atype, int lda, long long strideA,
    const void *B, cudaDataType Btype, int ldb, long long strideB, const void *beta, void *C,
    cudaDataType Ctype, int ldc, long long strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t) {
  if (!handle)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  if (batchCount < 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (cublasStatus_t s = checkGemm(transa, transb, m, n, k, Atype, lda, Btype, ldb, Ctype, ldc,
                                   computeType))
    return s;
  const float a = *static_cast<const float *>(alpha), b = *static_cast<const float *>(beta);
  if (m == 0 || n == 0 || batchCount == 0)
    return CUBLAS_STATUS_SUCCESS;
  const size_t as = elementSize(Atype), bs = elementSize(Btype);
  enqueue(reinterpret_cast<Handle *>(handle)->stream, [=] {
    ++stats.gemms;
    for (int i = 0; i < batchCount; ++i)
      gemmOne(transa, transb, m, n, k, a, static_cast<const char *>(A) + i * strideA * as, Atype,
              lda, static_cast<const char *>(B) + i * strideB * bs, Btype, ldb, b,
              static_cast<float *>(C) + i * strideC, ldc);
  });
  return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
