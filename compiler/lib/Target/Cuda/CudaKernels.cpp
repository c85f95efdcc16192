//===- CudaKernels.cpp - the CUDA target's lowering of exec programs -*- C++ -*-===//
//
// moe-cuda-kernels (the CUDA TargetBackend's pipeline hook): the Emitter
// (Emitter.h) generates each program's kernels from its exec ops, and the
// result goes into the IR: every exec.launch gets its rows and a `kernels`
// region of exec.dispatch / exec.gemm ops, every exec.collective its rows,
// and the program an exec.kernels op with the source, the kernel names, the
// scratch sizes, the RoPE tables and the sampler. programKernels reads the
// kernel table back from that IR for the plan: what the plan holds is what
// the IR shows.
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/Exec/IR/ExecOps.h"
#include "moe/Target/Cuda.h"
#include "moe/Target/PlanWriter.h"
#include "moe/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/Support/FormatVariadic.h"

namespace moe {
#define GEN_PASS_DEF_MOECUDAKERNELS
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;
using llvm::json::Array;
using llvm::json::Object;
using JsonValue = llvm::json::Value;
namespace exec = moe::exec;

namespace {

llvm::Error kernelsError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

/// JSON as a plain attribute (the inverse of moe::attributeJson): whole
/// numbers as i64, other numbers as f64.
Attribute jsonAttribute(Builder &b, const JsonValue &v) {
  if (auto boolean = v.getAsBoolean())
    return b.getBoolAttr(*boolean);
  if (auto integer = v.getAsInteger())
    return b.getI64IntegerAttr(*integer);
  if (auto number = v.getAsNumber())
    return b.getF64FloatAttr(*number);
  if (auto string = v.getAsString())
    return b.getStringAttr(*string);
  if (const Array *array = v.getAsArray()) {
    SmallVector<Attribute> elements;
    for (const JsonValue &e : *array)
      elements.push_back(jsonAttribute(b, e));
    return b.getArrayAttr(elements);
  }
  SmallVector<NamedAttribute> entries;
  if (const Object *object = v.getAsObject())
    for (const auto &[key, value] : *object)
      entries.push_back(b.getNamedAttr(key.str(), jsonAttribute(b, value)));
  return b.getDictionaryAttr(entries);
}

SmallVector<int64_t> integers(const JsonValue &v) {
  SmallVector<int64_t> out;
  for (const JsonValue &e : *v.getAsArray())
    out.push_back(*e.getAsInteger());
  return out;
}

SmallVector<StringRef> strings(const JsonValue &v) {
  SmallVector<StringRef> out;
  for (const JsonValue &e : *v.getAsArray())
    out.push_back(*e.getAsString());
  return out;
}

StringAttr optionalString(Builder &b, const Object &o, StringRef key) {
  auto s = o.getString(key);
  return s ? b.getStringAttr(*s) : StringAttr();
}

IntegerAttr optionalInteger(Builder &b, const Object &o, StringRef key) {
  auto i = o.getInteger(key);
  return i ? b.getI64IntegerAttr(*i) : IntegerAttr();
}

BoolAttr optionalBool(Builder &b, const Object &o, StringRef key) {
  auto v = o.getBoolean(key);
  return v ? b.getBoolAttr(*v) : BoolAttr();
}

/// One launch of the Emitter's table as an op at `b`.
void buildLaunch(OpBuilder &b, Location loc, const Object &launch) {
  StringAttr rows = optionalString(b, launch, "rows");
  if (const Object *g = launch.getObject("gemm")) {
    b.create<exec::GemmOp>(
        loc, b.getStringAttr(*g->getString("a")), b.getStringAttr(*g->getString("b")),
        b.getStringAttr(*g->getString("c")), b.getStringAttr(*g->getString("m")),
        b.getI64IntegerAttr(*g->getInteger("n")), b.getI64IntegerAttr(*g->getInteger("k")),
        b.getI64IntegerAttr(*g->getInteger("lda")), b.getI64IntegerAttr(*g->getInteger("ldb")),
        b.getI64IntegerAttr(*g->getInteger("ldc")), b.getStringAttr(*g->getString("b_dtype")),
        b.getBoolAttr(*g->getBoolean("transpose_b")), b.getI64IntegerAttr(*g->getInteger("batch")),
        optionalInteger(b, *g, "stride_a"), optionalInteger(b, *g, "stride_b"),
        optionalInteger(b, *g, "stride_c"), optionalInteger(b, *g, "b_batch_modulo"),
        optionalString(b, *g, "rows_from_counts"), rows, optionalBool(b, *g, "transpose_a"),
        optionalBool(b, *g, "accumulate"), optionalString(b, *g, "k_rows"));
    return;
  }
  const Array &grid = *launch.getArray("grid");
  b.create<exec::DispatchOp>(
      loc, b.getStringAttr(*launch.getString("kernel")), b.getDenseI64ArrayAttr(integers(grid[0])),
      b.getDenseI64ArrayAttr(integers(grid[1])), b.getDenseI64ArrayAttr(integers(grid[2])),
      b.getI64IntegerAttr(*launch.getInteger("block")),
      b.getI64IntegerAttr(*launch.getInteger("shared_bytes")),
      b.getStrArrayAttr(strings(*launch.get("params"))), rows);
}

/// Puts the emitted kernels of `program` into it.
LogicalResult attach(exec::ProgramOp program, const moe::cuda::EmittedProgram &emitted) {
  const Array &steps = *emitted.table.getArray("steps");
  OpBuilder b(program.getContext());
  size_t i = 0;
  for (Operation &op : program.getBody().front()) {
    if (!isa<exec::LaunchOp, exec::CollectiveOp>(op))
      continue;
    if (i >= steps.size())
      return op.emitError("moe-cuda-kernels: the emitter gave fewer steps than the program has");
    const Object &step = *steps[i++].getAsObject();
    StringAttr rows = b.getStringAttr(*step.getString("rows"));
    if (auto c = dyn_cast<exec::CollectiveOp>(op)) {
      c.setRowsAttr(rows);
      continue;
    }
    auto launch = cast<exec::LaunchOp>(op);
    launch.setRowsAttr(rows);
    Block *block = new Block();
    launch.getKernels().push_back(block);
    b.setInsertionPointToStart(block);
    for (const JsonValue &l : *step.getArray("launches"))
      buildLaunch(b, op.getLoc(), *l.getAsObject());
  }
  b.setInsertionPoint(program.getBody().front().getTerminator());
  SmallVector<int64_t> scratch;
  for (const JsonValue &s : *emitted.table.getArray("scratch"))
    scratch.push_back(*s.getAsObject()->getInteger("bytes"));
  SmallVector<StringRef> names(emitted.kernels.begin(), emitted.kernels.end());
  auto kernels = b.create<exec::KernelsOp>(
      program.getLoc(), b.getStringAttr("cuda"), b.getStringAttr(emitted.source),
      b.getStrArrayAttr(names), b.getDenseI64ArrayAttr(scratch),
      cast<ArrayAttr>(jsonAttribute(b, *emitted.table.get("rope_tables"))));
  if (const Object *argmax = emitted.table.getObject("sampling")->getObject("argmax")) {
    Block *block = new Block();
    kernels.getSampling().push_back(block);
    b.setInsertionPointToStart(block);
    buildLaunch(b, program.getLoc(), *argmax);
  }
  return success();
}

Object dispatchJson(exec::DispatchOp d) {
  Array grid;
  for (ArrayRef<int64_t> dim : {d.getGridX(), d.getGridY(), d.getGridZ()})
    grid.push_back(Array(dim));
  Array params;
  for (StringRef p : d.getParams().getAsValueRange<StringAttr>())
    params.push_back(p);
  Object o{{"kernel", d.getKernel()},
           {"grid", std::move(grid)},
           {"block", d.getBlockAttr().getInt()},
           {"shared_bytes", d.getSharedBytesAttr().getInt()},
           {"params", std::move(params)}};
  if (auto rows = d.getRows())
    o["rows"] = *rows;
  return o;
}

Object gemmJson(exec::GemmOp g) {
  Object o{{"a", g.getA()},
           {"b", g.getB()},
           {"c", g.getC()},
           {"m", g.getM()},
           {"n", g.getNAttr().getInt()},
           {"k", g.getKAttr().getInt()},
           {"lda", g.getLdaAttr().getInt()},
           {"ldb", g.getLdbAttr().getInt()},
           {"ldc", g.getLdcAttr().getInt()},
           {"b_dtype", g.getBDtype()},
           {"transpose_b", g.getTransposeB()},
           {"batch", g.getBatchAttr().getInt()}};
  if (auto v = g.getStrideAAttr())
    o["stride_a"] = v.getInt();
  if (auto v = g.getStrideBAttr())
    o["stride_b"] = v.getInt();
  if (auto v = g.getStrideCAttr())
    o["stride_c"] = v.getInt();
  if (auto v = g.getBBatchModuloAttr())
    o["b_batch_modulo"] = v.getInt();
  if (auto v = g.getRowsFromCounts())
    o["rows_from_counts"] = *v;
  if (auto v = g.getTransposeA())
    o["transpose_a"] = *v;
  if (auto v = g.getAccumulate())
    o["accumulate"] = *v;
  if (auto v = g.getKRows())
    o["k_rows"] = *v;
  Object launch{{"gemm", std::move(o)}};
  if (auto rows = g.getRows())
    launch["rows"] = *rows;
  return launch;
}

struct CudaKernels : moe::impl::MoECudaKernelsBase<CudaKernels> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto workload = module->getAttrOfType<DictionaryAttr>("moe.workload");
    if (!workload) {
      module.emitError("moe-cuda-kernels: expected a module with moe.workload and exec programs "
                       "(run the whole pipeline)");
      return signalPassFailure();
    }
    auto get = [&](StringRef key) {
      auto value = dyn_cast_or_null<IntegerAttr>(workload.get(key));
      return value ? value.getInt() : int64_t(0);
    };
    const moe::cuda::Workload sizes{get("max_batch_tokens"), get("max_seq_len")};
    if (sizes.maxBatchTokens <= 0 || sizes.maxSeqLen <= 0) {
      module.emitError("moe-cuda-kernels: moe.workload needs a positive max_batch_tokens and "
                       "max_seq_len");
      return signalPassFailure();
    }
    int64_t index = 0;
    for (auto program : module.getOps<exec::ProgramOp>()) {
      if (!program.getBody().front().getOps<exec::KernelsOp>().empty()) {
        program.emitError("moe-cuda-kernels: @") << program.getSymName()
                                                 << " has its kernels already";
        return signalPassFailure();
      }
      ++index;
      // An entry compiled for fewer tokens a step (moe-join-entries) sizes
      // its scratch for them.
      moe::cuda::Workload programSizes = sizes;
      if (auto tokens = program->getAttrOfType<IntegerAttr>("max_batch_tokens"))
        programSizes.maxBatchTokens = tokens.getInt();
      llvm::Expected<moe::cuda::EmittedProgram> emitted =
          moe::cuda::emitProgram(program, programSizes);
      if (!emitted) {
        program.emitError("moe-cuda-kernels: ") << llvm::toString(emitted.takeError());
        return signalPassFailure();
      }
      if (failed(attach(program, *emitted)))
        return signalPassFailure();
    }
    if (!index) {
      module.emitError("moe-cuda-kernels: expected exec.program ops (run moe-lower-to-exec)");
      signalPassFailure();
    }
  }
};

} // namespace

