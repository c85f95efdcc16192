#include "CudaApi.h"

#include "moert/Error.h"

#include <dlfcn.h>

#include <mutex>

namespace moert::cuda {
namespace {

#define MOERT_STR2(x) #x
#define MOERT_STR(x) MOERT_STR2(x)

/// dlopen the first of `names` that loads; the error names them all.
void *openLibrary(std::initializer_list<const char *> names, const char *role,
                  const char *hint) {
  std::string tried;
  for (const char *name : names) {
    if (void *handle = dlopen(name, RTLD_NOW | RTLD_LOCAL))
      return handle;
    const char *why = dlerror();
    tried += fmt::format("{}{}", tried.empty() ? "" : "; ",
                         why ? std::string(why) : std::string(name) + ": not found");
  }
  inputError("this plan runs on CUDA but {} cannot be loaded ({}): {}", role, tried, hint);
}

template <typename F> void symbol(void *library, const char *name, F &slot, const char *role) {
  slot = reinterpret_cast<F>(dlsym(library, name));
  if (!slot)
    inputError("{} has no symbol '{}' (a CUDA 13 toolkit/driver is expected)", role, name);
}

Api load(bool nccl) {
  Api api;
  const char *driver = "the CUDA driver library";
  void *cu = openLibrary({"libcuda.so.1", "libcuda.so"}, driver,
                         "run it on a machine with an NVIDIA GPU and its driver, or on the "
                         "CPU with --device cpu");
  // The macros of cuda.h map names to their versioned symbols (cuMemAlloc ->
  // cuMemAlloc_v2); MOERT_STR expands them before quoting.
#define MOERT_LOAD_CU(name) symbol(cu, MOERT_STR(name), api.name, driver);
  MOERT_CU_FUNCTIONS(MOERT_LOAD_CU)
#undef MOERT_LOAD_CU
  const char *blas = "cuBLAS";
  void *cublas = openLibrary({"libcublas.so.13", "libcublas.so"}, blas,
                             "install the CUDA 13 toolkit's cuBLAS or put it on LD_LIBRARY_PATH");
  symbol(cublas, "cublasCreate_v2", api.cublasCreate, blas);
  symbol(cublas, "cublasDestroy_v2", api.cublasDestroy, blas);
  symbol(cublas, "cublasSetStream_v2", api.cublasSetStream, blas);
  symbol(cublas, "cublasGemmEx", api.cublasGemmEx, blas);
  symbol(cublas, "cublasGemmStridedBatchedEx", api.cublasGemmStridedBatchedEx, blas);
  if (nccl) {
    const char *role = "NCCL";
    void *lib = openLibrary({"libnccl.so.2", "libnccl.so"}, role,
                            "multi-rank CUDA plans need NCCL 2 (libnccl.so.2)");
#define MOERT_LOAD_NCCL(name) symbol(lib, MOERT_STR(name), api.name, role);
    MOERT_NCCL_FUNCTIONS(MOERT_LOAD_NCCL)
#undef MOERT_LOAD_NCCL
    api.hasNccl = true;
  }
  return api;
}

const Api *loaded = nullptr; // set once get() succeeded

std::string errorText(const Api &api, CUresult r) {
  const char *text = nullptr;
  if (!api.cuGetErrorString || api.cuGetErrorString(r, &text) != CUDA_SUCCESS || !text)
    return fmt::format("CUresult {}", static_cast<int>(r));
  return text;
}

} // namespace

const Api &Api::get(bool nccl) {
  static std::mutex mutex;
  static Api api;
  std::lock_guard<std::mutex> lock(mutex);
  if (!loaded || (nccl && !api.hasNccl)) {
    api = load(nccl);
    if (CUresult r = api.cuInit(0); r != CUDA_SUCCESS)
      inputError("this plan runs on CUDA but the driver finds no usable GPU (cuInit: {})",
                 errorText(api, r));
    loaded = &api;
  }
  return api;
}

const LtApi *LtApi::get(std::string &why) {
  static std::mutex mutex;
  static LtApi api;
  static std::string error;
  static bool tried = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (!tried) {
    tried = true;
    try {
      const char *role = "cuBLASLt";
      void *lib = openLibrary({"libcublasLt.so.13", "libcublasLt.so"}, role,
                              "install the CUDA 13 toolkit's cuBLASLt");
#define MOERT_LOAD_LT(name) symbol(lib, MOERT_STR(name), api.name, role);
      MOERT_LT_FUNCTIONS(MOERT_LOAD_LT)
#undef MOERT_LOAD_LT
    } catch (const RuntimeError &e) {
      error = e.what();
      api.cublasLtMatmul = nullptr;
    }
  }
  why = error;
  return api.cublasLtMatmul ? &api : nullptr;
}

void check(CUresult r, const char *what) {
  if (r != CUDA_SUCCESS)
    runtimeError("{}: {}", what, loaded ? errorText(*loaded, r) : std::string("CUDA error"));
}

void check(cublasStatus_t r, const char *what) {
  if (r != CUBLAS_STATUS_SUCCESS)
    runtimeError("{}: cuBLAS status {}", what, static_cast<int>(r));
}

void check(ncclResult_t r, const char *what) {
  if (r == ncclSuccess)
    return;
  runtimeError("{}: {}", what,
               loaded && loaded->ncclGetErrorString ? loaded->ncclGetErrorString(r) : "NCCL error");
}

} // namespace moert::cuda
