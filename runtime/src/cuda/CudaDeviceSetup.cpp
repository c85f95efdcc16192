// The CUDA device's setup (CudaDevice.h): the GPU and its context, the
// plan's kernel table and module, the arena of the driver's own pieces,
// the weights (and f32 copies of 16-bit GEMM weights) and the rope tables.
#include "CudaDevice.h"

namespace moert::cuda {

CudaDevice::Entry & CudaDevice::entryOf(const RankProgram &p) {
  for (Entry &e : entries)
    if (e.program == &p.program())
      return e;
  runtimeError("the CUDA device holds no program of entry '{}'", p.program().entry);
}

void CudaDevice::readTable(Entry &e, const PlanProgram &p) {
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

void CudaDevice::selectDevice() {
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

bool CudaDevice::loadModule(Entry &e) {
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

void CudaDevice::allocate() {
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

void CudaDevice::weightUse(std::set<size_t> &widened, std::set<size_t> &stored) {
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

void CudaDevice::uploadWeights(const Checkpoint &ckpt) {
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

void CudaDevice::uploadRopeTables(Entry &e) {
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

} // namespace moert::cuda
