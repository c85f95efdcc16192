// The CUDA device's class (CudaDevice.cpp: the device's interface and its
// steps; CudaDeviceSetup.cpp: opening the device, its module, arena,
// weights and rope tables). Internal to runtime/src/cuda.
#pragma once

#include "../Device.h"
#include "../InputFile.h"
#include "../PlanChecks.h"
#include "CudaApi.h"
#include "CudaGemm.h"
#include "CudaMemory.h"
#include "NcclComm.h"

#include "moert/Error.h"
#include "moert/RankWeights.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <limits>
#include <set>
#include <tuple>

namespace moert::cuda {

/// Steps of at most this many tokens are captured into CUDA graphs.
constexpr int64_t kGraphMaxTokens = 64;
/// FP8 expert stacks are dequantised for their GEMMs as many experts at a
/// time as this many bytes hold in f32 (at least one expert;
/// MOERT_CUDA_DEQUANT_BYTES sets another budget).
constexpr int64_t kDequantBudget = int64_t(256) << 20;
/// GEMMs of at most this many rows (per expert block) with an FP8 weight
/// run as moe_gemv_fp8 (its MOE_GEMV_ROWS), which reads the weight once
/// and dequantises it on the fly (MOERT_CUDA_FP8_GEMV=0: never).
constexpr int kFp8GemvRows = 8;
/// cuBLASLt's workspace for the FP8 block-scaled GEMMs (what NVIDIA
/// recommends on Hopper).
constexpr int64_t kLtWorkspace = int64_t(32) << 20;
/// Rows of an FP8 GEMM that cuBLASLt does not run, quantised at a time.
constexpr int64_t kQuantRows = 256;

class CudaDevice final : public Device {

  /// What the device holds for each program of the rank (one per entry, the
  /// rank's own first): its kernel table and module, scratch, rope tables,
  /// grouped GEMM steps and captured graphs, and the executor's memory of it.
  struct Entry {
    const PlanProgram *program = nullptr;
    const KernelTable *table = nullptr;
    CUmodule module = nullptr;
    std::map<std::string, CUfunction> functions;
    CUfunction packBf16 = nullptr;   ///< moe_pack_bf16 of the module
    CUfunction dequantFp8 = nullptr; ///< moe_dequant_fp8 of the module
    CUfunction gemvFp8 = nullptr;    ///< moe_gemv_fp8 of the module
    CUfunction quantFp8 = nullptr;   ///< moe_quant_fp8 of the module
    std::vector<CUdeviceptr> scratch, ropeCos, ropeSin;
    std::vector<bool> grouped; ///< per step: dropless expert GEMMs
    bool graphsEnabled = false;
    std::map<std::pair<int64_t, int64_t>, CUgraphExec> graphs;
    const RankProgram *memory = nullptr; ///< the executor's: buffers, KV caches
  };

  /// An FP8 (e4m3, block-scaled) weight: stored at one byte per element,
  /// its scales beside it, dequantised (moe_dequant_fp8) into dequantScratch
  /// before each GEMM that multiplies it, as many experts at a time as the
  /// scratch holds (docs/quantization.md, "On CUDA").
  struct Fp8Weight {
    CUdeviceptr scales = 0;
    int64_t experts = 1, rows = 0, cols = 0;
    int64_t scaleRows = 0, scaleStride = 0; ///< an expert's scales: rows x stride floats
    int64_t blockRows = 0, blockCols = 0, rowOrigin = 0, colOrigin = 0;
    int64_t chunk = 1; ///< experts dequantised at a time
    /// Its GEMMs may run on cuBLASLt (ltEnabled; 128 x 128 blocks from the
    /// box's corner, dimensions multiples of 16): its scales are then held
    /// with cuBLASLt's BLK128x128_32F row stride (the column blocks rounded
    /// up to 4), which the dequantising kernels read too.
    bool lt = false;
  };

public:
  ~CudaDevice() override;

  std::string name() const override;

  void open(const Plan &plan, int64_t rankIndex, const Checkpoint &ckpt, Comm &comm) override;

  DeviceMemory &memory() override;
  /// Captured graphs replay fixed addresses: the staging is reserved.
  RankProgram::Staging staging() const override;
  /// The collectives go over NCCL.
  Comm *communicator() override;

  void bind(const RankProgram &p) override;

