// The CUDA device (runtime/src/Device.h): runs one rank's program of a
// `moec --target cuda` plan on a GPU for the executor (moert/RankExecutor.h),
// which owns the program's memory and runs its steps and collectives as for
// the CPU device (so batching, chunked prefill, decode, sampling and the
// multi-rank protocols are shared).
//
// - Libraries are loaded at run time (CudaApi.h): without a GPU or driver a
//   CUDA plan is a clear error and CPU plans run as before.
// - The program's kernel table (docs/cuda.md) drives everything: kernels of
//   the plan's fatbin through cuLaunchKernel, GEMMs through cuBLAS
//   (cublasGemmEx / cublasGemmStridedBatchedEx over [experts, capacity, .]
//   blocks), collectives by the shared protocols (runtime/src/Collectives.h)
//   over NCCL (NcclComm.h: communicators split from one world communicator,
//   bootstrapped through moert::Comm, i.e. MPI).
// - Memory: the program's buffers and KV caches are the executor's
//   (runtime/src/RankProgram.h), allocated on the device's memory
//   (cuda::Memory), which the batch, the logits and the collectives copy
//   through; one arena (cuMemAlloc) holds the driver's own pieces: weights,
//   scratch, rope tables and the batch's index arrays, sized from the plan.
// - A step without host synchronisation (no all_to_all, which reads the
//   exchanged counts) is captured into a CUDA graph per (T, R) and replayed
//   (MOERT_CUDA_GRAPHS=0 turns this off).
//
// Without a GPU it runs end to end on a fake CUDA driver + cuBLAS that
// execute on the host (tests/cuda-host/fake, tests/cuda/fake-e2e-*.test:
// every fixture against the transformers references, graphs on and off,
// chunked prefill, capacity-limited dispatch against the CPU device), and on
// several ranks under mpirun with a fake NCCL over MPI (fake-ranks-*.test:
// dp/ep, tp, pp, tp+ep, chunked, capacity, graphs on and off, against the
// single-rank run); the GPU e2e tests carry the ctest label `gpu`
// (docs/cuda.md).
#include "CudaDevice.h"

