//===- VerifyCollectives.cpp - every rank's collectives match ----*- C++ -*-===//
//
// A proof by simulation: programs are straight-line and every collective's
// group and shapes are static, so the sequence of collectives a rank issues
// is fixed at compile time, whatever the routing. Each rank gets a cursor
// into its sequence; a collective completes when every member of its group
// stands at a matching one (same op, mesh, axis, operand types), a send when
// its peer stands at the matching recv (rendezvous: a conservative model of
// MPI, which may also block in a send). If the cursors stop before every
// sequence ends, some ranks would wait forever: the pass names them.
// moe-verify-collectives runs the proof on the per-rank functions of the
// moe dialect; moe-verify-exec-collectives on the exec programs a plan is
// written from, a training plan's train program (as many times as a
// replica runs it per update) followed by its optimizer program.
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/Exec/IR/ExecOps.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Mesh/IR/MeshOps.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <deque>
#include <optional>

namespace moe {
#define GEN_PASS_DEF_MOEVERIFYCOLLECTIVES
#define GEN_PASS_DEF_MOEVERIFYEXECCOLLECTIVES
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;
namespace exec = moe::exec;

namespace {

struct Degrees {
  int64_t dp = 1, pp = 1, tp = 1, ep = 1, etp = 1;
  int64_t world() const { return dp * pp * tp; }
  int64_t edp() const { return dp * tp / (ep * etp); }
};

/// A rank's coordinates on both meshes, in mesh-axis order:
/// @mesh (pp, dp, tp), @experts (pp, edp, ep, etp).
struct Coords {
  SmallVector<int64_t> attention;
  SmallVector<int64_t> experts;
};

Coords coordsOf(const Degrees &d, int64_t rank) {
  int64_t perStage = d.world() / d.pp, pp = rank / perStage,
          inner = rank % perStage;
  return {{pp, inner / d.tp, inner % d.tp},
          {pp, inner / (d.etp * d.ep), (inner / d.etp) % d.ep, inner % d.etp}};
}

int64_t rankOf(const Degrees &d, bool experts, ArrayRef<int64_t> c) {
  if (!experts)
    return (c[0] * d.dp + c[1]) * d.tp + c[2];
  return ((c[0] * d.edp() + c[1]) * d.ep + c[2]) * d.etp + c[3];
}

/// The ranks of `rank`'s group along `axis` of a mesh, by coordinate.
SmallVector<int64_t> groupOf(const Degrees &d, int64_t rank, bool experts,
                             int64_t axis) {
  Coords c = coordsOf(d, rank);
  SmallVector<int64_t> coords = experts ? c.experts : c.attention;
  SmallVector<int64_t> sizes =
      experts ? SmallVector<int64_t>{d.pp, d.edp(), d.ep, d.etp}
              : SmallVector<int64_t>{d.pp, d.dp, d.tp};
  SmallVector<int64_t> group;
  for (int64_t q = 0; q < sizes[axis]; ++q) {
    coords[axis] = q;
    group.push_back(rankOf(d, experts, coords));
  }
  return group;
}

/// One collective of a rank's schedule, as the simulation sees it.
struct Event {
  Operation *op = nullptr;
  /// A send or recv (to / from `stage`), else a collective over a group.
  bool peer = false, sending = false;
  /// (A send or recv of an optimizer program: a table tied over the first
  /// and the last stage.)
  bool betweenEnds = false;
  int64_t stage = 0;
  bool experts = false; ///< the group's mesh: @experts (else @mesh)
  int64_t axis = 0;     ///< the group's axis on its mesh
  /// A fused exchange with the peer (a pipeline schedule's step fused with
  /// the one before: that step's sends and this one's receives at once):
  /// the shapes it sends and receives, which the peer's must mirror.
  bool pair = false;
  std::string sends, recvs;
  std::string match;    ///< what the members must agree on: op, mesh, axis
  std::string shape;    ///< and then the operands' shapes
  std::string text;     ///< the op in messages
};

std::string locationOf(Operation *op) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << op->getLoc();
  return s;
}

/// A moe-dialect collective (moe.all_reduce, all_gather, all_to_all, send,
/// recv), or nothing.
std::optional<Event> moeEvent(Operation *op) {
  if (!isa<moe::AllReduceOp, moe::AllGatherOp, moe::AllToAllOp, moe::SendOp, moe::RecvOp>(op))
    return std::nullopt;
  Event e;
  e.op = op;
  std::string types;
  llvm::raw_string_ostream ts(types);
  llvm::interleaveComma(op->getOperandTypes(), ts);
  if (isa<moe::RecvOp>(op))
    ts << op->getResult(0).getType();
  std::string text;
  llvm::raw_string_ostream os(text);
  os << op->getName().stripDialect();
  if (auto mesh = op->getAttrOfType<FlatSymbolRefAttr>("mesh")) {
    e.experts = mesh.getValue() == "experts";
    e.axis = op->getAttrOfType<IntegerAttr>("axis").getInt();
    os << " over @" << mesh.getValue() << "[" << e.axis << "]";
    e.match = llvm::formatv("{0} {1} {2}", op->getName().stripDialect(), mesh.getValue(), e.axis);
  }
  if (auto stage = op->getAttrOfType<IntegerAttr>("stage")) {
    e.peer = true;
    e.sending = isa<moe::SendOp>(op);
    e.stage = stage.getInt();
    os << (e.sending ? " to stage " : " from stage ") << e.stage;
  }
  // A send's input meets the recv's result; a group's operands and results.
  if (e.peer) {
    e.shape = llvm::formatv("{0}", e.sending ? op->getOperand(0).getType()
                                             : op->getResult(0).getType());
  } else {
    std::string results;
    llvm::raw_string_ostream rs(results);
    llvm::interleaveComma(op->getResultTypes(), rs);
    e.shape = types + " -> " + results;
  }
  os << " (" << types << ") at " << op->getLoc();
  e.text = text;
  return e;
}

/// The fixed degrees of the module's layout (moe.sharding).
FailureOr<Degrees> degreesOf(ModuleOp module) {
  auto sharding = module->getAttrOfType<DictionaryAttr>("moe.sharding");
  if (!sharding) {
    module.emitError("expected moe.sharding (the world's degrees)");
    return failure();
  }
  auto get = [&](StringRef key) {
    auto a = sharding.getAs<IntegerAttr>(key);
    return a ? a.getInt() : int64_t(1);
  };
  return Degrees{get("dp"), get("pp"), get("tp"), get("ep"), get("etp")};
}

/// Assigns `program` to its ranks in `programOf`: those its `moe.ranks`
/// lists (the hand-written per-rank form), else every rank still without
/// one whose pp coordinate is `stage` (none: no stage). Fails on a rank
/// outside the world.
LogicalResult assignRanks(Operation *program, std::optional<int64_t> stage, const Degrees &d,
                          SmallVectorImpl<Operation *> &programOf) {
  const int64_t world = d.world();
  if (auto ranks = program->getAttrOfType<DenseI64ArrayAttr>("moe.ranks")) {
    for (int64_t r : ranks.asArrayRef()) {
      if (r < 0 || r >= world)
        return program->emitError("moe.ranks names rank ")
               << r << " outside the world of " << world;
      programOf[r] = program;
    }
    return success();
  }
  if (stage)
    for (int64_t r = 0; r < world; ++r)
      if (!programOf[r] && coordsOf(d, r).attention[0] == *stage)
        programOf[r] = program;
  return success();
}

/// Runs every rank's cursor through its sequence (the proof above); fails
/// naming the ranks and ops that would wait forever, or the members that
/// meet with different shapes. `what` names the schedule in messages.
LogicalResult simulate(ModuleOp module, const Degrees &d,
                       const std::vector<std::vector<Event>> &sequence, StringRef what) {
  const int64_t world = d.world();
  std::vector<size_t> cursor(world, 0);
  auto at = [&](int64_t r) -> const Event * {
    return cursor[r] < sequence[r].size() ? &sequence[r][cursor[r]] : nullptr;
  };
  // Ranks whose cursor may now be able to move.
  std::deque<int64_t> ready;
  for (int64_t r = 0; r < world; ++r)
    ready.push_back(r);
  auto advance = [&](int64_t r) {
    ++cursor[r];
    ready.push_back(r);
  };
  while (!ready.empty()) {
    int64_t r = ready.front();
    ready.pop_front();
    const Event *e = at(r);
    if (!e)
      continue;
    if (e->peer) {
      // Whichever of the pair arrives last completes it.
      Coords c = coordsOf(d, r);
      // (A pipelined training program's backward sends to the stage
      // before and receives from the one after; an optimizer program's
      // tied table goes between the first and the last.)
      const bool ends = e->betweenEnds && std::min(e->stage, c.attention[0]) == 0 &&
                        std::max(e->stage, c.attention[0]) == d.pp - 1;
      if ((std::abs(e->stage - c.attention[0]) != 1 && !ends) || e->stage < 0 ||
          e->stage >= d.pp)
        return e->op->emitError("rank ") << r << (e->sending ? " sends to" : " receives from")
                                         << " stage " << e->stage << " on stage "
                                         << c.attention[0];
      SmallVector<int64_t> peerCoords(c.attention);
      peerCoords[0] = e->stage;
      int64_t peer = rankOf(d, false, peerCoords);
      // A send meets its peer's recv from this stage, a fused exchange the
      // peer's mirrored one.
      const Event *other = at(peer);
      if (other && other->peer && other->stage == c.attention[0] &&
          (e->pair ? other->pair : !other->pair && other->sending != e->sending)) {
        if (e->pair ? other->sends != e->recvs || other->recvs != e->sends
                    : other->shape != e->shape)
          return e->op->emitError(llvm::formatv("rank {0}: {1} meets {2} on rank {3}: "
                                                "different shapes",
                                                r, e->text, other->text, peer));
        advance(r);
        advance(peer);
      }
      continue;
    }
    if (e->axis >= (e->experts ? 4 : 3))
      return e->op->emitError("axis ") << e->axis << " is not an axis of @"
                                       << (e->experts ? "experts" : "mesh");
    SmallVector<int64_t> group = groupOf(d, r, e->experts, e->axis);
    bool all = true;
    for (int64_t m : group) {
      const Event *other = at(m);
      if (!other || other->peer || other->match != e->match) {
        all = false;
        break;
      }
      if (other->shape != e->shape)
        return e->op->emitError(llvm::formatv(
            "ranks {0} and {1} meet in {2} with different shapes: {3} vs {4}", r, m,
            e->match.substr(0, e->match.find(' ')), e->text, other->text));
    }
    if (all)
      for (int64_t m : group)
        advance(m);
  }

  std::string stuck;
  int64_t blocked = 0;
  for (int64_t r = 0; r < world; ++r)
    if (const Event *e = at(r)) {
      if (blocked++ < 8)
        stuck += llvm::formatv("\n  rank {0} waits in {1}", r, e->text);
    }
  if (blocked)
    return module.emitError(llvm::formatv(
        "collectives{0} do not match: {1} of {2} ranks would wait forever (deadlock):{3}{4}",
        what.empty() ? std::string() : (" of " + what).str(), blocked, world, stuck,
        blocked > 8 ? "\n  ..." : ""));
  return success();
}

struct VerifyCollectives
    : moe::impl::MoEVerifyCollectivesBase<VerifyCollectives> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<Degrees> degrees = degreesOf(module);
    if (failed(degrees))
      return signalPassFailure();
    const Degrees &d = *degrees;
    int64_t world = d.world();