llvm::Expected<moe::cuda::EmittedProgram> moe::cuda::programKernels(exec::ProgramOp program) {
  auto found = program.getBody().front().getOps<exec::KernelsOp>();
  if (found.empty())
    return kernelsError(llvm::formatv("@{0}: no CUDA kernels (run moe-cuda-kernels)",
                                      program.getSymName()));
  exec::KernelsOp kernels = *found.begin();
  if (kernels.getTarget() != "cuda")
    return kernelsError(llvm::formatv("@{0}: its kernels are for '{1}', not cuda",
                                      program.getSymName(), kernels.getTarget()));
  Array steps;
  for (Operation &op : program.getBody().front()) {
    Array launches;
    StringRef name;
    std::optional<StringRef> rows;
    if (auto launch = dyn_cast<exec::LaunchOp>(op)) {
      name = launch.getKernel();
      rows = launch.getRows();
      if (!launch.getKernels().empty())
        for (Operation &k : launch.getKernels().front())
          launches.push_back(isa<exec::GemmOp>(k) ? gemmJson(cast<exec::GemmOp>(k))
                                                  : dispatchJson(cast<exec::DispatchOp>(k)));
    } else if (auto c = dyn_cast<exec::CollectiveOp>(op)) {
      name = c.getKind();
      rows = c.getRows();
      launches.push_back(Object{{"collective", c.getKind()}});
    } else {
      continue;
    }
    if (!rows)
      return kernelsError(llvm::formatv("@{0}: step {1} ('{2}') has no CUDA kernels (run "
                                        "moe-cuda-kernels)",
                                        program.getSymName(), steps.size(), name));
    steps.push_back(Object{{"step", int64_t(steps.size())},
                           {"op", name},
                           {"rows", *rows},
                           {"launches", std::move(launches)}});
  }
  Array scratch;
  for (int64_t bytes : kernels.getScratchBytes())
    scratch.push_back(Object{{"bytes", bytes}});
  Object sampling;
  if (!kernels.getSampling().empty() && !kernels.getSampling().front().empty())
    sampling["argmax"] =
        dispatchJson(cast<exec::DispatchOp>(kernels.getSampling().front().front()));
  EmittedProgram result;
  result.source = kernels.getSource().str();
  for (StringRef n : kernels.getNames().getAsValueRange<StringAttr>())
    result.kernels.push_back(n.str());
  result.table = Object{{"format", 2},
                        {"kernels", int64_t(result.kernels.size())},
                        {"scratch", std::move(scratch)},
                        {"rope_tables", attributeJson(kernels.getRopeTables())},
                        {"steps", std::move(steps)},
                        {"sampling", std::move(sampling)}};
  return result;
}