namespace moert::cuda {

CudaDevice::~CudaDevice() {
  if (!api)
    return;
  for (Entry &e : entries)
    for (auto &[key, exec] : e.graphs)
      api->cuGraphExecDestroy(exec);
  if (blas)
    api->cublasDestroy(blas);
  if (ltHandle)
    lt->cublasLtDestroy(ltHandle);
  nccl.reset();
  for (Entry &e : entries)
    if (e.module)
      api->cuModuleUnload(e.module);
  memory_.release();
  arena.release(*api);
  if (stream)
    api->cuStreamDestroy(stream);
  if (context)
    api->cuDevicePrimaryCtxRelease(device);
}

std::string CudaDevice::name() const { return "cuda"; }

void CudaDevice::open(const Plan &plan, int64_t rankIndex, const Checkpoint &ckpt, Comm &comm) {
  this->plan = &plan;
  rank = rankIndex;
  program = &plan.programOf(rankIndex);
  // One kernel table, module, scratch and set of graphs per entry; the
  // weights (the entries declare the same) and the batch's index arrays
  // once.
  entries.clear();
  for (const PlanProgram *p : plan.entriesOf(rankIndex)) {
    entries.emplace_back();
    readTable(entries.back(), *p);
  }
  api = &cuda::Api::get(plan.worldSize > 1);
  selectDevice();
  // BF16 weights meet bf16 activations in their GEMMs (the f32 operand is
  // rounded by moe_pack_bf16 first): weights stay as stored, half the
  // memory of widening them. MOERT_CUDA_F32_GEMM=1 widens them to f32
  // instead (the CPU backend's numerics), as do plans without the kernel.
  const char *f32 = std::getenv("MOERT_CUDA_F32_GEMM");
  bf16Gemm = !(f32 && !std::strcmp(f32, "1"));
  for (Entry &e : entries)
    bf16Gemm &= loadModule(e);
  // FP8 GEMMs of a few rows read their weight once (moe_gemv_fp8) unless
  // MOERT_CUDA_FP8_GEMV=0 (or the plan's kernels predate it).
  const char *gemv = std::getenv("MOERT_CUDA_FP8_GEMV");
  fp8Gemv = !(gemv && !std::strcmp(gemv, "0"));
  for (const Entry &e : entries)
    fp8Gemv &= e.gemvFp8 != nullptr;
  // int8 weights are CPU-only (moec refuses them with --target cuda);
  // FP8 ones are dequantised for their GEMMs.
  refuseCpuOnlyWeights(plan, rankIndex, "the CUDA device");
  RankWeights host;
  host.bind(plan, rankIndex, ckpt, [](int64_t) {});
  findFp8(host);
  allocate();
  uploadWeights(host);
  for (Entry &e : entries)
    uploadRopeTables(e);
  if (plan.worldSize > 1) {
    nccl = std::make_unique<cuda::NcclComm>(*api, comm, stream);
    nccl->prepare(plan);
  }
}

DeviceMemory & CudaDevice::memory() { return memory_; }

RankProgram::Staging CudaDevice::staging() const { return RankProgram::Staging::Reserved; }

Comm * CudaDevice::communicator() { return nccl.get(); }

void CudaDevice::bind(const RankProgram &p) {
  Entry &e = entryOf(p);
  e.memory = &p;
  check(api->cuStreamSynchronize(stream), "zero the program's memory");
  // Training programs are not captured: their expert gradients' GEMMs
  // read the counts back.
  e.graphsEnabled = !e.table->hasAllToAll && e.program->labelsBuffer < 0;
  if (const char *g = std::getenv("MOERT_CUDA_GRAPHS"); g && !std::strcmp(g, "0"))
    e.graphsEnabled = false;
}

void CudaDevice::run(const RankProgram &p, const Batch &batch, const std::function<void()> &steps) {
  current = {};
  current.entry = &entryOf(p);
  const int64_t T = batch.size(), R = static_cast<int64_t>(batch.logitRows.size());
  auto upload = [&](CUdeviceptr dst, const std::vector<int32_t> &v) {
    if (!v.empty())
      check(api->cuMemcpyHtoDAsync(dst, v.data(), v.size() * 4, stream), "upload batch");
  };
  upload(batchSequence, batch.slots);
  upload(batchPosition, batch.positions);
  std::vector<int32_t> rows(batch.logitRows.begin(), batch.logitRows.end());
  upload(batchLogitRows, rows);

  countsStep = -1;
  exchangedRows = -1;
  current.T = T;
  current.R = R;
  std::map<std::pair<int64_t, int64_t>, CUgraphExec> &graphs = current.entry->graphs;
  if (!current.entry->graphsEnabled || T == 0 || T > kGraphMaxTokens) {
    steps();
    return;
  }
  auto key = std::make_pair(T, R);
  auto found = graphs.find(key);
  if (found == graphs.end()) {
    current.capturing = true; // no host reads
    check(api->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
          "cuStreamBeginCapture");
    steps();
    CUgraph graph;
    check(api->cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
    CUgraphExec exec;
    check(api->cuGraphInstantiate(&exec, graph, 0), "cuGraphInstantiate");
    api->cuGraphDestroy(graph);
    found = graphs.emplace(key, exec).first;
  }
  check(api->cuGraphLaunch(found->second, stream), "cuGraphLaunch");
}

void CudaDevice::synchronize() { check(api->cuStreamSynchronize(stream), "forward step"); }

bool CudaDevice::synchronous() const { return false; }

int64_t CudaDevice::weightBytes() const { return weightsOnDevice; }

int64_t CudaDevice::loadedWeightBytes() const { return loaded; }

int64_t CudaDevice::ownPeakBytes() const { return arena.bytes(); }

int64_t CudaDevice::compute(size_t i, const PlanStep &s, int64_t rows) {
  const auto &[entry, T, R, capturing] = current;
  if (s.op->has(OpDef::FillsExpertBlocks))
    exchangedRows = -1; // blocks filled from this rank's T tokens (until an all_to_all)
  for (const KernelLaunch &l : entry->table->steps[i].launches) {
    const int64_t launchRows = l.rows == KernelLaunch::Rows::Step ? rows
                               : l.rows == KernelLaunch::Rows::R  ? R
                                                                  : T;
    switch (l.kind) {
    case KernelLaunch::Kind::Collective:
      break; // the loop runs collective steps
    case KernelLaunch::Kind::Gemm:
      gemm(l.gemm, T, R, entry->grouped[i] && !capturing ? static_cast<int64_t>(i) : -1);
      break;
    case KernelLaunch::Kind::Kernel:
      launch(l, launchRows, T, R);
      break;
    }
  }
  return s.head ? R : rows;
}

void CudaDevice::exchanged(size_t, const PlanStep &s, int64_t most) {
  if (s.op->collective == Collective::AllToAll)
    exchangedRows = most;
}

uint64_t CudaDevice::address(const void *p) { return reinterpret_cast<uintptr_t>(p); }

uint64_t CudaDevice::resolve(const KernelRef &ref, int64_t T, int64_t R) const {
  const size_t i = static_cast<size_t>(ref.value);
  switch (ref.kind) {
  case KernelRef::Kind::T: return static_cast<uint64_t>(T);
  case KernelRef::Kind::R: return static_cast<uint64_t>(R);
  case KernelRef::Kind::Null: return 0;
  case KernelRef::Kind::CoordTp: return static_cast<uint64_t>(plan->ranks[rank].coords.tp);
  case KernelRef::Kind::Const: return static_cast<uint64_t>(ref.value);
  case KernelRef::Kind::Buffer: return address(current.entry->memory->buffer(ref.value));
  case KernelRef::Kind::Weight: return weightPtrs[i];
  case KernelRef::Kind::Scratch: return current.entry->scratch[i];
  case KernelRef::Kind::CacheKeys:
    return address(current.entry->memory->cacheKeys(ref.value));
  case KernelRef::Kind::CacheValues:
    return address(current.entry->memory->cacheValues(ref.value));
  case KernelRef::Kind::RopeCos: return current.entry->ropeCos[i];
  case KernelRef::Kind::RopeSin: return current.entry->ropeSin[i];
  case KernelRef::Kind::BatchSequence: return batchSequence;
  case KernelRef::Kind::BatchPosition: return batchPosition;
  case KernelRef::Kind::BatchLogitRows: return batchLogitRows;
  case KernelRef::Kind::BatchArgmax: return batchArgmax;
  }
  return 0;
}

void CudaDevice::launch(const KernelLaunch &l, int64_t rows, int64_t T, int64_t R) {
  unsigned grid[3];
  for (int d = 0; d < 3; ++d) {
    const auto &[a, div, c] = l.grid[d];
    grid[d] = static_cast<unsigned>((a * rows + div - 1) / div + c);
  }
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0)
    return; // no rows (T = 0)
  std::vector<uint64_t> values;
  for (const KernelRef &p : l.params)
    values.push_back(resolve(p, T, R));
  std::vector<void *> args;
  for (uint64_t &v : values)
    args.push_back(&v);
  check(api->cuLaunchKernel(current.entry->functions.at(l.kernel), grid[0], grid[1], grid[2],
                            l.block, 1, 1,
                            l.sharedBytes, stream, args.data(), nullptr),
        ("cuLaunchKernel " + l.kernel).c_str());
}

cudaDataType CudaDevice::weightType(const std::string &dtype) {
  if (dtype == "BF16") return CUDA_R_16BF;
  if (dtype == "F16") return CUDA_R_16F;
  return CUDA_R_32F;
}

void CudaDevice::gemm(const KernelGemm &g, int64_t T, int64_t R, int64_t groupedStep) {
  int m = static_cast<int>(g.rows == KernelGemm::Rows::T   ? T
                           : g.rows == KernelGemm::Rows::R ? R
                                                           : g.m);
  // Expert blocks hold at most c(T) <= T counted rows: rows past T are
  // never computed (a decode step multiplies E x T rows, not E x C).
  // After an all_to_all the blocks hold the sources' rows, whose T is
  // theirs (EP spans DP replicas, which step different batches, or none:
  // a replica with T = 0 still computes the rows it received): the bound
  // is then the most rows any received block holds.
  int k = static_cast<int>(g.kRows == KernelGemm::Rows::T   ? T
                           : g.kRows == KernelGemm::Rows::R ? R
                                                            : g.k);
  if (g.batch > 1 && g.rowsFromCounts) {
    // The blocks' token rows: m, or k with transpose_a (a weight gradient).
    const int most = static_cast<int>(exchangedRows >= 0 ? exchangedRows : T);
    (g.transposeA ? k : m) = std::min(g.transposeA ? k : m, most);
  }
  if (m == 0)
    return;
  const void *A = reinterpret_cast<const void *>(resolve(g.a, T, R));
  cudaDataType bType = weightType(g.bDtype);
  const void *B = reinterpret_cast<const void *>(resolve(g.b, T, R));
  cudaDataType aType = CUDA_R_32F;
  int64_t aElement = 4;
  const Fp8Weight *f8 = nullptr;
  if (g.b.kind == KernelRef::Kind::Weight) {
    if (auto f = fp8.find(static_cast<size_t>(g.b.value)); f != fp8.end())
      f8 = &f->second;
    if (bType != CUDA_R_32F) {
      if (bType == CUDA_R_16BF && bf16Gemm && !g.transposeA && (g.transposeB || g.batch == 1)) {
        aType = CUDA_R_16BF; // A rounded into packScratch below
        aElement = 2;
      } else {
        B = reinterpret_cast<const void *>(weightF32Ptrs[static_cast<size_t>(g.b.value)]);
        bType = CUDA_R_32F; // widened at upload (weightUse), or dequantised to f32
      }
    }
  }
  void *C = reinterpret_cast<void *>(resolve(g.c, T, R));
  const int batch = static_cast<int>(g.batch);
  // The general form (a training program's expert gradients: transpose_a,
  // B stored [k, n]) and dropless expert GEMMs run per block, bounded by
  // the block's count (read back: such steps are not captured). A grouped
  // step reads its counts once; the general form at each GEMM.
  const bool general = g.transposeA || !g.transposeB;
  const bool counted = batch > 1 && (general || groupedStep >= 0) && g.rowsFromCounts;
  auto readCounts = [&] {
    if (general || countsStep != groupedStep) {
      stepCounts.assign(static_cast<size_t>(batch), 0);
      check(api->cuMemcpyDtoHAsync(stepCounts.data(), resolve(*g.rowsFromCounts, T, R),
                                   stepCounts.size() * 4, stream),
            "expert block counts");
      check(api->cuStreamSynchronize(stream), "expert block counts");
      countsStep = general ? -1 : groupedStep;
    }
  };
  // With dynamic FP8 activations (the plan's) an FP8 weight multiplies
  // activations quantised per 1 x 128 (DeepSeek's FP8 GEMM numbers;
  // docs/quantization.md) on every path: a few
  // rows a block (decode) through the GEMV, on the rows quantised and
  // dequantised again (blocks bounded by their counts on the device, so
  // graphs capture it and only the routed experts are read); more on
  // cuBLASLt's block-scaled FP8 GEMM (sm_90); what it does not run per
  // block, on the rows quantised and dequantised again.
  if (f8 && fp8Dynamic && !g.transposeA && g.transposeB && g.n == f8->rows && k == f8->cols) {
    const bool bf16 = aType == CUDA_R_16BF;
    if (fp8Gemv && m <= kFp8GemvRows) {
      const uint64_t counts =
          batch > 1 && g.rowsFromCounts ? resolve(*g.rowsFromCounts, T, R) : 0;
      quantise(A, g.lda, g.strideA, batch, m, k, counts, bf16, 0, 0, quantScratch,
               static_cast<int64_t>(m) * k);
      return gemvFp8(g, *f8, reinterpret_cast<const void *>(quantScratch), k,
                     static_cast<int64_t>(m) * k, C, m, k, false, T, R);
    }
    std::vector<int> rows(static_cast<size_t>(batch), m);
    if (counted) {
      readCounts();
      for (int b = 0; b < batch; ++b)
        rows[static_cast<size_t>(b)] = std::max(0, std::min(stepCounts[b], m));
    }
    if (ltEnabled && f8->lt && g.ldb == k && gemmLt(g, *f8, A, C, rows, k, bf16))
      return;
    return gemmQuantised(g, *f8, A, C, rows, k, bf16);
  }
  // Otherwise a few rows times an FP8 weight [n, k] (decode): read once, dequantised
  // on the fly.
  if (f8 && fp8Gemv && m <= kFp8GemvRows && !g.transposeA && g.transposeB)
    return gemvFp8(g, *f8, A, g.lda, g.strideA, C, m, k, aType == CUDA_R_16BF, T, R);
  long long sa = g.strideA;
  int ldA = static_cast<int>(g.lda);
  if (aType == CUDA_R_16BF && k > 0) {
    // Round the m rows of every block of A to bf16, packed: row stride k,
    // block stride m k.
    long long rows = m, blocks = batch, sx = sa, sy = static_cast<long long>(m) * k;
    long long kk = k, la = g.lda;
    uint64_t x = reinterpret_cast<uint64_t>(A), y = packScratch;
    void *args[] = {&x, &la, &sx, &y, &sy, &rows, &kk};
    check(api->cuLaunchKernel(current.entry->packBf16, static_cast<unsigned>(rows),
                              static_cast<unsigned>(blocks), 1, 256, 1, 1, 0, stream, args,
                              nullptr),
          "cuLaunchKernel moe_pack_bf16");
    A = reinterpret_cast<const void *>(packScratch);
    ldA = k;
    sa = sy;
  }
  const size_t bElement = bType == CUDA_R_32F ? 4 : 2;
  if (f8 && g.batch > 1 && g.strideB != f8->rows * f8->cols)
    runtimeError("{}: FP8 expert stack {}: the GEMM's expert stride {} is not its experts' {} "
                 "x {} values",
                 plan->path, program->weights[static_cast<size_t>(g.b.value)].name, g.strideB,
                 f8->rows, f8->cols);
  // The GEMM of the blocks whose expert is in [e0, e1) of the stack (every
  // block when e1 is past the last), that expert's B at `base` + (expert -
  // e0) stride_b.
  auto blocks = [&](int e0, int e1, const void *base) {
    // Block b's operands: A + b stride_a, expert b % modulo of a weight
    // stack (block b of a buffer), C + b stride_c.
    auto expertOf = [&](int b) {
      return g.b.kind == KernelRef::Kind::Weight ? b % static_cast<int>(g.bBatchModulo) : b;
    };
    auto block = [&](int b, int rows, int depth) {
      return cuda::RowMajorGemm{rows,
                                static_cast<int>(g.n),
                                depth,
                                static_cast<const char *>(A) + b * sa * aElement,
                                aType,
                                ldA,
                                g.transposeA,
                                static_cast<const char *>(base) +
                                    (expertOf(b) - e0) * g.strideB * bElement,
                                bType,
                                static_cast<int>(g.ldb),
                                g.transposeB,
                                static_cast<char *>(C) + b * g.strideC * 4,
                                static_cast<int>(g.ldc),
                                g.accumulate};
    };
    auto mine = [&](int b) { return expertOf(b) >= e0 && expertOf(b) < e1; };
    if (batch == 1)
      return cuda::gemm(*api, blas, stream, block(0, m, k), "cublasGemmEx");
    if (counted) {
      readCounts();
      for (int b = 0; b < batch; ++b) {
        const int rows = std::max(0, std::min(stepCounts[b], g.transposeA ? k : m));
        if (!mine(b) || (!general && rows == 0))
          continue; // rows past the count are don't-care
        cuda::gemm(*api, blas, stream,
                   g.transposeA ? block(b, m, rows) : block(b, rows, k),
                   "cublasGemmEx (expert block GEMM)");
      }
      return;
    }
    if (general) {
      for (int b = 0; b < batch; ++b)
        if (mine(b))
          cuda::gemm(*api, blas, stream, block(b, m, k), "cublasGemmEx (expert block GEMM)");
      return;
    }
    // Blocks b of a [blocks, C, .] buffer use expert b % modulo of the
    // stack: one strided-batched call per source's run of `modulo` experts
    // (those of [e0, e1)).
    const int modulo = static_cast<int>(g.bBatchModulo);
    const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
    for (int first = 0; first < batch; first += modulo) {
      const int from = first + std::min(e0, modulo),
                to = std::min(batch, first + std::min(e1, modulo));
      if (to <= from)
        continue;
      check(api->cublasGemmStridedBatchedEx(
                blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(g.n), m, k, &alpha, base, bType,
                static_cast<int>(g.ldb), g.strideB,
                static_cast<const char *>(A) + from * sa * aElement, aType, ldA, sa, &beta,
                static_cast<char *>(C) + from * g.strideC * 4, CUDA_R_32F,
                static_cast<int>(g.ldc), g.strideC, to - from, CUBLAS_COMPUTE_32F,
                CUBLAS_GEMM_DEFAULT),
            "cublasGemmStridedBatchedEx");
    }
  };
  if (!f8)
    return blocks(0, std::numeric_limits<int>::max(), B);
  // FP8: dequantised a chunk of experts at a time, each chunk's GEMMs on
  // the scratch. A grouped (dropless) step dequantises only the experts
  // whose blocks hold rows (a decode step of DeepSeek-V3: 8 of 256).
  std::vector<char> needed(static_cast<size_t>(f8->experts), 1);
  if (counted && !general) {
    readCounts();
    std::fill(needed.begin(), needed.end(), 0);
    for (int b = 0; b < batch; ++b)
      if (std::min(stepCounts[b], m) > 0)
        needed.at(static_cast<size_t>(b % static_cast<int>(g.bBatchModulo))) = 1;
  }
  const uint64_t stored = weightPtrs[static_cast<size_t>(g.b.value)];
  for (int64_t e0 = 0; e0 < f8->experts; e0 += f8->chunk) {
    const int64_t e1 = std::min(f8->experts, e0 + f8->chunk);
    bool any = false;
    for (int64_t e = e0; e < e1;) { // each run of needed experts
      if (!needed[static_cast<size_t>(e)]) {
        ++e;
        continue;
      }
      const int64_t from = e;
      while (e < e1 && needed[static_cast<size_t>(e)])
        ++e;
      dequantise(*f8, stored, from, e, e0, bType == CUDA_R_16BF);
      any = true;
    }
    if (any)
      blocks(static_cast<int>(e0), static_cast<int>(e1),
             reinterpret_cast<const void *>(dequantScratch));
  }
}

bool CudaDevice::gemmLt(const KernelGemm &g, const Fp8Weight &f, const void *A, void *C,
                        const std::vector<int> &rows, int k, bool bf16) {
  const int n = static_cast<int>(g.n), ldc = static_cast<int>(g.ldc);
  // cuBLASLt's algorithm for `r` rows (asked once per shape; the
  // heuristic reads shapes and modes, not the scale pointers).
  auto algo = [&](int r) -> const std::optional<cublasLtMatmulAlgo_t> & {
    auto key = std::make_tuple(r, n, k, ldc, g.accumulate);
    auto found = ltAlgos.find(key);
    if (found == ltAlgos.end()) {
      LtFp8Problem problem(*lt, r, n, k, ldc, nullptr, nullptr);
      found = ltAlgos.emplace(key, problem.algorithm(ltHandle, kLtWorkspace)).first;
    }
    return found->second;
  };
  for (int r : rows)
    if (r > 0 && (r > ltRows || !algo(r)))
      return false;
  const int64_t es = f.scaleRows * f.scaleStride;
  const uint64_t weight = weightPtrs[static_cast<size_t>(g.b.value)];
  for (size_t b = 0; b < rows.size(); ++b) {
    const int r = rows[b];
    if (r == 0)
      continue;
    // The block's rows as e4m3 with their 1 x 128 scales.
    quantise(static_cast<const char *>(A) + b * g.strideA * 4, g.lda, 0, 1, r, k, 0, bf16,
             ltActivations, ltScales, 0, 0);
    // Times expert b % modulo of the stack.
    const int64_t e = rows.size() > 1 ? static_cast<int64_t>(b) % g.bBatchModulo : 0;
    LtFp8Problem problem(*lt, r, n, k, ldc,
                         reinterpret_cast<const void *>(f.scales + e * es * 4),
                         reinterpret_cast<const void *>(ltScales));
    problem.run(ltHandle, reinterpret_cast<const void *>(weight + e * f.rows * f.cols),
                reinterpret_cast<const void *>(ltActivations),
                static_cast<char *>(C) + b * g.strideC * 4, g.accumulate, *algo(r), ltWorkspace,
                kLtWorkspace, stream);
  }
  return true;
}

void CudaDevice::quantise(const void *A, int64_t lda, int64_t sa, int blocks, int rows, int k,
                          uint64_t counts, bool bf16, CUdeviceptr q, CUdeviceptr s, CUdeviceptr y,
                          int64_t sy) {
  if (blocks == 0 || rows == 0 || k == 0)
    return;
  uint64_t x = reinterpret_cast<uint64_t>(A), qq = q, ss = s, yy = y, cc = counts;
  long long ld = lda, sx = sa, syy = sy, rr = rows, kk = k, half = bf16 ? 1 : 0;
  void *args[] = {&x, &ld, &sx, &qq, &ss, &yy, &syy, &rr, &kk, &cc, &half};
  check(api->cuLaunchKernel(current.entry->quantFp8, static_cast<unsigned>((k + 127) / 128),
                            static_cast<unsigned>(rows), static_cast<unsigned>(blocks), 32, 1, 1,
                            0, stream, args, nullptr),
        "cuLaunchKernel moe_quant_fp8");
}

void CudaDevice::gemmQuantised(const KernelGemm &g, const Fp8Weight &f, const void *A, void *C,
                               const std::vector<int> &rows, int k, bool bf16) {
  const uint64_t stored = weightPtrs[static_cast<size_t>(g.b.value)];
  // Block b multiplies expert b % modulo: each expert dequantised once, then
  // its blocks.
  const int64_t blocks = static_cast<int64_t>(rows.size()),
                modulo = blocks > 1 ? g.bBatchModulo : 1;
  for (int64_t e = 0; e < std::min(modulo, blocks); ++e) {
    bool dequantised = false;
    for (int64_t b = e; b < blocks; b += modulo)
      for (int r0 = 0; r0 < rows[b]; r0 += static_cast<int>(kQuantRows)) {
        const int r = std::min(rows[b] - r0, static_cast<int>(kQuantRows));
        quantise(static_cast<const char *>(A) + (b * g.strideA + r0 * g.lda) * 4, g.lda, 0, 1,
                 r, k, 0, bf16, 0, 0, quantScratch, 0);
        if (!dequantised) {
          dequantise(f, stored, e, e + 1, e, false);
          dequantised = true;
        }
        cuda::gemm(*api, blas, stream,
                   cuda::RowMajorGemm{r, static_cast<int>(g.n), k,
                                      reinterpret_cast<const void *>(quantScratch), CUDA_R_32F,
                                      k, false, reinterpret_cast<const void *>(dequantScratch),
                                      CUDA_R_32F, static_cast<int>(f.cols), true,
                                      static_cast<char *>(C) + (b * g.strideC + r0 * g.ldc) * 4,
                                      static_cast<int>(g.ldc), g.accumulate},
                   "cublasGemmEx (FP8, quantised activations)");
      }
  }
}

void CudaDevice::gemvFp8(const KernelGemm &g, const Fp8Weight &f, const void *A, int64_t lda,
                         int64_t sa, void *C, int m, int k, bool bf16, int64_t T, int64_t R) {
  if (g.n != f.rows || k != f.cols)
    runtimeError("{}: FP8 weight {} is {} x {}, its GEMM's B operand {} x {}", plan->path,
                 program->weights[static_cast<size_t>(g.b.value)].name, f.rows, f.cols, g.n, k);
  const int64_t batch = g.batch;
  uint64_t a = reinterpret_cast<uint64_t>(A), q = weightPtrs[static_cast<size_t>(g.b.value)],
           scales = f.scales, c = reinterpret_cast<uint64_t>(C),
           counts = batch > 1 && g.rowsFromCounts ? resolve(*g.rowsFromCounts, T, R) : 0;
  long long la = lda, sx = sa, n = g.n, kk = k, ss = f.scaleStride,
            es = f.scaleRows * f.scaleStride, br = f.blockRows, bc = f.blockCols,
            ro = f.rowOrigin, co = f.colOrigin, ldc = g.ldc, sc = g.strideC, rows = m,
            modulo = batch > 1 ? g.bBatchModulo : 1, accumulate = g.accumulate ? 1 : 0,
            half = bf16 ? 1 : 0;
  void *args[] = {&a,   &la,  &sx, &q,    &n,      &kk,     &scales,     &ss, &es, &br, &bc,
                  &ro,  &co,  &c,  &ldc,  &sc,     &rows,   &modulo, &counts, &accumulate,
                  &half};
  check(api->cuLaunchKernel(current.entry->gemvFp8, static_cast<unsigned>((n + 7) / 8),
                            static_cast<unsigned>(batch), 1, 256, 1, 1, 0, stream, args,
                            nullptr),
        "cuLaunchKernel moe_gemv_fp8");
}

void CudaDevice::dequantise(const Fp8Weight &f, CUdeviceptr q, int64_t e0, int64_t e1,
                            int64_t first, bool bf16) {
  long long rows = f.rows, cols = f.cols, qs = f.rows * f.cols, ss = f.scaleStride,
            es = f.scaleRows * f.scaleStride, br = f.blockRows, bc = f.blockCols,
            ro = f.rowOrigin, co = f.colOrigin, half = bf16 ? 1 : 0;
  uint64_t src = q + static_cast<uint64_t>(e0 * qs),
           scales = f.scales + static_cast<uint64_t>(e0 * es * 4),
           y = dequantScratch + static_cast<uint64_t>((e0 - first) * qs * (bf16 ? 2 : 4));
  void *args[] = {&src, &rows, &cols, &qs, &scales, &ss, &es, &br, &bc, &ro, &co, &y, &half};
  if (rows == 0 || cols == 0)
    return;
  check(api->cuLaunchKernel(current.entry->dequantFp8, static_cast<unsigned>(rows),
                            static_cast<unsigned>(e1 - e0), 1, 256, 1, 1, 0, stream, args,
                            nullptr),
        "cuLaunchKernel moe_dequant_fp8");
}

} // namespace moert::cuda

namespace moert {

std::unique_ptr<Device> createCudaDevice() { return std::make_unique<cuda::CudaDevice>(); }

} // namespace moert
