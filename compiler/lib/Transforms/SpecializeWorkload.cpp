//===- SpecializeWorkload.cpp - fix the compiled-for workload ----*- C++ -*-===//
#include "moe/PlanSchema.h"
#include "moe/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"

#include <tuple>

namespace moe {
#define GEN_PASS_DEF_MOESPECIALIZEWORKLOAD
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;

namespace {
struct SpecializeWorkload
    : moe::impl::MoESpecializeWorkloadBase<SpecializeWorkload> {
  using MoESpecializeWorkloadBase::MoESpecializeWorkloadBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    int64_t maxBatchTokens = this->maxBatchTokens, maxSeqLen = this->maxSeqLen,
            maxSequences = this->maxSequences;
    if (maxBatchTokens <= 0 || maxSeqLen <= 0 || maxSequences <= 0) {
      module.emitError("expected max-batch-tokens, max-seq-len and "
                       "max-sequences > 0 but got ")
          << maxBatchTokens << ", " << maxSeqLen << " and " << maxSequences;
      return signalPassFailure();
    }
    // moert's limits (moe/PlanSchema.h): a plan beyond them is never written.
    for (auto [name, value, limit] :
         {std::tuple<const char *, int64_t, int64_t>{"max-batch-tokens", maxBatchTokens,
                                                     moe::plan::kMaxBatchTokens},
          {"max-seq-len", maxSeqLen, moe::plan::kMaxSeqLen},
          {"max-sequences", maxSequences, moe::plan::kMaxSequences}})
      if (value > limit) {
        module.emitError("expected ") << name << " <= " << limit
                                      << " (the plan format's limit) but got " << value;
        return signalPassFailure();
      }
    if (auto limit = module->getAttrOfType<IntegerAttr>(
            "moe.max_position_embeddings")) {
      if (maxSeqLen > limit.getInt()) {
        module.emitError("expected max-seq-len <= ")
            << limit.getInt() << " (the model's max_position_embeddings) but got "
            << maxSeqLen;
        return signalPassFailure();
      }
    }
    Builder b(module.getContext());
    module->setAttr("moe.workload",
                    b.getDictionaryAttr({
                        b.getNamedAttr("max_batch_tokens",
                                       b.getI64IntegerAttr(maxBatchTokens)),
                        b.getNamedAttr("max_seq_len", b.getI64IntegerAttr(maxSeqLen)),
                        b.getNamedAttr("max_sequences",
                                       b.getI64IntegerAttr(maxSequences)),
                    }));
  }
};
} // namespace
