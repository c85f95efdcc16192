//===- Entries.cpp - several entry points per rank ---------------*- C++ -*-===//
//
// moe-split-entries and moe-join-entries: a plan whose ranks hold a prefill
// and a decode program. The model is copied into one nested module per
// entry with its own workload (the decode entry's steps hold one token per
// sequence: smaller dispatch blocks and buffers); the pipeline runs the
// passes between the two on each nested module, and the join gathers the
// exec programs with the schedule that says which entry runs each phase of
// generation. Training's forward / backward / optimizer programs are
// entries of the same kind.
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/Exec/IR/ExecOps.h"
#include "moe/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/STLExtras.h"

namespace moe {
#define GEN_PASS_DEF_MOESPLITENTRIES
#define GEN_PASS_DEF_MOEJOINENTRIES
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;

namespace {

constexpr llvm::StringLiteral kEntryAttr = "moe.entry";
constexpr llvm::StringLiteral kWorkloadAttr = "moe.workload";

int64_t workloadValue(DictionaryAttr workload, StringRef key) {
  auto value = workload ? workload.getAs<IntegerAttr>(key) : IntegerAttr();
  return value ? value.getInt() : 0;
}

struct SplitEntries : moe::impl::MoESplitEntriesBase<SplitEntries> {
  using MoESplitEntriesBase::MoESplitEntriesBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto workload = module->getAttrOfType<DictionaryAttr>(kWorkloadAttr);
    const int64_t maxTokens = workloadValue(workload, "max_batch_tokens");
    const int64_t maxSequences = workloadValue(workload, "max_sequences");
    if (maxTokens <= 0 || maxSequences <= 0) {
      module.emitError("moe-split-entries: expected moe.workload with max_batch_tokens and "
                       "max_sequences (run moe-specialize-workload first)");
      return signalPassFailure();
    }
    if (!module.getOps<ModuleOp>().empty()) {
      module.emitError("moe-split-entries: the module is split already");
      return signalPassFailure();
    }
    const int64_t decodeTokens =
        decodeMaxBatchTokens > 0 ? decodeMaxBatchTokens : std::min(maxSequences, maxTokens);
    if (decodeTokens > maxTokens) {
      module.emitError("moe-split-entries: expected decode-max-batch-tokens <= max_batch_tokens (")
          << maxTokens << ") but got " << decodeTokens;
      return signalPassFailure();
    }
    Builder b(module.getContext());
    SmallVector<NamedAttribute> decodeWorkload(workload.getValue());
    for (NamedAttribute &entry : decodeWorkload)
      if (entry.getName() == "max_batch_tokens")
        entry.setValue(b.getI64IntegerAttr(decodeTokens));

