//===- AnnotateKernels.cpp - the CUDA target's view in the IR ---*- C++ -*-===//
//
// moe-annotate-kernels: runs the CUDA kernel emitter (moe/Target/Cuda.h) on
// the module's plan and attaches each step's launches to its op, so that
// `moe-opt --moe-annotate-kernels` prints the kernel-level lowering.
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/Exec/IR/ExecOps.h"
#include "moe/Target/Cuda.h"
#include "moe/Target/PlanWriter.h"
#include "moe/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/Support/FormatVariadic.h"

namespace moe {
#define GEN_PASS_DEF_MOEANNOTATEKERNELS
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;
using llvm::json::Array;
using llvm::json::Object;

namespace {

/// ceil(a * N / b) + c as text.
std::string gridDim(const llvm::json::Value &v, llvm::StringRef rows) {
  const Array &d = *v.getAsArray();
  int64_t a = *d[0].getAsInteger(), b = *d[1].getAsInteger(), c = *d[2].getAsInteger();
  if (a == 0)
    return std::to_string(c);
  std::string n = a == 1 ? rows.str() : llvm::formatv("{0}*{1}", a, rows).str();
  if (b != 1)
    n = llvm::formatv("ceil({0}/{1})", n, b).str();
  if (c)
    n += "+" + std::to_string(c);
  return n;
}

std::string describe(const Object &launch, llvm::StringRef stepRows) {
  if (auto c = launch.getString("collective"))
    return ("collective " + *c).str();
  llvm::StringRef rows = launch.getString("rows").value_or(stepRows);
  if (const Object *g = launch.getObject("gemm")) {
    std::string m;
    if (auto s = g->getString("m"))
      m = s->str();
    std::string text = llvm::formatv("gemm {0}x{1}x{2} ({3}, {4} {5} -> {6})", m,
                                     *g->getInteger("n"), *g->getInteger("k"),
                                     *g->getString("a"), *g->getString("b"),
                                     *g->getString("b_dtype"), *g->getString("c"))
                           .str();
    if (*g->getInteger("batch") > 1)
      text += llvm::formatv(" batched {0}", *g->getInteger("batch")).str();
    return text;
  }
  const Array &grid = *launch.getArray("grid");
  std::string params;
  for (const llvm::json::Value &p : *launch.getArray("params"))
    params += (params.empty() ? "" : ", ") + p.getAsString()->str();
  return llvm::formatv("{0}<<<({1}, {2}, {3}), {4}>>>({5})", *launch.getString("kernel"),
                       gridDim(grid[0], rows), gridDim(grid[1], rows), gridDim(grid[2], rows),
                       *launch.getInteger("block"), params)
      .str();
}

struct AnnotateKernels : moe::impl::MoEAnnotateKernelsBase<AnnotateKernels> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    llvm::Expected<llvm::json::Value> plan = moe::buildPlan(module);
    if (!plan) {
      module.emitError() << "moe-annotate-kernels: " << llvm::toString(plan.takeError());
      return signalPassFailure();
    }
    Object &root = *plan->getAsObject();
    Array &programs = *root.getArray("programs");
    // The programs in buildPlan's order (by stage).
    Builder b(module.getContext());
    for (auto [index, program] : llvm::enumerate(module.getOps<moe::exec::ProgramOp>())) {
      llvm::Expected<moe::cuda::EmittedProgram> emitted =
          moe::cuda::emitProgram(root, *programs[index].getAsObject(), int64_t(index));
      if (!emitted) {
        program.emitError() << "moe-annotate-kernels: " << llvm::toString(emitted.takeError());
        return signalPassFailure();
      }
      const Array &steps = *emitted->table.getArray("steps");
      size_t step = 0;
      for (Operation &op : program.getBody().front()) {
        if (!isa<moe::exec::LaunchOp, moe::exec::CollectiveOp>(op))
          continue;
        if (step >= steps.size())
          break;
        const Object &entry = *steps[step++].getAsObject();
        SmallVector<Attribute> launches;
        llvm::StringRef rows = entry.getString("rows").value_or("T");
        for (const llvm::json::Value &l : *entry.getArray("launches"))
          launches.push_back(b.getStringAttr(describe(*l.getAsObject(), rows)));
        op.setAttr("moe.cuda.launches", b.getArrayAttr(launches));
      }
    }
  }
};

} // namespace