    // Each rank's program: moe.ranks lists it, else moe.stage is its pp. A
    // pipelined training program's stage has a forward function (entry
    // "train_forward") before it: one micro-batch's forward, then its
    // backward (moe-verify-exec-collectives proves the plan's schedule of
    // every micro-batch).
    SmallVector<Operation *> programOf(world, nullptr), forwardOf(world, nullptr);
    for (auto fn : module.getOps<func::FuncOp>()) {
      auto stage = fn->getAttrOfType<IntegerAttr>("moe.stage");
      auto entry = fn->getAttrOfType<StringAttr>("moe.entry");
      const bool forwardPart = entry && entry.getValue() == "train_forward";
      if (failed(assignRanks(fn, stage ? std::optional<int64_t>(stage.getInt()) : std::nullopt,
                             d, forwardPart ? forwardOf : programOf)))
        return signalPassFailure();
    }
    std::vector<std::vector<Event>> sequence(world);
    for (int64_t r = 0; r < world; ++r) {
      if (!programOf[r]) {
        module.emitError("rank ") << r << " has no program";
        return signalPassFailure();
      }
      // A collective still to be placed (moe-insert-collectives) cannot be
      // proven: refuse it rather than prove the schedule without it.
      Operation *unplaced = nullptr;
      for (Operation *program : {forwardOf[r], programOf[r]})
        if (program)
          program->walk([&](Operation *op) {
            if (std::optional<Event> e = moeEvent(op))
              sequence[r].push_back(*e);
            if (!unplaced && moe::awaitsCollective(op))
              unplaced = op;
          });
      if (unplaced) {
        unplaced->emitError("a collective is not placed yet (run moe-insert-collectives first)");
        return signalPassFailure();
      }
    }
    if (failed(simulate(module, d, sequence, "")))
      return signalPassFailure();
    module->setAttr("moe.collectives_verified",
                    UnitAttr::get(module.getContext()));
  }
};

