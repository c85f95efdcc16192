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
#include <set>

namespace moert {
namespace {


/// Steps of at most this many tokens are captured into CUDA graphs.
constexpr int64_t kGraphMaxTokens = 64;
using cuda::check;

class CudaDevice final : public Device {
  /// What the device holds for each program of the rank (one per entry, the
  /// rank's own first): its kernel table and module, scratch, rope tables,
  /// grouped GEMM steps and captured graphs, and the executor's memory of it.
  struct Entry {
    const PlanProgram *program = nullptr;
    const KernelTable *table = nullptr;
    CUmodule module = nullptr;
    std::map<std::string, CUfunction> functions;
    CUfunction packBf16 = nullptr; ///< moe_pack_bf16 of the module
    std::vector<CUdeviceptr> scratch, ropeCos, ropeSin;
    std::vector<bool> grouped; ///< per step: dropless expert GEMMs
    bool graphsEnabled = false;
    std::map<std::pair<int64_t, int64_t>, CUgraphExec> graphs;
    const RankProgram *memory = nullptr; ///< the executor's: buffers, KV caches
  };

public:
  ~CudaDevice() override {
    if (!api)
      return;
    for (Entry &e : entries)
      for (auto &[key, exec] : e.graphs)
        api->cuGraphExecDestroy(exec);
    if (blas)
      api->cublasDestroy(blas);
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

  std::string name() const override { return "cuda"; }

  void open(const Plan &plan, int64_t rankIndex, const Checkpoint &ckpt, Comm &comm) override {
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
    allocate();
    uploadWeights(ckpt);
    for (Entry &e : entries)
      uploadRopeTables(e);
    if (plan.worldSize > 1) {
      nccl = std::make_unique<cuda::NcclComm>(*api, comm, stream);
      nccl->prepare(plan);
    }
  }

  DeviceMemory &memory() override { return memory_; }
  /// Captured graphs replay fixed addresses: the staging is reserved.
  RankProgram::Staging staging() const override { return RankProgram::Staging::Reserved; }
  /// The collectives go over NCCL.
  Comm *communicator() override { return nccl.get(); }

  void bind(const RankProgram &p) override {
    Entry &e = entryOf(p);
    e.memory = &p;
    check(api->cuStreamSynchronize(stream), "zero the program's memory");
    // Training programs are not captured: their expert gradients' GEMMs
    // read the counts back.
    e.graphsEnabled = !e.table->hasAllToAll && e.program->labelsBuffer < 0;
    if (const char *g = std::getenv("MOERT_CUDA_GRAPHS"); g && !std::strcmp(g, "0"))
      e.graphsEnabled = false;
  }

  /// The batch's per-token / per-logit-row index arrays (the kernels read
  /// them), then the steps: small steps (decode) replay a graph captured
  /// per (T, R); large ones (prefill) run directly, with the dropless
  /// expert GEMMs grouped over counted rows.
  void run(const RankProgram &p, const Batch &batch, const std::function<void()> &steps) override {
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

  void synchronize() override { check(api->cuStreamSynchronize(stream), "forward step"); }
  bool synchronous() const override { return false; }

  int64_t weightBytes() const override { return weightsOnDevice; }
  int64_t loadedWeightBytes() const override { return loaded; }
  /// The arena: weights, scratch, rope tables, the batch's index arrays.
  int64_t ownPeakBytes() const override { return arena.bytes(); }

private:
  //===--------------------------------------------------------------------===//
  // Setup
  //===--------------------------------------------------------------------===//

  /// The entry of the executor's program `p`.
  Entry &entryOf(const RankProgram &p) {
    for (Entry &e : entries)
      if (e.program == &p.program())
        return e;
    runtimeError("the CUDA device holds no program of entry '{}'", p.program().entry);
  }

  void readTable(Entry &e, const PlanProgram &p) {
    e.program = &p;
    if (!p.cuda)
      inputError("{}: program {} of stage {} has no CUDA kernel table (compile with moec "
                 "compile --target cuda, or run it with --device cpu)",
                 plan->path, &p - plan->programs.data(), p.stage);
    e.table = p.cuda.get();
    // Dropless expert GEMMs (moe.experts, or expert_ffn after a dispatch
    // with capacity factor 0) are grouped over the counted rows: their
    // buffers have max_batch_tokens rows per expert, mostly empty.
    e.grouped.assign(p.steps.size(), false);
    double factor = -1;
    for (size_t i = 0; i < p.steps.size(); ++i) {
      const PlanStep &step = p.steps[i];
      if (step.op->has(OpDef::FillsExpertBlocks))
        factor = step.dispatch.capacityFactor;
      e.grouped[i] = step.op->has(OpDef::GroupedExpertGemm) ||
                     (step.op->has(OpDef::ExpertBlockGemm) && factor == 0);
    }
  }

  void selectDevice() {
    int count = 0;
    check(api->cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (count == 0)
      inputError("this plan runs on CUDA but no GPU is visible");
    // Ranks of one node share its GPUs in order.
    int local = rank;
    if (const char *l = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK"))
      local = std::atoi(l);
    check(api->cuDeviceGet(&device, local % count), "cuDeviceGet");
    check(api->cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
    check(api->cuCtxSetCurrent(context), "cuCtxSetCurrent");
    check(api->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    memory_.bind(*api, stream);
    check(api->cublasCreate(&blas), "cublasCreate");
    check(api->cublasSetStream(blas, reinterpret_cast<cudaStream_t>(stream)), "cublasSetStream");
  }

  /// The plan carries its kernels (source and fatbin, docs/cuda.md): they
  /// are written to a private temporary directory for cuModuleLoad and
  /// removed once loaded (the fake driver of the tests builds the source
  /// found beside the fatbin). True when the module has moe_pack_bf16.
  bool loadModule(Entry &e) {
    const KernelTable *table = e.table;
    const int64_t p = e.program - plan->programs.data();
    if (table->fatbin.empty())
      inputError("{}: programs[{}].cuda has no fatbin (the plan was compiled without nvcc: "
                 "--compile-to=kernels)",
                 plan->path, p);
    std::string dir = temporaryDirectory("moert-kernels");
    struct Remove {
      std::string dir;
      ~Remove() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
      }
    } remove{dir};
    const std::string path = dir + "/kernels.fatbin";
    writeFileAtomically(dir + "/kernels.cu", table->code);
    writeFileAtomically(path, table->fatbin);
    check(api->cuModuleLoad(&e.module, path.c_str()),
          fmt::format("cuModuleLoad (programs[{}].cuda.fatbin of {})", p, plan->path).c_str());
    auto resolve = [&](const KernelLaunch &launch) {
      if (launch.kind != KernelLaunch::Kind::Kernel)
        return;
      const std::string &name = launch.kernel;
      if (e.functions.count(name))
        return;
      CUfunction f;
      check(api->cuModuleGetFunction(&f, e.module, name.c_str()),
            ("kernel " + name + " of " + path).c_str());
      e.functions[name] = f;
    };
    for (const KernelStep &s : table->steps)
      for (const KernelLaunch &l : s.launches)
        resolve(l);
    return api->cuModuleGetFunction(&e.packBf16, e.module, "moe_pack_bf16") == CUDA_SUCCESS;
  }

  /// The driver's own pieces, in one arena (the program's buffers and KV
  /// caches are RankProgram's).
  void allocate() {
    const int64_t maxT = plan->maxBatchTokens;
    // Every piece is reserved as it is taken below (each is rounded up to
    // the arena's alignment).
    for (const Entry &e : entries) {
      for (int64_t bytes : e.table->scratchBytes)
        arena.reserve(bytes);
      for (const KernelTable::RopeTable &r : e.table->ropeTables)
        for (int i = 0; i < 2; ++i) // cos, sin
          arena.reserve(r.positions * r.half * 4);
    }
    for (int i = 0; i < 4; ++i) // sequence, position, logit rows, argmax
      arena.reserve(maxT * 4);
    // cuBLAS' GemmEx takes A and B of one type (f32 activations here): a
    // BF16/F16 weight that is a GEMM operand is held widened to f32 (as the
    // CPU backend computes it), and as stored too where a kernel reads it.
    weightUse(widened, stored);
    for (size_t i = 0; i < program->weights.size(); ++i) {
      const PlanWeight &w = program->weights[i];
      if (widened.count(i))
        arena.reserve(w.bytes / dtypeSize(w.dtype) * 4);
      if (stored.count(i) || !widened.count(i))
        arena.reserve(w.bytes);
    }
    arena.reserve(packBytes);
    arena.allocate(*api);

    for (Entry &e : entries) {
      for (int64_t bytes : e.table->scratchBytes)
        e.scratch.push_back(arena.take(bytes));
      for (const KernelTable::RopeTable &r : e.table->ropeTables) {
        int64_t n = r.positions * r.half * 4;
        e.ropeCos.push_back(arena.take(n));
        e.ropeSin.push_back(arena.take(n));
      }
    }
    batchSequence = arena.take(maxT * 4);
    batchPosition = arena.take(maxT * 4);
    batchLogitRows = arena.take(maxT * 4);
    batchArgmax = arena.take(maxT * 4);
    for (size_t i = 0; i < program->weights.size(); ++i) {
      const PlanWeight &w = program->weights[i];
      weightF32Ptrs.push_back(widened.count(i) ? arena.take(w.bytes / dtypeSize(w.dtype) * 4)
                                               : 0);
      weightPtrs.push_back(stored.count(i) || !widened.count(i) ? arena.take(w.bytes) : 0);
    }
    packScratch = packBytes ? arena.take(packBytes) : 0;
  }

  /// Weights that are the B operand of a GEMM in a 16-bit type (`widened`)
  /// and weights that a kernel reads as stored (`stored`).
  void weightUse(std::set<size_t> &widened, std::set<size_t> &stored) {
    auto weight = [](const KernelRef &r) -> int64_t {
      return r.kind == KernelRef::Kind::Weight ? r.value : -1;
    };
    auto visit = [&](const KernelLaunch &l) {
      if (l.kind == KernelLaunch::Kind::Gemm) {
        const KernelGemm &g = l.gemm;
        if (int64_t w = weight(g.b); w >= 0) {
          if (g.bDtype == "BF16" && bf16Gemm && !g.transposeA && (g.transposeB || g.batch == 1)) {
            stored.insert(static_cast<size_t>(w));
            // The packed operand: every block's rows of k bf16 values.
            const int64_t rows =
                g.rows == KernelGemm::Rows::Fixed ? g.m : plan->maxBatchTokens;
            packBytes = std::max(packBytes, g.batch * std::max(rows, plan->maxBatchTokens) *
                                                g.k * 2);
          } else if (g.bDtype != "F32") {
            widened.insert(static_cast<size_t>(w));
          } else {
            stored.insert(static_cast<size_t>(w));
          }
        }
        for (const KernelRef *operand : {&g.a, &g.c})
          if (int64_t w = weight(*operand); w >= 0)
            stored.insert(static_cast<size_t>(w));
      }
      for (const KernelRef &p : l.params)
        if (int64_t w = weight(p); w >= 0)
          stored.insert(static_cast<size_t>(w));
    };
    for (const Entry &e : entries) {
      for (const KernelStep &s : e.table->steps)
        for (const KernelLaunch &l : s.launches)
          visit(l);
      for (const KernelLaunch &l : e.table->sampling)
        visit(l);
    }
  }

  void uploadWeights(const Checkpoint &ckpt) {
    // FP8 slices and int8 weights are CPU-only (moec refuses them with
    // --target cuda).
    refuseCpuOnlyWeights(*plan, rank, "the CUDA device");
    RankWeights host;
    host.bind(*plan, rank, ckpt, [](int64_t) {});
    for (size_t i = 0; i < host.weights().size(); ++i) {
      const RankWeights::Weight &w = host.weights()[i];
      if (weightF32Ptrs[i]) {
        std::vector<float> wide;
        auto append = [&](const TensorView &v) {
          const int64_t n = v.numel();
          for (int64_t j = 0; j < n; ++j)
            wide.push_back(v.at(j));
        };
        if (w.view.data)
          append(w.view);
        for (const TensorView &e : w.experts)
          append(e);
        check(api->cuMemcpyHtoD(weightF32Ptrs[i], wide.data(), wide.size() * 4),
              "upload weight (widened)");
        weightsOnDevice += static_cast<int64_t>(wide.size() * 4);
      }
      if (!weightPtrs[i])
        continue;
      if (w.view.data) {
        check(api->cuMemcpyHtoD(weightPtrs[i], w.view.data, w.view.bytes()), "upload weight");
        weightsOnDevice += static_cast<int64_t>(w.view.bytes());
      }
      CUdeviceptr at = weightPtrs[i];
      for (const TensorView &e : w.experts) {
        check(api->cuMemcpyHtoD(at, e.data, e.bytes()), "upload expert weight");
        at += e.bytes();
        weightsOnDevice += static_cast<int64_t>(e.bytes());
      }
    }
    loaded = host.loadedBytes();
  }

  /// cos/sin of each rope table, as the CPU backend computes them: the
  /// parameters are those of the steps that use the table.
  void uploadRopeTables(Entry &e) {
    const KernelTable *table = e.table;
    std::set<size_t> uploaded;
    for (size_t i = 0; i < table->steps.size(); ++i)
      for (const KernelLaunch &l : table->steps[i].launches)
        for (const KernelRef &p : l.params) {
          if (p.kind != KernelRef::Kind::RopeCos)
            continue;
          const size_t id = static_cast<size_t>(p.value);
          if (uploaded.count(id))
            continue;
          cpu::RopeTable rope(e.program->steps[i].rope, plan->maxSeqLen);
          const KernelTable::RopeTable &t = table->ropeTables[id];
          if (rope.cosines().size() > static_cast<size_t>(t.positions * t.half) ||
              rope.sines().size() != rope.cosines().size())
            inputError("{}: rope table {} holds {} x {} values, the step's rope needs {}",
                       plan->path, id, t.positions, t.half, rope.cosines().size());
          check(api->cuMemcpyHtoD(e.ropeCos[id], rope.cosines().data(),
                                  rope.cosines().size() * 4),
                "upload rope table");
          check(api->cuMemcpyHtoD(e.ropeSin[id], rope.sines().data(), rope.sines().size() * 4),
                "upload rope table");
          uploaded.insert(id);
        }
  }

  //===--------------------------------------------------------------------===//
  // Steps
  //===--------------------------------------------------------------------===//

  /// A step's launches: kernels from the table (rows: the step's, T or R)
  /// and cuBLAS GEMMs.
  int64_t compute(size_t i, const PlanStep &s, int64_t rows) override {
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

  void exchanged(size_t, const PlanStep &s, int64_t most) override {
    if (s.op->collective == Collective::AllToAll)
      exchangedRows = most;
  }

  static uint64_t address(const void *p) { return reinterpret_cast<uintptr_t>(p); }

  /// A parameter's value (indices were checked when the plan was read).
  uint64_t resolve(const KernelRef &ref, int64_t T, int64_t R) const {
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

  void launch(const KernelLaunch &l, int64_t rows, int64_t T, int64_t R) {
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

  static cudaDataType weightType(const std::string &dtype) {
    if (dtype == "BF16") return CUDA_R_16BF;
    if (dtype == "F16") return CUDA_R_16F;
    return CUDA_R_32F;
  }

  /// A GEMM of the table (C[m, n] (+)= op(A) op(B), row-major: CudaGemm.h).
  /// `groupedStep` >= 0: a dropless expert GEMM of that step, run as a
  /// grouped GEMM over each block's counted rows only (the counts are read
  /// back once per step: such programs are not captured into graphs).
  void gemm(const KernelGemm &g, int64_t T, int64_t R, int64_t groupedStep) {
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
    if (g.b.kind == KernelRef::Kind::Weight && bType != CUDA_R_32F) {
      if (bType == CUDA_R_16BF && bf16Gemm && !g.transposeA && (g.transposeB || g.batch == 1)) {
        aType = CUDA_R_16BF; // A rounded into packScratch below
        aElement = 2;
      } else {
        B = reinterpret_cast<const void *>(weightF32Ptrs[static_cast<size_t>(g.b.value)]);
        bType = CUDA_R_32F; // widened at upload (weightUse)
      }
    }
    void *C = reinterpret_cast<void *>(resolve(g.c, T, R));
    const int batch = static_cast<int>(g.batch);
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
    // Block b's operands: A + b stride_a, expert b % modulo of a weight
    // stack (block b of a buffer), C + b stride_c.
    const size_t bElement = bType == CUDA_R_32F ? 4 : 2;
    auto block = [&](int b, int rows, int depth) {
      const int expert = g.b.kind == KernelRef::Kind::Weight
                             ? b % static_cast<int>(g.bBatchModulo)
                             : b;
      return cuda::RowMajorGemm{rows,
                                static_cast<int>(g.n),
                                depth,
                                static_cast<const char *>(A) + b * sa * aElement,
                                aType,
                                ldA,
                                g.transposeA,
                                static_cast<const char *>(B) + expert * g.strideB * bElement,
                                bType,
                                static_cast<int>(g.ldb),
                                g.transposeB,
                                static_cast<char *>(C) + b * g.strideC * 4,
                                static_cast<int>(g.ldc),
                                g.accumulate};
    };
    if (batch == 1)
      return cuda::gemm(*api, blas, stream, block(0, m, k), "cublasGemmEx");
    // The general form (a training program's expert gradients: transpose_a,
    // B stored [k, n]) and dropless expert GEMMs run per block, bounded by
    // the block's count (read back: such steps are not captured).
    const bool general = g.transposeA || !g.transposeB;
    if ((general || groupedStep >= 0) && g.rowsFromCounts) {
      // A grouped step reads its counts once; the general form at each GEMM.
      if (general || countsStep != groupedStep) {
        stepCounts.assign(static_cast<size_t>(batch), 0);
        check(api->cuMemcpyDtoHAsync(stepCounts.data(), resolve(*g.rowsFromCounts, T, R),
                                     stepCounts.size() * 4, stream),
              "expert block counts");
        check(api->cuStreamSynchronize(stream), "expert block counts");
        countsStep = general ? -1 : groupedStep;
      }
      for (int b = 0; b < batch; ++b) {
        const int rows = std::max(0, std::min(stepCounts[b], g.transposeA ? k : m));
        if (!general && rows == 0)
          continue; // rows past the count are don't-care
        cuda::gemm(*api, blas, stream,
                   g.transposeA ? block(b, m, rows) : block(b, rows, k),
                   "cublasGemmEx (expert block GEMM)");
      }
      return;
    }
    if (general) {
      for (int b = 0; b < batch; ++b)
        cuda::gemm(*api, blas, stream, block(b, m, k), "cublasGemmEx (expert block GEMM)");
      return;
    }
    // Blocks b of a [blocks, C, .] buffer use expert b % modulo of the stack:
    // one strided-batched call per source's run of `modulo` experts.
    const int modulo = static_cast<int>(g.bBatchModulo);
    const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
    for (int first = 0; first < batch; first += modulo) {
      const int count = std::min(modulo, batch - first);
      check(api->cublasGemmStridedBatchedEx(
                blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(g.n), m, k, &alpha, B, bType,
                static_cast<int>(g.ldb), g.strideB,
                static_cast<const char *>(A) + first * sa * aElement, aType, ldA, sa, &beta,
                static_cast<char *>(C) + first * g.strideC * 4, CUDA_R_32F,
                static_cast<int>(g.ldc), g.strideC, count, CUBLAS_COMPUTE_32F,
                CUBLAS_GEMM_DEFAULT),
            "cublasGemmStridedBatchedEx");
    }
  }

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

} // namespace

std::unique_ptr<Device> createCudaDevice() { return std::make_unique<CudaDevice>(); }

} // namespace moert
