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
  int major = 0, minor = 0;
  check(api->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
        "cuDeviceGetAttribute");
  check(api->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
        "cuDeviceGetAttribute");
  sm = major * 10 + minor;
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
  // (Absent from the kernels of an older moec: FP8 weights are refused.)
  if (api->cuModuleGetFunction(&e.dequantFp8, e.module, "moe_dequant_fp8") != CUDA_SUCCESS)
    e.dequantFp8 = nullptr;
  if (api->cuModuleGetFunction(&e.gemvFp8, e.module, "moe_gemv_fp8") != CUDA_SUCCESS)
    e.gemvFp8 = nullptr;
  if (api->cuModuleGetFunction(&e.quantFp8, e.module, "moe_quant_fp8") != CUDA_SUCCESS)
    e.quantFp8 = nullptr;
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
    if (auto f = fp8.find(i); f != fp8.end()) {
      const Fp8Weight &q = f->second;
      arena.reserve(q.experts * q.rows * q.cols);
      arena.reserve(q.experts * q.scaleRows * q.scaleStride * 4);
      continue;
    }
    if (widened.count(i))
      arena.reserve(w.bytes / dtypeSize(w.dtype) * 4);
    if (stored.count(i) || !widened.count(i))
      arena.reserve(w.bytes);
  }
  arena.reserve(packBytes);
  arena.reserve(dequantBytes);
  if (ltEnabled) {
    arena.reserve(ltRows * ltK);                     // e4m3 rows
    arena.reserve(ltRows * ((ltK + 127) / 128) * 4); // their scales
    arena.reserve(kLtWorkspace);
  }
  arena.reserve(quantBytes);
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
    if (auto f = fp8.find(i); f != fp8.end()) {
      Fp8Weight &q = f->second;
      weightF32Ptrs.push_back(0);
      weightPtrs.push_back(arena.take(q.experts * q.rows * q.cols));
      q.scales = arena.take(q.experts * q.scaleRows * q.scaleStride * 4);
      continue;
    }
    weightF32Ptrs.push_back(widened.count(i) ? arena.take(w.bytes / dtypeSize(w.dtype) * 4)
                                             : 0);
    weightPtrs.push_back(stored.count(i) || !widened.count(i) ? arena.take(w.bytes) : 0);
  }
  packScratch = packBytes ? arena.take(packBytes) : 0;
  dequantScratch = dequantBytes ? arena.take(dequantBytes) : 0;
  if (ltEnabled) {
    ltActivations = arena.take(ltRows * ltK);
    ltScales = arena.take(ltRows * ((ltK + 127) / 128) * 4);
    ltWorkspace = arena.take(kLtWorkspace);
  }
  quantScratch = quantBytes ? arena.take(quantBytes) : 0;
}

void CudaDevice::findFp8(const RankWeights &host) {
  for (size_t i = 0; i < host.weights().size(); ++i) {
    const RankWeights::Weight &w = host.weights()[i];
    std::vector<const TensorView *> views;
    if (w.view.data)
      views.push_back(&w.view);
    for (const TensorView &e : w.experts)
      views.push_back(&e);
    if (views.empty() || views[0]->dtype != DType::F8E4M3)
      continue;
    const std::string &name = program->weights[i].name;
    Fp8Weight f;
    for (const TensorView *v : views) {
      const BlockScales *b = v->blocks;
      if (v->dtype != DType::F8E4M3 || !b || v->shape.size() != 2)
        inputError("{}: FP8 weight '{}' of rank {}: expected a matrix of float8_e4m3fn with "
                   "block scales for each expert",
                   plan->path, name, rank);
      Fp8Weight g;
      g.experts = static_cast<int64_t>(views.size());
      g.rows = v->shape[0];
      g.cols = v->shape[1];
      g.scaleRows = g.rows ? (b->rowOrigin + g.rows - 1) / b->blockRows + 1 : 0;
      g.scaleStride = b->stride;
      g.blockRows = b->blockRows;
      g.blockCols = b->blockCols;
      g.rowOrigin = b->rowOrigin;
      g.colOrigin = b->colOrigin;
      if (v == views[0])
        f = g;
      else if (std::tie(g.rows, g.cols, g.scaleRows, g.scaleStride, g.blockRows, g.blockCols,
                        g.rowOrigin, g.colOrigin) !=
               std::tie(f.rows, f.cols, f.scaleRows, f.scaleStride, f.blockRows, f.blockCols,
                        f.rowOrigin, f.colOrigin))
        inputError("{}: FP8 expert stack '{}' of rank {}: its experts' boxes or blocks differ",
                   plan->path, name, rank);
    }
    fp8[i] = f;
  }
  chooseLt();
  if (!fp8.empty())
    for (const Entry &e : entries)
      if (!e.dequantFp8)
        inputError("{}: program {} has FP8 weights but its kernels lack moe_dequant_fp8 (a plan "
                   "of an older moec: compile it again)",
                   plan->path, e.program - plan->programs.data());
}

