// The ops a plan's steps name, as the runtime knows them: one definition per
// op (runtime/src/ops/), holding its name in the plan, its attributes, the
// checks the plan reader runs on a step of it and its CPU kernel. The plan
// reader, the devices and the executor reach an op only through its
// definition: none of them names a model-level op (tests/runtime/
// check-no-model-ops.sh keeps it so). Adding an op: docs/adding-an-op.md.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace moert {

struct PlanStep;
class JsonFields;
class StepChecker;
namespace cpu {
class StepContext;
}

/// How a step moves data between ranks; the protocols are written once
/// (runtime/src/Collectives.h) for every device. None: a device kernel.
enum class Collective { None, AllReduce, AllGather, AllToAll, ReduceScatter, Send, Recv };

struct OpDef {
  /// What a step's behaviour depends on, beyond its kernels.
  enum Trait : unsigned {
    /// Reads a group ("mesh", "axis"): the collectives over a mesh axis.
    InGroup = 1u << 0,
    /// May carry "vocab_shard" (this rank's rows of the padded vocabulary).
    VocabShard = 1u << 1,
    /// May carry "head" (the LM head: computes the logit rows only).
    Head = 1u << 2,
    /// Its weight may be bound again by the LM head (a tied table).
    TiedTable = 1u << 3,
    /// Runs with no rows too (T = 0): every member of an expert group takes
    /// part, and expert GEMMs compute rows that other ranks sent.
    RunsEmpty = 1u << 4,
    /// Fills per-expert blocks from this rank's own tokens (sets the
    /// capacity factor of the expert GEMMs after it).
    FillsExpertBlocks = 1u << 5,
    /// Expert GEMMs grouped over the rows routed to each expert.
    GroupedExpertGemm = 1u << 6,
    /// Expert GEMMs over per-expert blocks: grouped over their counted rows
    /// when the blocks are dropless (capacity factor 0).
    ExpertBlockGemm = 1u << 7,
    /// A step of the backward pass: it reads weights the forward steps
    /// before it bound (and binds none first).
    Backward = 1u << 8,
    /// An optimizer's update: writes its weights in place (any weight, once
    /// per program; the device owns a plan's weights when it has these).
    UpdatesWeights = 1u << 9,
  };

  std::string_view name; ///< the plan's "op"
  Collective collective = Collective::None;
  unsigned traits = 0;
  /// Reads the op's own attributes (beyond the shared ones Plan::load
  /// reads: eps, heads, rope, routing, ...); may be null.
  void (*parse)(const JsonFields &attrs, PlanStep &step) = nullptr;
  /// Checks a step of this op against its buffers and weights (arity,
  /// dtypes, widths, shapes); fails with the step's one-line InputError.
  void (*check)(const StepChecker &checker, const PlanStep &step) = nullptr;
  /// The CPU kernel: runs the step over the context's rows and returns the
  /// rows of the steps after it (the LM head leaves the logit rows). Null
  /// for a collective (the executor runs its protocol).
  int64_t (*cpu)(cpu::StepContext &context) = nullptr;

  bool has(Trait t) const { return (traits & t) != 0; }
};

/// The op named `name` in a plan, or null.
const OpDef *findOp(std::string_view name);
/// Every op the runtime knows, in a fixed order.
const std::vector<const OpDef *> &registeredOps();

} // namespace moert