/// An exec buffer's or weight's shape in messages and matches.
std::string execShape(Value v) {
  if (auto b = v.getDefiningOp<exec::BufferOp>()) {
    std::string s = llvm::formatv("{0} {1}x{2}", b.getElementType(), b.getRowsAttr().getInt(),
                                  b.getWidthAttr().getInt());
    if (auto logical = b.getLogicalRowsAttr())
      s += llvm::formatv(" of {0}", logical.getInt());
    return s;
  }
  if (auto w = v.getDefiningOp<exec::WeightOp>())
    return llvm::formatv("'{0}' {1}", w.getTensor(), w.getTensorType());
  return "?";
}

/// An exec.collective of program `program`, as an event.
Event execEvent(exec::CollectiveOp c, exec::ProgramOp program) {
  Event e;
  e.op = c;
  std::string operands;
  llvm::raw_string_ostream os(operands);
  auto list = [&](StringRef label, ValueRange values) {
    if (values.empty())
      return;
    os << (operands.empty() ? "" : " ") << label << "(";
    llvm::interleaveComma(values, os, [&](Value v) { os << execShape(v); });
    os << ")";
  };
  list("ins", c.getIns());
  list("weights", c.getWeights());
  list("outs", c.getOuts());
  std::string constants;
  llvm::raw_string_ostream cs(constants);
  cs << c.getConstants();
  std::string text = c.getKind().str();
  if (auto mesh = c.getMesh()) {
    static const char *attention[] = {"pp", "dp", "tp"};
    static const char *experts[] = {"pp", "edp", "ep", "etp"};
    e.experts = *mesh == "experts";
    StringRef axis = *c.getAxis();
    ArrayRef<const char *> names = e.experts ? ArrayRef(experts) : ArrayRef(attention);
    e.axis = llvm::find(names, axis) - names.begin(); // (past the end: refused)
    e.match = llvm::formatv("{0} {1} {2}", c.getKind(), *mesh, axis);
    text += llvm::formatv(" over @{0}[\"{1}\"]", *mesh, axis);
  } else {
    e.peer = true;
    e.sending = c.getKind() == "send";
    auto stage = c.getConstants().getAs<IntegerAttr>("stage");
    e.stage = stage ? stage.getInt() : -1;
    e.betweenEnds = program.getEntry() == "optimizer";
    text += llvm::formatv(e.sending ? " to stage {0}" : " from stage {0}", e.stage);
  }
  // A send's input meets the recv's output; a group's operands and
  // constants (shard_rows) all of them.
  e.shape = e.peer ? execShape(e.sending ? c.getIns()[0] : c.getOuts()[0])
                   : operands + " " + constants;
  e.text = llvm::formatv("{0} ({1}){2} in @{3} at {4}", text, operands,
                         e.peer || c.getConstants().empty() ? std::string() : " " + constants,
                         program.getSymName(), locationOf(c));
  return e;
}