  /// The batch's per-token / per-logit-row index arrays (the kernels read
  /// them), then the steps: small steps (decode) replay a graph captured
  /// per (T, R); large ones (prefill) run directly, with the dropless
  /// expert GEMMs grouped over counted rows.
  void run(const RankProgram &p, const Batch &batch, const std::function<void()> &steps) override;

  void synchronize() override;
  bool synchronous() const override;

  int64_t weightBytes() const override;
  int64_t loadedWeightBytes() const override;
  /// The arena: weights, scratch, rope tables, the batch's index arrays.
  int64_t ownPeakBytes() const override;

private:
  //===--------------------------------------------------------------------===//
  // Setup
  //===--------------------------------------------------------------------===//

  /// The entry of the executor's program `p`.
  Entry &entryOf(const RankProgram &p);

  void readTable(Entry &e, const PlanProgram &p);

  void selectDevice();

  /// The plan carries its kernels (source and fatbin, docs/cuda.md): they
  /// are written to a private temporary directory for cuModuleLoad and
  /// removed once loaded (the fake driver of the tests builds the source
  /// found beside the fatbin). True when the module has moe_pack_bf16.
  bool loadModule(Entry &e);

  /// The driver's own pieces, in one arena (the program's buffers and KV
  /// caches are RankProgram's).
  void allocate();

  /// Weights that are the B operand of a GEMM in a 16-bit type (`widened`)
  /// and weights that a kernel reads as stored (`stored`); FP8 weights'
  /// dequantising scratch (`dequantBytes`).
  void weightUse(std::set<size_t> &widened, std::set<size_t> &stored);

  /// The FP8 block-scaled weights among the bound ones (`fp8`): their
  /// geometry, checked to be dequantisable by moe_dequant_fp8.
  void findFp8(const RankWeights &host);

  /// Whether FP8 GEMMs quantise activations (fp8Dynamic) and go to cuBLASLt
  /// (ltEnabled), and which weights can (Fp8Weight::lt); loads cuBLASLt.
  void chooseLt();

  void uploadWeights(const RankWeights &host);

  /// cos/sin of each rope table, as the CPU backend computes them: the
  /// parameters are those of the steps that use the table.
  void uploadRopeTables(Entry &e);

  //===--------------------------------------------------------------------===//
  // Steps
  //===--------------------------------------------------------------------===//

  /// A step's launches: kernels from the table (rows: the step's, T or R)
  /// and cuBLAS GEMMs.
  int64_t compute(size_t i, const PlanStep &s, int64_t rows) override;

  void exchanged(size_t, const PlanStep &s, int64_t most) override;

  static uint64_t address(const void *p);

  /// A parameter's value (indices were checked when the plan was read).
  uint64_t resolve(const KernelRef &ref, int64_t T, int64_t R) const;

  void launch(const KernelLaunch &l, int64_t rows, int64_t T, int64_t R);

  static cudaDataType weightType(const std::string &dtype);

  /// Experts [e0, e1) of FP8 weight `f` (stored at `q`) dequantised into
  /// dequantScratch, as bf16 or f32, expert e at (e - first) experts' values
  /// (element stride rows x cols).
  void dequantise(const Fp8Weight &f, CUdeviceptr q, int64_t e0, int64_t e1, int64_t first,
                  bool bf16);

  /// C (+)= A W^T for m <= kFp8GemvRows rows of each block (at most its
  /// count), W the block's expert of FP8 weight `f`: moe_gemv_fp8, with
  /// bf16 products when `bf16`.
  void gemvFp8(const KernelGemm &g, const Fp8Weight &f, const void *A, int64_t lda, int64_t sa,
               void *C, int m, int k, bool bf16, int64_t T, int64_t R);

  /// moe_quant_fp8 over `blocks` blocks of `rows` rows of A (row stride
  /// lda, block stride sa; rows past counts[b] skipped when `counts`):
  /// e4m3 bytes into q with their scales into s (one block), or, with y,
  /// the values they stand for as f32 (block stride sy).
  void quantise(const void *A, int64_t lda, int64_t sa, int blocks, int rows, int k,
                uint64_t counts, bool bf16, CUdeviceptr q, CUdeviceptr s, CUdeviceptr y,
                int64_t sy);

