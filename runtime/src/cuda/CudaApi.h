// The CUDA driver API, cuBLAS and NCCL, loaded at run time with dlopen: a
// moert built with the CUDA toolkit starts, and runs CPU plans, on a machine
// without a GPU or a driver; their absence is an error only when a CUDA plan
// is run. The toolkit's headers give the types; no CUDA library is linked.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <nccl.h>

#include <string>

namespace moert::cuda {

#define MOERT_CU_FUNCTIONS(X)                                                             \
  X(cuInit) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetAttribute)  \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent)              \
  X(cuModuleLoad) X(cuModuleUnload) X(cuModuleGetFunction) X(cuFuncGetAttribute)       \
  X(cuLaunchKernel) X(cuMemAlloc) X(cuMemFree) X(cuMemcpyHtoD) X(cuMemcpyDtoH)             \
  X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpy2DAsync) X(cuMemsetD8Async) X(cuStreamCreate)           \
  X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamBeginCapture) X(cuStreamEndCapture)  \
  X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphExecDestroy) X(cuGraphDestroy)           \
  X(cuGetErrorString) X(cuMemGetInfo)

#define MOERT_NCCL_FUNCTIONS(X)                                                           \
  X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclCommSplit) X(ncclCommDestroy)               \
  X(ncclAllReduce) X(ncclAllGather) X(ncclBroadcast) X(ncclSend) X(ncclRecv)               \
  X(ncclGroupStart) X(ncclGroupEnd) X(ncclGetErrorString) X(ncclCommGetAsyncError)

#define MOERT_LT_FUNCTIONS(X)                                                             \
  X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) \
  X(cublasLtMatmulDescSetAttribute) X(cublasLtMatrixLayoutCreate)                           \
  X(cublasLtMatrixLayoutDestroy) X(cublasLtMatmulPreferenceCreate)                          \
  X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute)               \
  X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)

/// cuBLASLt (libcublasLt.so.13), for the FP8 block-scaled GEMMs on sm_90
/// (docs/cuda.md, "FP8 weights"): loaded on first use only.
struct LtApi {
#define MOERT_DECLARE(name) decltype(&::name) name = nullptr;
  MOERT_LT_FUNCTIONS(MOERT_DECLARE)
#undef MOERT_DECLARE
  /// The loaded library, or null with `why` saying what dlopen/dlsym said
  /// (the caller falls back to the dequantising GEMMs).
  static const LtApi *get(std::string &why);
};

/// cuBLAS entry points (typed by hand: the headers overload some of them).
using CublasCreate = cublasStatus_t (*)(cublasHandle_t *);
using CublasDestroy = cublasStatus_t (*)(cublasHandle_t);
using CublasSetStream = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                        int, int, int, const void *, const void *, cudaDataType,
                                        int, const void *, cudaDataType, int, const void *,
                                        void *, cudaDataType, int, cublasComputeType_t,
                                        cublasGemmAlgo_t);
using CublasGemmStridedBatchedEx = cublasStatus_t (*)(
    cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
    const void *, cudaDataType, int, long long, const void *, cudaDataType, int, long long,
    const void *, void *, cudaDataType, int, long long, int, cublasComputeType_t,
    cublasGemmAlgo_t);

struct Api {
#define MOERT_DECLARE(name) decltype(&::name) name = nullptr;
  MOERT_CU_FUNCTIONS(MOERT_DECLARE)
  MOERT_NCCL_FUNCTIONS(MOERT_DECLARE)
#undef MOERT_DECLARE
  CublasCreate cublasCreate = nullptr;
  CublasDestroy cublasDestroy = nullptr;
  CublasSetStream cublasSetStream = nullptr;
  CublasGemmEx cublasGemmEx = nullptr;
  CublasGemmStridedBatchedEx cublasGemmStridedBatchedEx = nullptr;
  bool hasNccl = false;

  /// Loads libcuda, libcublas and (when `nccl`) libnccl once; InputError
  /// naming the library and what dlopen said when one is missing, e.g.
  /// "this plan runs on CUDA but the CUDA driver library libcuda.so.1 cannot
  /// be loaded (...): run it on a machine with an NVIDIA GPU and driver".
  static const Api &get(bool nccl);
};

/// Throws RuntimeError "<what>: <CUDA error string>" unless `r` is success.
void check(CUresult r, const char *what);
void check(cublasStatus_t r, const char *what);
void check(ncclResult_t r, const char *what);

} // namespace moert::cuda