void CudaDevice::chooseLt() {
  // The plan's numbers: activations quantised per 1 x 128 before every FP8
  // GEMM (fp8_activations "dynamic") on every GPU; sm_90 (Hopper) runs them
  // on cuBLASLt's 128 x 128 block-scaled FP8 GEMM, other GPUs (sm_80 has no
  // FP8 tensor cores; sm_100's cuBLASLt has no such scale mode), or
  // MOERT_CUDA_FP8_GEMM=0, or no libcublasLt, compute the same numbers on
  // the dequantising paths.
  fp8Dynamic = plan->fp8DynamicActivations && !fp8.empty();
  if (!fp8Dynamic)
    return;
  for (const Entry &e : entries)
    if (!e.quantFp8)
      inputError("{}: program {} quantises FP8 activations but its kernels lack moe_quant_fp8 "
                 "(a plan of an older moec: compile it again)",
                 plan->path, e.program - plan->programs.data());
  const char *env = std::getenv("MOERT_CUDA_FP8_GEMM");
  ltEnabled = sm / 10 == 9 && !(env && !std::strcmp(env, "0"));
  if (!ltEnabled)
    return;
  std::string why;
  lt = cuda::LtApi::get(why);
  if (!lt) {
    fmt::print(stderr, "moert: FP8 GEMMs run without cuBLASLt (the same numbers, slower): {}\n",
               why);
    ltEnabled = false;
    return;
  }
  check(lt->cublasLtCreate(&ltHandle), "cublasLtCreate");
  for (auto &[i, f] : fp8) {
    f.lt = f.blockRows == 128 && f.blockCols == 128 && f.rowOrigin == 0 && f.colOrigin == 0 &&
           f.rows % 16 == 0 && f.cols % 16 == 0;
    if (f.lt)
      f.scaleStride = ((f.cols + 127) / 128 + 3) / 4 * 4;
  }
}