  /// C (+)= A W^T with sm_90's numbers where cuBLASLt does not run it: per
  /// block and at most kQuantRows rows at a time, the rows quantised and
  /// dequantised again (quantScratch), times the block's expert dequantised
  /// to f32, on cuBLAS.
  void gemmQuantised(const KernelGemm &g, const Fp8Weight &f, const void *A, void *C,
                     const std::vector<int> &rows, int k, bool bf16);

  /// C (+)= A W^T on cuBLASLt for FP8 weight `f` (its `lt`): each block's
  /// rows (`rows[b]`, 0: none) quantised by moe_quant_fp8, then
  /// cublasLtMatmul with the weight's 128 x 128 scales and the rows' 1 x 128
  /// ones. False (nothing launched) when cuBLASLt has no algorithm for one
  /// of the blocks: the caller dequantises instead.
  bool gemmLt(const KernelGemm &g, const Fp8Weight &f, const void *A, void *C,
              const std::vector<int> &rows, int k, bool bf16);

  /// A GEMM of the table (C[m, n] (+)= op(A) op(B), row-major: CudaGemm.h).
  /// `groupedStep` >= 0: a dropless expert GEMM of that step, run as a
  /// grouped GEMM over each block's counted rows only (the counts are read
  /// back once per step: such programs are not captured into graphs).
  void gemm(const KernelGemm &g, int64_t T, int64_t R, int64_t groupedStep);

  const Plan *plan = nullptr;
  int64_t rank = 0;
  const PlanProgram *program = nullptr;
  const cuda::Api *api = nullptr;
  CUdevice device = 0;
  CUcontext context = nullptr;
  CUstream stream = nullptr;
  cublasHandle_t blas = nullptr;
  std::unique_ptr<cuda::NcclComm> nccl;
  cuda::Memory memory_;
  std::vector<Entry> entries;
  cuda::Arena arena;
  std::vector<CUdeviceptr> weightPtrs;
  std::vector<CUdeviceptr> weightF32Ptrs; ///< f32 copies of 16-bit GEMM weights (or 0)
  bool bf16Gemm = false;         ///< BF16 weights multiply bf16-rounded activations
  CUdeviceptr packScratch = 0;   ///< the rounded A operand
  int64_t packBytes = 0;
  std::set<size_t> widened, stored;      ///< weightUse()
  std::map<size_t, Fp8Weight> fp8;       ///< by program weight index
  CUdeviceptr dequantScratch = 0;
  bool fp8Gemv = false; ///< the module has moe_gemv_fp8, MOERT_CUDA_FP8_GEMV is not 0
  int64_t dequantBytes = 0;
  int sm = 0; ///< the GPU's compute capability, major * 10 + minor
  /// The plan's FP8 GEMMs multiply activations quantised per 1 x 128
  /// (fp8_activations "dynamic"; docs/quantization.md) ...
  bool fp8Dynamic = false;
  /// ... on cuBLASLt's block-scaled FP8 GEMM where it runs them (sm_90,
  /// MOERT_CUDA_FP8_GEMM is not 0, libcublasLt loads).
  bool ltEnabled = false;
  const cuda::LtApi *lt = nullptr;
  cublasLtHandle_t ltHandle = nullptr;
  CUdeviceptr ltActivations = 0, ltScales = 0, ltWorkspace = 0; ///< one block's
  /// Quantised-and-dequantised f32 rows: every block's of a GEMV, or
  /// kQuantRows of one block (gemmQuantised).
  CUdeviceptr quantScratch = 0;
  int64_t quantBytes = 0;
  int64_t ltRows = 0, ltK = 0; ///< the most rows and depth of a block
  /// cuBLASLt's answer per (rows, n, k, ldc, accumulate): an algorithm, or none.
  std::map<std::tuple<int, int, int, int, bool>, std::optional<cublasLtMatmulAlgo_t>> ltAlgos;
  CUdeviceptr batchSequence = 0, batchPosition = 0, batchLogitRows = 0, batchArgmax = 0;
  int64_t weightsOnDevice = 0, loaded = 0;
  std::vector<int32_t> stepCounts;   // the counts of the grouped step in flight
  int64_t countsStep = -1;
  int64_t exchangedRows = -1; // most rows of a block received by the last all_to_all (-1: none)
  struct Current {
    Entry *entry = nullptr;
    int64_t T = 0, R = 0;
    bool capturing = false;
  } current; ///< the forward pass in flight
};

} // namespace moert::cuda