/// A pipelined training plan's update on every rank: its stage's
/// moe.pipeline_schedule (moe-schedule-pipeline), each step its forward or
/// backward program's collectives, a fused step's receives and the sends
/// that end the step before it one exchange; then the optimizer program.
LogicalResult verifyPipeline(ModuleOp module, const Degrees &d, ArrayAttr schedule,
                             llvm::MapVector<StringRef, SmallVector<Operation *>> &programs) {
  const int64_t world = d.world();
  for (StringRef entry : {"train", "train_forward", "optimizer"})
    if (!programs.count(entry))
      return module.emitError("moe.pipeline_schedule: no '") << entry << "' programs";
  if (int64_t(schedule.size()) != d.pp)
    return module.emitError("moe.pipeline_schedule: ")
           << schedule.size() << " stages' steps for pp = " << d.pp;
  std::vector<std::vector<Event>> sequence(world);
  for (int64_t r = 0; r < world; ++r) {
    const int64_t stage = coordsOf(d, r).attention[0];
    auto steps = dyn_cast<ArrayAttr>(schedule[stage]);
    if (!steps)
      return module.emitError("moe.pipeline_schedule: stage ") << stage << " is not a list";
    std::vector<Event> &seq = sequence[r];
    size_t stepBegin = 0;
    for (Attribute a : steps) {
      auto name = dyn_cast<StringAttr>(a);
      StringRef text = name ? name.getValue() : "";
      const bool fused = text.consume_front("+");
      const bool backward = text.consume_front("B");
      int64_t micro = -1;
      if ((!backward && !text.consume_front("F")) || text.getAsInteger(10, micro) || micro < 0)
        return module.emitError("moe.pipeline_schedule: stage ")
               << stage << ": step " << a << " is not F<j>, B<j> or +F<j>, +B<j>";
      auto program = cast<exec::ProgramOp>(programs[backward ? "train" : "train_forward"][r]);
      std::vector<Event> events;
      for (auto c : program.getBody().front().getOps<exec::CollectiveOp>()) {
        events.push_back(execEvent(c, program));
        events.back().text += llvm::formatv(" (micro-batch {0}, {1} step {2})", micro,
                                            backward ? "backward" : "forward",
                                            name.getValue());
      }
      const size_t begin = seq.size();
      if (fused) {
        // The sends ending the step before, the receives starting this one.
        size_t firstSend = seq.size();
        while (firstSend > stepBegin && seq[firstSend - 1].peer && seq[firstSend - 1].sending &&
               !seq[firstSend - 1].pair)
          --firstSend;
        size_t recvs = 0;
        while (recvs < events.size() && events[recvs].peer && !events[recvs].sending)
          ++recvs;
        if (firstSend == seq.size() || recvs == 0)
          return program.emitError(llvm::formatv(
              "moe.pipeline_schedule: stage {0}'s step {1} is fused with the step before, but "
              "{2}",
              stage, name.getValue(),
              recvs == 0 ? "it starts with no receive" : "that step ends with no send"));
        Event pair = events.front();
        pair.pair = true;
        pair.text = llvm::formatv("exchange with stage {0}: ", pair.stage);
        for (size_t i = firstSend; i < seq.size(); ++i) {
          if (seq[i].stage != pair.stage)
            return program.emitError(llvm::formatv(
                "moe.pipeline_schedule: stage {0}'s step {1} fuses sends to stage {2} with "
                "receives from stage {3}",
                stage, name.getValue(), seq[i].stage, pair.stage));
          pair.sends += seq[i].shape + ";";
          pair.text += seq[i].text + "; ";
        }
        for (size_t i = 0; i < recvs; ++i) {
          if (events[i].stage != pair.stage)
            return program.emitError("moe.pipeline_schedule: a fused step receives from two "
                                     "stages");
          pair.recvs += events[i].shape + ";";
          pair.text += events[i].text + (i + 1 < recvs ? "; " : "");
        }
        seq.resize(firstSend);
        seq.push_back(pair);
        events.erase(events.begin(), events.begin() + recvs);
      }
      stepBegin = fused ? seq.size() - 1 : begin;
      seq.insert(seq.end(), events.begin(), events.end());
    }
    auto opt = cast<exec::ProgramOp>(programs["optimizer"][r]);
    for (auto c : opt.getBody().front().getOps<exec::CollectiveOp>())
      seq.push_back(execEvent(c, opt));
  }
  return simulate(module, d, sequence, "a pipelined training update (moe.pipeline_schedule, "
                                       "then optimizer)");
}

