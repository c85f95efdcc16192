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
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Mesh/IR/MeshOps.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <deque>

namespace moe {
#define GEN_PASS_DEF_MOEVERIFYCOLLECTIVES
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;

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

bool isCollective(Operation *op) {
  return isa<moe::AllReduceOp, moe::AllGatherOp, moe::AllToAllOp, moe::SendOp,
             moe::RecvOp>(op);
}

std::string describe(Operation *op) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << op->getName().stripDialect();
  if (auto mesh = op->getAttrOfType<FlatSymbolRefAttr>("mesh"))
    os << " over @" << mesh.getValue() << "["
       << op->getAttrOfType<IntegerAttr>("axis").getInt() << "]";
  if (auto stage = op->getAttrOfType<IntegerAttr>("stage"))
    os << (isa<moe::SendOp>(op) ? " to stage " : " from stage ") << stage.getInt();
  os << " (";
  llvm::interleaveComma(op->getOperandTypes(), os);
  if (isa<moe::RecvOp>(op))
    os << op->getResult(0).getType();
  os << ")";
  os << " at " << op->getLoc();
  return s;
}

struct VerifyCollectives
    : moe::impl::MoEVerifyCollectivesBase<VerifyCollectives> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto sharding = module->getAttrOfType<DictionaryAttr>("moe.sharding");
    if (!sharding) {
      module.emitError("expected moe.sharding (the world's degrees)");
      return signalPassFailure();
    }
    auto get = [&](StringRef key) {
      auto a = sharding.getAs<IntegerAttr>(key);
      return a ? a.getInt() : int64_t(1);
    };
    Degrees d{get("dp"), get("pp"), get("tp"), get("ep"), get("etp")};
    int64_t world = d.world();

    // Each rank's program: moe.ranks lists it, else moe.stage is its pp.
    std::vector<func::FuncOp> programOf(world);
    for (auto fn : module.getOps<func::FuncOp>()) {
      if (auto ranks = fn->getAttrOfType<DenseI64ArrayAttr>("moe.ranks")) {
        for (int64_t r : ranks.asArrayRef()) {
          if (r < 0 || r >= world) {
            fn.emitError("moe.ranks names rank ") << r << " outside the world of "
                                                  << world;
            return signalPassFailure();
          }
          programOf[r] = fn;
        }
        continue;
      }
      if (auto stage = fn->getAttrOfType<IntegerAttr>("moe.stage"))
        for (int64_t r = 0; r < world; ++r)
          if (!programOf[r] && coordsOf(d, r).attention[0] == stage.getInt())
            programOf[r] = fn;
    }
    std::vector<SmallVector<Operation *>> sequence(world);
    for (int64_t r = 0; r < world; ++r) {
      if (!programOf[r]) {
        module.emitError("rank ") << r << " has no program";
        return signalPassFailure();
      }
      // A collective still to be placed (moe-insert-collectives) cannot be
      // proven: refuse it rather than prove the schedule without it.
      Operation *unplaced = nullptr;
      programOf[r].walk([&](Operation *op) {
        if (isCollective(op))
          sequence[r].push_back(op);
        if (!unplaced && moe::awaitsCollective(op))
          unplaced = op;
      });
      if (unplaced) {
        unplaced->emitError("a collective is not placed yet (run moe-insert-collectives first)");
        return signalPassFailure();
      }
    }

    std::vector<size_t> cursor(world, 0);
    auto at = [&](int64_t r) -> Operation * {
      return cursor[r] < sequence[r].size() ? sequence[r][cursor[r]] : nullptr;
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
      Operation *op = at(r);
      if (!op)
        continue;
      if (isa<moe::SendOp, moe::RecvOp>(op)) {
        // Whichever of the pair arrives last completes it.
        Coords c = coordsOf(d, r);
        int64_t stage = isa<moe::SendOp>(op) ? cast<moe::SendOp>(op).getStage()
                                             : cast<moe::RecvOp>(op).getStage();
        bool sending = isa<moe::SendOp>(op);
        if (stage != c.attention[0] + (sending ? 1 : -1) || stage < 0 || stage >= d.pp) {
          op->emitError("rank ") << r << (sending ? " sends to" : " receives from")
                                 << " stage " << stage << " on stage " << c.attention[0];
          return signalPassFailure();
        }
        SmallVector<int64_t> peerCoords(c.attention);
        peerCoords[0] = stage;
        int64_t peer = rankOf(d, false, peerCoords);
        Operation *other = at(peer);
        Operation *send = sending ? op : other, *recvOp = sending ? other : op;
        auto s = dyn_cast_or_null<moe::SendOp>(send);
        auto v = dyn_cast_or_null<moe::RecvOp>(recvOp);
        if (s && v) {
          if (v.getType() != s.getInput().getType()) {
            op->emitError(llvm::formatv("rank {0}: {1} meets {2} on rank {3}: "
                                        "different shapes",
                                        r, describe(op), describe(other), peer));
            return signalPassFailure();
          }
          advance(r);
          advance(peer);
        }
        continue;
      }
      auto mesh = op->getAttrOfType<FlatSymbolRefAttr>("mesh");
      int64_t axis = op->getAttrOfType<IntegerAttr>("axis").getInt();
      bool experts = mesh.getValue() == "experts";
      if (axis >= (experts ? 4 : 3)) {
        op->emitError("axis ") << axis << " is not an axis of @" << mesh.getValue();
        return signalPassFailure();
      }
      SmallVector<int64_t> group = groupOf(d, r, experts, axis);
      bool all = true;
      for (int64_t m : group) {
        Operation *other = at(m);
        if (!other || other->getName() != op->getName() ||
            other->getAttr("mesh") != op->getAttr("mesh") ||
            other->getAttr("axis") != op->getAttr("axis")) {
          all = false;
          break;
        }
        if (other->getOperandTypes() != op->getOperandTypes() ||
            other->getResultTypes() != op->getResultTypes()) {
          op->emitError(llvm::formatv(
              "ranks {0} and {1} meet in {2} with different shapes: {3} vs {4}",
              r, m, op->getName().stripDialect(), describe(op), describe(other)));
          return signalPassFailure();
        }
      }
      if (all)
        for (int64_t m : group)
          advance(m);
    }

    std::string stuck;
    int64_t blocked = 0;
    for (int64_t r = 0; r < world; ++r)
      if (Operation *op = at(r)) {
        if (blocked++ < 8)
          stuck += llvm::formatv("\n  rank {0} waits in {1}", r, describe(op));
      }
    if (blocked) {
      module.emitError(llvm::formatv(
          "collectives do not match: {0} of {1} ranks would wait forever "
          "(deadlock):{2}{3}",
          blocked, world, stuck, blocked > 8 ? "\n  ..." : ""));
      return signalPassFailure();
    }
    module->setAttr("moe.collectives_verified",
                    UnitAttr::get(module.getContext()));
  }
};

} // namespace