    auto copy = [&](StringRef name, DictionaryAttr entryWorkload) {
      auto nested = ModuleOp::create(module.getLoc(), name);
      for (NamedAttribute attr : module->getAttrs())
        nested->setAttr(attr.getName(), attr.getValue());
      nested->setAttr(kWorkloadAttr, entryWorkload);
      nested->setAttr(kEntryAttr, b.getStringAttr(name));
      IRMapping mapping;
      for (Operation &op : module.getBody()->getOperations())
        nested.getBody()->push_back(op.clone(mapping));
      return nested;
    };
    ModuleOp prefill = copy("prefill", workload);
    ModuleOp decode = copy("decode", b.getDictionaryAttr(decodeWorkload));
    for (Operation &op : llvm::make_early_inc_range(module.getBody()->getOperations()))
      op.erase();
    module.getBody()->push_back(prefill);
    module.getBody()->push_back(decode);
  }
};

/// The declarations of `kind` in `program`, in order.
template <typename OpT>
SmallVector<Operation *> declarations(moe::exec::ProgramOp program) {
  SmallVector<Operation *> ops;
  for (auto op : program.getBody().front().getOps<OpT>())
    ops.push_back(op);
  return ops;
}

/// True when both lists declare the same things (attributes and types).
bool sameDeclarations(ArrayRef<Operation *> a, ArrayRef<Operation *> b) {
  return a.size() == b.size() && llvm::all_of(llvm::zip(a, b), [](auto pair) {
           auto [x, y] = pair;
           return x->getAttrDictionary() == y->getAttrDictionary() &&
                  x->getResultTypes() == y->getResultTypes();
         });
}

struct JoinEntries : moe::impl::MoEJoinEntriesBase<JoinEntries> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    ModuleOp prefill, decode;
    for (ModuleOp nested : module.getOps<ModuleOp>()) {
      if (nested.getSymName() == "prefill")
        prefill = nested;
      else if (nested.getSymName() == "decode")
        decode = nested;
    }
    if (!prefill || !decode || llvm::range_size(module.getBody()->getOperations()) != 2) {
      module.emitError("moe-join-entries: expected exactly `module @prefill` and `module "
                       "@decode` (moe-split-entries)");
      return signalPassFailure();
    }
    SmallVector<moe::exec::ProgramOp> first(prefill.getOps<moe::exec::ProgramOp>());
    SmallVector<moe::exec::ProgramOp> second(decode.getOps<moe::exec::ProgramOp>());
    if (first.empty()) {
      prefill.emitError("moe-join-entries: expected exec.program ops (run moe-lower-to-exec)");
      return signalPassFailure();
    }
    if (first.size() != second.size()) {
      decode.emitError("moe-join-entries: the decode entry has ")
          << second.size() << " programs but the prefill entry " << first.size();
      return signalPassFailure();
    }
    // The runtime binds a rank's weights once and shares its KV caches
    // between its entries: they must declare the same ones.
    for (auto [p, d] : llvm::zip(first, second)) {
      if (p.getStage() != d.getStage()) {
        d.emitError("moe-join-entries: stage ")
            << d.getStage() << " where the prefill entry has stage " << p.getStage();
        return signalPassFailure();
      }
      const char *differs =
          !sameDeclarations(declarations<moe::exec::WeightOp>(p),
                            declarations<moe::exec::WeightOp>(d))    ? "weights"
          : !sameDeclarations(declarations<moe::exec::KVCacheOp>(p),
                              declarations<moe::exec::KVCacheOp>(d)) ? "KV caches"
                                                                     : nullptr;
      if (differs) {
        d.emitError("moe-join-entries: the decode entry's ")
            << differs << " differ from the prefill entry's at stage " << p.getStage();
        return signalPassFailure();
      }
    }

    Builder b(module.getContext());
    auto prefillWorkload = prefill->getAttrOfType<DictionaryAttr>(kWorkloadAttr);
    auto decodeWorkload = decode->getAttrOfType<DictionaryAttr>(kWorkloadAttr);
    const int64_t decodeTokens = workloadValue(decodeWorkload, "max_batch_tokens");
    for (NamedAttribute attr : prefill->getAttrs())
      if (attr.getName() != kEntryAttr && attr.getName() != SymbolTable::getSymbolAttrName())
        module->setAttr(attr.getName(), attr.getValue());
    module->setAttr("moe.schedule",
                    b.getDictionaryAttr({b.getNamedAttr("decode", b.getStringAttr("decode")),
                                         b.getNamedAttr("prefill", b.getStringAttr("prefill"))}));
    Block *body = module.getBody();
    for (Operation &op : llvm::make_early_inc_range(prefill.getBody()->getOperations()))
      op.moveBefore(body, body->end());
    for (moe::exec::ProgramOp p : first)
      p.setEntry("prefill");
    for (moe::exec::ProgramOp d : second) {
      d.setSymName((d.getSymName() + "_decode").str());
      d.setEntry("decode");
      if (decodeTokens != workloadValue(prefillWorkload, "max_batch_tokens"))
        d->setAttr("max_batch_tokens", b.getI64IntegerAttr(decodeTokens));
      d->moveBefore(body, body->end());
    }
    prefill.erase();
    decode.erase();
  }
};

} // namespace