void CudaDevice::weightUse(std::set<size_t> &widened, std::set<size_t> &stored) {
  auto weight = [](const KernelRef &r) -> int64_t {
    return r.kind == KernelRef::Kind::Weight ? r.value : -1;
  };
  // An FP8 weight is a GEMM's B operand only (moe_dequant_fp8 widens it
  // there); a kernel reading it as stored would read bytes as floats.
  auto notFp8 = [&](int64_t w, const std::string &reader) {
    if (w >= 0 && fp8.count(static_cast<size_t>(w)))
      inputError("{}: FP8 weight '{}' is read by {}: the CUDA device dequantises FP8 weights "
                 "in GEMMs only",
                 plan->path, program->weights[static_cast<size_t>(w)].name, reader);
  };
  // MOERT_CUDA_DEQUANT_BYTES: another budget (the tests' one-expert chunks).
  int64_t dequantBudget = kDequantBudget;
  if (const char *b = std::getenv("MOERT_CUDA_DEQUANT_BYTES"); b && std::atoll(b) > 0)
    dequantBudget = std::atoll(b);
  auto visit = [&](const KernelLaunch &l) {
    if (l.kind == KernelLaunch::Kind::Gemm) {
      const KernelGemm &g = l.gemm;
      const bool bf16 =
          g.bDtype == "BF16" && bf16Gemm && !g.transposeA && (g.transposeB || g.batch == 1);
      const int64_t w = weight(g.b);
      if (w >= 0 && bf16) {
        // The packed operand: every block's rows of k bf16 values.
        const int64_t rows = g.rows == KernelGemm::Rows::Fixed ? g.m : plan->maxBatchTokens;
        packBytes =
            std::max(packBytes, g.batch * std::max(rows, plan->maxBatchTokens) * g.k * 2);
      }
      if (w >= 0 && fp8.count(static_cast<size_t>(w))) {
        Fp8Weight &f = fp8[static_cast<size_t>(w)];
        stored.insert(static_cast<size_t>(w));
        // As many experts at a time as the budget holds in f32 (at least
        // one), in the GEMM's dtype.
        const int64_t values = f.rows * f.cols;
        f.chunk = std::clamp<int64_t>(dequantBudget / std::max<int64_t>(1, values * 4), 1,
                                      f.experts);
        dequantBytes = std::max(dequantBytes, f.chunk * values * (bf16 ? 2 : 4));
        if (fp8Dynamic) {
          // cuBLASLt's one block of e4m3 rows, the GEMV's quantised rows of
          // every block, kQuantRows rows of one block otherwise; experts
          // dequantised one at a time in f32.
          ltRows = std::max({ltRows, g.rows == KernelGemm::Rows::Fixed ? g.m : int64_t(0),
                             plan->maxBatchTokens});
          ltK = std::max(ltK, f.cols);
          quantBytes = std::max({quantBytes, g.batch * kFp8GemvRows * f.cols * 4,
                                 kQuantRows * f.cols * 4});
          dequantBytes = std::max(dequantBytes, values * 4);
        }
      } else if (w >= 0) {
        if (bf16) {
          stored.insert(static_cast<size_t>(w));
        } else if (g.bDtype != "F32") {
          widened.insert(static_cast<size_t>(w));
        } else {
          stored.insert(static_cast<size_t>(w));
        }
      }
      for (const KernelRef *operand : {&g.a, &g.c})
        if (int64_t w = weight(*operand); w >= 0) {
          notFp8(w, "a GEMM as its A or C operand");
          stored.insert(static_cast<size_t>(w));
        }
    }
    for (const KernelRef &p : l.params)
      if (int64_t w = weight(p); w >= 0) {
        notFp8(w, "kernel " + l.kernel);
        stored.insert(static_cast<size_t>(w));
      }
  };
  for (const Entry &e : entries) {
    for (const KernelStep &s : e.table->steps)
      for (const KernelLaunch &l : s.launches)
        visit(l);
    for (const KernelLaunch &l : e.table->sampling)
      visit(l);
  }
}

void CudaDevice::uploadWeights(const RankWeights &host) {
  for (size_t i = 0; i < host.weights().size(); ++i) {
    const RankWeights::Weight &w = host.weights()[i];
    if (auto f = fp8.find(i); f != fp8.end()) {
      // The scales each expert's box uses, one expert after another.
      const Fp8Weight &q = f->second;
      CUdeviceptr at = q.scales;
      auto scales = [&](const TensorView &v) {
        const size_t bytes = static_cast<size_t>(q.scaleRows * q.scaleStride * 4);
        const float *data = v.blocks->data;
        std::vector<float> padded;
        if (q.scaleStride != v.blocks->stride) { // cuBLASLt's row stride (q.lt)
          const int64_t used = (q.cols + 127) / 128;
          padded.assign(static_cast<size_t>(q.scaleRows * q.scaleStride), 0.0f);
          for (int64_t r = 0; r < q.scaleRows; ++r)
            std::copy_n(data + r * v.blocks->stride, used,
                        padded.begin() + r * q.scaleStride);
          data = padded.data();
        }
        check(api->cuMemcpyHtoD(at, data, bytes), "upload FP8 block scales");
        at += bytes;
        weightsOnDevice += static_cast<int64_t>(bytes);
      };
      if (w.view.data)
        scales(w.view);
      for (const TensorView &e : w.experts)
        scales(e);
    }
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