struct VerifyExecCollectives
    : moe::impl::MoEVerifyExecCollectivesBase<VerifyExecCollectives> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<Degrees> degrees = degreesOf(module);
    if (failed(degrees))
      return signalPassFailure();
    const Degrees &d = *degrees;
    const int64_t world = d.world();
    // Per entry, each rank's program: moe.ranks lists it, else its stage
    // is the rank's pp.
    llvm::MapVector<StringRef, SmallVector<Operation *>> programs;
    for (auto program : module.getOps<exec::ProgramOp>()) {
      SmallVector<Operation *> &of = programs[program.getEntry()];
      of.resize(world, nullptr);
      if (failed(assignRanks(program, program.getStage(), d, of)))
        return signalPassFailure();
    }
    for (auto &[entry, of] : programs)
      for (int64_t r = 0; r < world; ++r)
        if (!of[r]) {
          module.emitError("rank ") << r << " has no exec.program of entry '" << entry << "'";
          return signalPassFailure();
        }
    auto events = [&](Operation *op, std::vector<Event> &into, int64_t times) {
      auto program = cast<exec::ProgramOp>(op);
      for (int64_t t = 0; t < times; ++t)
        for (auto c : program.getBody().front().getOps<exec::CollectiveOp>())
          into.push_back(execEvent(c, program));
    };
    // A training plan's update: each replica runs the train program on its
    // share of the micro-batches, then the optimizer program. Every other
    // entry is a schedule of its own (every rank runs the same entry in a
    // step).
    auto optimizer = programs.find("optimizer");
    if (auto schedule = module->getAttrOfType<ArrayAttr>("moe.pipeline_schedule")) {
      if (failed(verifyPipeline(module, d, schedule, programs)))
        return signalPassFailure();
      module->setAttr("moe.exec_collectives_verified", UnitAttr::get(module.getContext()));
      return;
    }
    for (auto &[entry, of] : programs) {
      if (entry == "optimizer")
        continue;
      std::vector<std::vector<Event>> sequence(world);
      const bool update = entry == "train" && optimizer != programs.end();
      for (int64_t r = 0; r < world; ++r) {
        int64_t share = 1;
        if (update) {
          auto micro = optimizer->second[r]->getAttrOfType<IntegerAttr>("micro_batches");
          share = std::max<int64_t>(1, (micro ? micro.getInt() : 1) / d.dp);
        }
        events(of[r], sequence[r], share);
        if (update)
          events(optimizer->second[r], sequence[r], 1);
      }
      std::string what = update ? "a training update (train, then optimizer)"
                                : ("entry '" + entry + "'").str();
      if (failed(simulate(module, d, sequence, what)))
        return signalPassFailure();
    }
    if (optimizer != programs.end() && !programs.count("train")) {
      module.emitError("an optimizer program without a train program");
      return signalPassFailure();
    }
    module->setAttr("moe.exec_collectives_verified", UnitAttr::get(module.getContext()));
  }
};

} // namespace
