//===- AppendOptimizer.cpp - a train program's optimizer program --*- C++ -*-===//
//
// moe-append-optimizer: the optimizer as a compiled program beside the
// train program (docs/training.md, "The optimizer"). The train program
// adds its gradients into persistent state buffers; the optimizer program,
// run once per global batch, computes the learning rate of its step, the
// global gradient norm and clipping coefficient, and updates every weight
// with AdamW, its moments in state buffers of its own. Over data-parallel
// replicas (moe.sharding's dp > 1) it first adds the replicas' gradient sums
// and expert loads (all_reduce over dp): `micro_batches` counts the
// micro-batches of the whole update, each replica running its share. A
// replica that adds several gradients keeps compensated sums (grad_err
// states, added back by grad_total), so that an update is the same on every
// layout. With zero=1 the moments and masters are sharded between the
// replicas (ZeRO-1): each updates its rows, then the weights are gathered.
// Under expert or tensor parallelism an expert stack's sums are its rank's
// (its experts', its rows'), added over edp only; the norm adds the
// replicated weights' squares once, the experts' over ep and etp, and the
// tensor-parallel parts' over tp (with ZeRO-1: over dp first).
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/Exec/IR/ExecOps.h"
#include "moe/Transforms/Layout.h"
#include "moe/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringMap.h"

namespace moe {
#define GEN_PASS_DEF_MOEAPPENDOPTIMIZER
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;
namespace exec = moe::exec;

namespace {

/// The [rows, width] of a weight's f32 state: its elements as rows of its
/// last dimension (an expert stack's experts one after another).
std::pair<int64_t, int64_t> stateShape(exec::WeightOp w) {
  auto type = cast<RankedTensorType>(w.getTensorType());
  const int64_t width = type.getShape().back();
  return {type.getNumElements() / width, width};
}

struct AppendOptimizer : moe::impl::MoEAppendOptimizerBase<AppendOptimizer> {
  using MoEAppendOptimizerBase::MoEAppendOptimizerBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (!checkOptions(module))
      return signalPassFailure();
    SmallVector<exec::ProgramOp> trains;
    for (auto program : module.getOps<exec::ProgramOp>())
      if (program.getEntry() == "train")
        trains.push_back(program);
    if (trains.empty()) {
      module.emitError("moe-append-optimizer: no exec.program of entry 'train' (run "
                       "moe-lower-to-exec on a training module first)");
      return signalPassFailure();
    }
    for (exec::ProgramOp train : trains)
      if (failed(append(train)))
        return signalPassFailure();
  }

  bool checkOptions(ModuleOp module) {
    auto fail = [&](const Twine &message) {
      module.emitError("moe-append-optimizer: ") << message;
      return false;
    };
    if (!(lr > 0) || !(minLr >= 0) || minLr > lr)
      return fail("expected lr > 0 and 0 <= min-lr <= lr");
    if (schedule != "constant" && schedule != "cosine")
      return fail("schedule '" + schedule + "': expected constant or cosine");
    if (warmupSteps < 0 || decaySteps < 0)
      return fail("expected warmup-steps >= 0 and decay-steps >= 0");
    if (schedule == "cosine" && decaySteps <= warmupSteps)
      return fail("the cosine schedule needs decay-steps > warmup-steps");
    if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
      return fail("expected betas in [0, 1)");
    if (!(eps > 0) || !(weightDecay >= 0) || !(clipGradNorm >= 0))
      return fail("expected eps > 0, weight-decay >= 0 and clip-grad-norm >= 0");
    if (microBatches < 1)
      return fail("expected micro-batches >= 1");
    if (!(expertBiasUpdateRate >= 0))
      return fail("expected expert-bias-update-rate >= 0");
    if (zero < 0 || zero > 2)
      return fail("zero=" + Twine(int64_t(zero)) + ": expected 0, 1 or 2");
    return true;
  }

  /// A degree of the module's layout (moe.sharding), 1 if none.
  static int64_t degree(exec::ProgramOp train, StringRef key) {
    auto module = train->getParentOfType<ModuleOp>();
    auto sharding = module->getAttrOfType<DictionaryAttr>("moe.sharding");
    auto d = sharding ? sharding.getAs<IntegerAttr>(key) : IntegerAttr();
    return d ? d.getInt() : 1;
  }
  /// The data-parallel degree of the module's layout.
  static int64_t dataParallel(exec::ProgramOp train) { return degree(train, "dp"); }

  LogicalResult append(exec::ProgramOp train) {
    Block &body = train.getBody().front();
    auto ret = cast<exec::ReturnOp>(body.getTerminator());
    if (microBatches % dataParallel(train))
      return train.emitError("moe-append-optimizer: ")
             << int64_t(microBatches) << " micro-batches of an update do not split between "
             << dataParallel(train) << " data-parallel replicas";
    // (ZeRO shards between the ranks that hold the same weight: the
    // replicas, or an expert stack's edp group, which TP without etp makes
    // of one replica's ranks.)
    if (zero >= 1 && dataParallel(train) == 1 &&
        degree(train, "tp") / (degree(train, "ep") * degree(train, "etp")) <= 1)
      return train.emitError("moe-append-optimizer: zero=")
             << int64_t(zero)
             << " needs data-parallel replicas (moe.sharding's dp > 1) or an expert group of "
                "several ranks (tp / (ep x etp) > 1)";
    if (ret.getGradients().empty())
      return train.emitError("moe-append-optimizer: @")
             << train.getSymName() << " computes no gradients (compiled with --loss-only?)";
    SmallVector<exec::WeightOp> weights;
    for (auto w : body.getOps<exec::WeightOp>())
      weights.push_back(w);
    SmallVector<exec::WeightOp> params;
    for (Value w : ret.getGradientOf()) {
      auto weight = w.getDefiningOp<exec::WeightOp>();
      Type dtype = cast<RankedTensorType>(weight.getTensorType()).getElementType();
      if (!dtype.isF32() && !dtype.isBF16())
        return train.emitError("moe-append-optimizer: '")
               << weight.getTensor() << "' is " << dtype
               << ": not supported yet: training weights of another dtype than f32 or bf16";
      params.push_back(weight);
    }
    MLIRContext *ctx = &getContext();
    Type bufferType = exec::BufferType::get(ctx);
    Type f32 = Float32Type::get(ctx);
    auto state = [&](OpBuilder &b, Location loc, StringRef kind, exec::WeightOp w) {
      auto [rows, width] = stateShape(w);
      return b.create<exec::BufferOp>(loc, bufferType, f32, rows, width,
                                      b.getStringAttr(kind + ":" + w.getTensor()),
                                      IntegerAttr(), StringAttr());
    };
    // Expert or tensor parallelism: an expert stack a rank holds is its
    // experts (its slices of them with etp), the same on the edp group.
    const int64_t replicas = dataParallel(train);
    const int64_t ep = degree(train, "ep"), etp = degree(train, "etp"), tp = degree(train, "tp"),
                  pp = degree(train, "pp");
    const int64_t edp = replicas * tp / (ep * etp);
    auto distributedExperts = [&](exec::WeightOp w) {
      return (ep > 1 || tp > 1) && w.getExperts().has_value();
    };
    // ZeRO: a state sharded between the ranks that hold the same weight,
    // the dp group (an expert stack under EP or TP: the edp group); member
    // d holds rows [d k, (d + 1) k) of its R rows, k = ceil(R / n): from
    // stage 1 the optimizer's own states, from stage 2 the gradient sums too.
    auto shardGroup = [&](exec::WeightOp w) { return distributedExperts(w) ? edp : replicas; };
    const bool sharded = zero >= 1 && replicas > 1;
    auto isSharded = [&](exec::WeightOp w) { return zero >= 1 && shardGroup(w) > 1; };
    auto gradsSharded = [&](exec::WeightOp w) { return zero == 2 && shardGroup(w) > 1; };
    auto shardRows = [&](exec::WeightOp w) {
      return (stateShape(w).first + shardGroup(w) - 1) / shardGroup(w);
    };
    auto shardedState = [&](OpBuilder &b, Location loc, StringRef kind, exec::WeightOp w) {
      auto [rows, width] = stateShape(w);
      return b.create<exec::BufferOp>(loc, bufferType, f32, shardRows(w), width,
                                      b.getStringAttr(kind + ":" + w.getTensor()),
                                      b.getI64IntegerAttr(rows),
                                      distributedExperts(w) ? b.getStringAttr("edp") : StringAttr());
    };
    auto optimizerState = [&](OpBuilder &b, Location loc, StringRef kind, exec::WeightOp w) {
      return isSharded(w) ? shardedState(b, loc, kind, w) : state(b, loc, kind, w);
    };
    auto gradState = [&](OpBuilder &b, Location loc, StringRef kind, exec::WeightOp w) {
      return gradsSharded(w) ? shardedState(b, loc, kind, w) : state(b, loc, kind, w);
    };
    auto mesh = FlatSymbolRefAttr::get(ctx, "mesh");
    auto expertsRef = FlatSymbolRefAttr::get(ctx, "experts");
    // The group a weight's state is sharded over (ZeRO's collectives).
    auto shardOver = [&](exec::WeightOp w) {
      return distributedExperts(w) ? std::pair(expertsRef, StringRef("edp"))
                                   : std::pair(mesh, StringRef("dp"));
    };

    // The train program: each gradient added into its sum, before the return.
    auto buffers = body.getOps<exec::BufferOp>();
    OpBuilder b(ctx);
    b.setInsertionPointAfter(*std::prev(buffers.end()));
    // A replica that adds several micro-batches' gradients keeps each sum
    // with its rounding error (a compensated sum: the optimizer adds it
    // back once), so that the update is the same whatever the layout.
    const bool compensated = microBatches / dataParallel(train) > 1;
    // An expert stack's gradient that expert_ffn_grad computes: the sources'
    // (under EP each replica of the ep group is one) added in order into the
    // compensated sum by the op itself, the errors kept, wherever the
    // replica adds several gradients or the edp group adds the ranks' sums
    // (EP x TP): rounded once, by grad_total, as one rank's or TP's sums
    // of the same gradients are, and not once per micro-batch and again
    // over edp. (ZeRO-2 reduce-scatters each micro-batch's gradient: there
    // expert_ffn_grad gives it with its error, and the reduce_scatter adds
    // both.)
    const SmallVector<Value> gradients(ret.getGradients());
    auto expertGradOf = [&](Value gradient) -> exec::LaunchOp {
      for (Operation *user : gradient.getUsers())
        if (auto launch = dyn_cast<exec::LaunchOp>(user))
          if (launch.getKernel() == "expert_ffn_grad" && launch.getOuts().size() == 4 &&
              llvm::is_contained(launch.getOuts().drop_front(), gradient))
            return launch;
      return {};
    };
    SmallVector<bool> comp(params.size()), intoSums(params.size()), withError(params.size());
    for (auto [i, w] : llvm::enumerate(params)) {
      const bool expertGrad =
          expertGradOf(gradients[i]) &&
          (compensated || (ep > 1 && edp > 1 && distributedExperts(w)) || gradsSharded(w));
      intoSums[i] = expertGrad && !gradsSharded(w);
      withError[i] = expertGrad && gradsSharded(w);
      comp[i] = compensated || intoSums[i];
    }
    SmallVector<Value> sums, errs(params.size());
    for (exec::WeightOp w : params)
      sums.push_back(gradState(b, train.getLoc(), "grad_sum", w));
    for (auto [i, w] : llvm::enumerate(params))
      if (comp[i])
        errs[i] = gradState(b, train.getLoc(), "grad_err", w);
    // DeepSeek's bias update: each routing with a correction bias counts its
    // selections into a state buffer right after it routes.
    // (Once per bias: a routing recomputed in the backward pass,
    // moe-recompute-layers, repeats the forward's choices.)
    SmallVector<std::pair<exec::WeightOp, Value>> biases; // the bias, its load
    // (A pipeline stage's routings are in its forward program.)
    SmallVector<exec::LaunchOp> routes(body.getOps<exec::LaunchOp>());
    for (auto forward : train->getParentOfType<ModuleOp>().getOps<exec::ProgramOp>())
      if (forward.getEntry() == "train_forward" && forward.getStage() == train.getStage())
        llvm::append_range(routes, forward.getBody().front().getOps<exec::LaunchOp>());
    for (auto route : routes) {
      Block &body = *route->getBlock();
      const size_t withBias = route.getKernel() == "route" ? 1 : route.getKernel() == "router" ? 2 : 0;
      if (expertBiasUpdateRate == 0 || withBias == 0 || route.getWeights().size() != withBias)
        continue;
      auto bias = route.getWeights().back().getDefiningOp<exec::WeightOp>();
      // (The train program's own declaration of it, which the optimizer's
      // maps: a pipeline stage's forward program declares the same.)
      for (exec::WeightOp w : weights)
        if (w.getTensor() == bias.getTensor())
          bias = w;
      if (llvm::any_of(biases, [&](auto counted) { return counted.first == bias; }))
        continue;
      if (!cast<RankedTensorType>(bias.getTensorType()).getElementType().isF32())
        return train.emitError("moe-append-optimizer: '")
               << bias.getTensor() << "' is not f32: not supported yet: its bias update";
      b.setInsertionPointAfter(*std::prev(body.getOps<exec::BufferOp>().end()));
      Value load = state(b, train.getLoc(), "expert_load", bias);
      b.setInsertionPointAfter(route);
      b.create<exec::LaunchOp>(route.getLoc(), "count_experts",
                               ValueRange{route.getOuts()[1], load}, ValueRange{},
                               ValueRange{load}, b.getDictionaryAttr({}), StringAttr(),
                               /*updates_weights=*/false);
      biases.push_back({bias, load});
    }
    // (Before a pipeline stage's sends to the stage before, which end its
    // backward program: moe-schedule-pipeline fuses them with the next
    // step's receives.)
    Operation *end = ret;
    while (auto send = dyn_cast_or_null<exec::CollectiveOp>(end->getPrevNode())) {
      if (send.getKind() != "send")
        break;
      end = send;
    }
    b.setInsertionPoint(end);
    // One micro-batch a replica per update: the backward pass writes each
    // gradient straight into its sum (0 + g is g: the same bits), with no
    // copy and no second buffer of every weight's size, where the gradient
    // is a buffer of the sum's shape that no collective of the train
    // program reads (a state's all_reduce adds in its own fixed order,
    // Collectives.cpp; the parts of a gradient computed in parts are added
    // by the optimizer program, so none does today).
    auto writtenInPlace = [&](size_t i) {
      Value gradient = gradients[i], sum = sums[i];
      auto buffer = gradient.getDefiningOp<exec::BufferOp>();
      auto into = sum.getDefiningOp<exec::BufferOp>();
      return !comp[i] && buffer && into && !buffer.getState() && !into.getLogicalRows() &&
             buffer.getElementType() == into.getElementType() &&
             buffer.getRows() == into.getRows() && buffer.getWidth() == into.getWidth() &&
             llvm::none_of(gradient.getUsers(),
                           [](Operation *user) { return isa<exec::CollectiveOp>(user); });
    };
    // expert_ffn_grad adding into the sums (gate, up, down) and their
    // errors, in place; or (ZeRO-2) writing the gradients with errors.
    SmallVector<Value> gradErrs(params.size());
    for (size_t i = 0; i < gradients.size(); ++i) {
      exec::LaunchOp grad =
          intoSums[i] || withError[i] ? expertGradOf(gradients[i]) : exec::LaunchOp();
      if (!grad)
        continue;
      SmallVector<Value> ins(grad.getIns()), outs{grad.getOuts()[0]}, errors;
      for (Value g : grad.getOuts().drop_front()) {
        auto at = llvm::find(gradients, g);
        const size_t j = at - gradients.begin();
        if (at == gradients.end() || intoSums[j] != intoSums[i] || withError[j] != withError[i])
          return grad.emitError("moe-append-optimizer: expert_ffn_grad's weight gradients are "
                                "not all gradient sums of the update alike");
        if (intoSums[j]) {
          outs.push_back(sums[j]);
          errors.push_back(errs[j]);
          continue;
        }
        auto buffer = g.getDefiningOp<exec::BufferOp>();
        OpBuilder::InsertionGuard guard(b); // (among the declarations)
        b.setInsertionPointAfter(buffer);
        gradErrs[j] = b.create<exec::BufferOp>(buffer.getLoc(), bufferType, f32,
                                               buffer.getRows(), buffer.getWidth(), StringAttr(),
                                               IntegerAttr(), StringAttr());
        outs.push_back(g);
        errors.push_back(gradErrs[j]);
      }
      outs.append(errors);
      if (intoSums[i]) // (added into: read too)
        ins.append(outs.begin() + 1, outs.end());
      SmallVector<NamedAttribute> constants(grad.getConstants().getValue());
      if (intoSums[i])
        constants.push_back(b.getNamedAttr("add", b.getBoolAttr(true)));
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPoint(grad);
      b.create<exec::LaunchOp>(grad.getLoc(), grad.getKernel(), ins, grad.getWeights(), outs,
                               b.getDictionaryAttr(constants), grad.getRowsAttr(),
                               grad.getUpdatesWeights());
      grad.erase();
    }
    // The sums the backward pass writes whole every update: adamw need not
    // clear them (keep_sum).
    SmallVector<bool> direct(gradients.size(), false);
    for (size_t i = 0; i < gradients.size(); ++i) {
      Value gradient = gradients[i];
      if (intoSums[i]) {
        // (Added into its sum by expert_ffn_grad. The buffer may hold other
        // values before it, moe-assign-buffers' sharing: only the return
        // names the sum.)
        gradient.replaceUsesWithIf(sums[i], [&](OpOperand &use) { return use.getOwner() == ret; });
        if (gradient.use_empty())
          gradient.getDefiningOp()->erase();
        continue;
      }
      if (writtenInPlace(i)) {
        Operation *buffer = gradient.getDefiningOp();
        gradient.replaceAllUsesWith(sums[i]);
        buffer->erase();
        direct[i] = true;
        continue;
      }
      SmallVector<Value> ins{gradient}, outs{sums[i]};
      if (gradErrs[i])
        ins.push_back(gradErrs[i]);
      ins.push_back(sums[i]);
      if (comp[i]) {
        ins.push_back(errs[i]);
        outs.push_back(errs[i]);
      }
      // ZeRO-2: every replica's gradient rows of the shard, added into it
      // in replica order (reduce_scatter over dp, or edp).
      if (gradsSharded(params[i])) {
        SmallVector<NamedAttribute> attrs{
            b.getNamedAttr("shard_rows", b.getI64IntegerAttr(shardRows(params[i])))};
        if (gradErrs[i])
          attrs.push_back(b.getNamedAttr("gradient_error", b.getBoolAttr(true)));
        b.create<exec::CollectiveOp>(
            ret.getLoc(), b.getStringAttr("reduce_scatter"), shardOver(params[i]).first,
            b.getStringAttr(shardOver(params[i]).second), ins, ValueRange{}, outs,
            b.getDictionaryAttr(attrs), StringAttr());
      } else {
        b.create<exec::LaunchOp>(ret.getLoc(), "accumulate", ins, ValueRange{}, outs,
                                 b.getDictionaryAttr({}), StringAttr(),
                                 /*updates_weights=*/false);
      }
    }

    // The optimizer program, right after the train program.
    b.setInsertionPointAfter(train);
    auto program = b.create<exec::ProgramOp>(
        train.getLoc(), (train.getSymName() + "_optimizer").str(), "optimizer",
        train.getStageAttr().getInt());
    program->setAttr("micro_batches", b.getI64IntegerAttr(microBatches));
    Location loc = program.getLoc();
    b.setInsertionPointToStart(&program.getBody().emplaceBlock());
    // The same weights in the same order: the runtime binds a rank's weights
    // once for all of its entries.
    IRMapping weightOf;
    for (exec::WeightOp w : weights)
      weightOf.map(w.getResult(), b.clone(*w)->getResult(0));
    for (auto cache : body.getOps<exec::KVCacheOp>()) // (the entries of a stage share them)
      b.clone(*cache);
    Value step = b.create<exec::BufferOp>(loc, bufferType, b.getI32Type(), 1, 1, StringAttr(),
                                          IntegerAttr(), StringAttr());
    Value stats = b.create<exec::BufferOp>(loc, bufferType, f32, 1, 4, StringAttr(),
                                           IntegerAttr(), StringAttr());
    SmallVector<Value> optSums, moments, squares, loads, masters, optErrs;
    for (auto &[bias, load] : biases)
      loads.push_back(state(b, loc, "expert_load", bias));
    for (auto [i, w] : llvm::enumerate(params)) {
      optSums.push_back(gradState(b, loc, "grad_sum", w));
      moments.push_back(optimizerState(b, loc, "exp_avg", w));
      squares.push_back(optimizerState(b, loc, "exp_avg_sq", w));
      // A bf16 weight is the rounding of its f32 master weight.
      bool bf16 = cast<RankedTensorType>(w.getTensorType()).getElementType().isBF16();
      masters.push_back(bf16 ? Value(optimizerState(b, loc, "master", w)) : Value());
      optErrs.push_back(comp[i] ? Value(gradState(b, loc, "grad_err", w)) : Value());
    }
    auto scalar = [&] {
      return b.create<exec::BufferOp>(loc, bufferType, f32, 1, 1, StringAttr(), IntegerAttr(),
                                      StringAttr());
    };
    // The norm from sums of squares (a value and its error) where the
    // ranks hold parts: ZeRO's shards, expert or tensor parallelism's parts.
    // Those of the replicated weights, of the tensor-parallel parts and of
    // the rank's experts apart.
    // (Pipeline stages: each stage's squares of its weights, added over pp.)
    const bool fromSquares = sharded || ep > 1 || tp > 1 || pp > 1;
    Value denseSq, denseErr, expertSq, expertErr, partSq, partErr;
    if (fromSquares)
      for (Value *v : {&denseSq, &denseErr})
        *v = scalar();
    if (fromSquares && tp > 1)
      for (Value *v : {&partSq, &partErr})
        *v = scalar();
    if (fromSquares && (ep > 1 || tp > 1))
      for (Value *v : {&expertSq, &expertErr})
        *v = scalar();
    b.create<exec::InputsOp>(loc, Value(), Value(), Value(), step);
    auto launch = [&](StringRef kernel, ValueRange ins, ValueRange ws, ValueRange outs,
                      ArrayRef<NamedAttribute> constants, bool updates = false) {
      b.create<exec::LaunchOp>(loc, kernel, ins, ws, outs, b.getDictionaryAttr(constants),
                               StringAttr(), updates);
    };
    // Data-parallel replicas: the gradient sums (with their errors) and the
    // expert loads of all of them, added over the dp group before anything
    // reads them (each replica then takes the same update).
    auto sumAndError = [&](size_t i) {
      return comp[i] ? SmallVector<Value>{optSums[i], optErrs[i]} : SmallVector<Value>{optSums[i]};
    };
    // Expert parallelism: an expert stack's sum on a rank is its experts'
    // (the exchanges brought every replica's tokens to them), added over
    // the replicas that hold the same experts (edp) only.
    // Under tensor parallelism too (each rank's experts see its rows, and
    // its slices of them with etp): every holder of the same slices of the
    // same experts (edp) adds its sum, once per update.
    // Tensor parallelism: a weight whose rank holds a part of it (its shape
    // is not the model's: moe.logical_weights).
    const llvm::StringMap<Type> logical =
        moe::logicalWeightTypes(train->getParentOfType<ModuleOp>());
    auto splitOverTp = [&](exec::WeightOp w) {
      auto it = logical.find(w.getTensor());
      return tp > 1 && !w.getExperts() && it != logical.end() &&
             cast<ShapedType>(it->second).getShape() !=
                 cast<ShapedType>(w.getTensorType()).getShape();
    };
    auto allReduceOver = [&](FlatSymbolRefAttr over, StringRef group, ValueRange buffers) {
      b.create<exec::CollectiveOp>(loc, b.getStringAttr("all_reduce"), over,
                                   b.getStringAttr(group), buffers, ValueRange{}, buffers,
                                   b.getDictionaryAttr({}), StringAttr());
    };
    if (replicas > 1 || edp > 1) {
      auto allReduce = [&](ValueRange buffers) {
        if (replicas > 1)
          allReduceOver(mesh, "dp", buffers);
      };
      // ZeRO-1: each replica needs only its rows of the sums, added in
      // place (reduce_scatter over dp or edp; the other rows keep its own).
      // ZeRO-2: the train program reduced the sums into their shards already.
      for (size_t i = 0; i < params.size(); ++i) {
        if (gradsSharded(params[i]))
          continue;
        if (!isSharded(params[i])) {
          if (!distributedExperts(params[i]))
            allReduce(sumAndError(i));
          else if (edp > 1)
            allReduceOver(expertsRef, "edp", sumAndError(i));
          continue;
        }
        b.create<exec::CollectiveOp>(
            loc, b.getStringAttr("reduce_scatter"), shardOver(params[i]).first,
            b.getStringAttr(shardOver(params[i]).second), sumAndError(i), ValueRange{},
            sumAndError(i),
            b.getDictionaryAttr(
                {b.getNamedAttr("shard_rows", b.getI64IntegerAttr(shardRows(params[i])))}),
            StringAttr());
      }
      for (Value load : loads)
        allReduce(load);
    }
    // A table tied over the first and last pipeline stages (its lookup's
    // and its LM head's gradients): each stage's sum added over the two,
    // in stage order, so both copies take the same update.
    auto tied = train->getParentOfType<ModuleOp>()->getAttrOfType<ArrayAttr>(
        "moe.tied_over_stages");
    auto isTied = [&](exec::WeightOp w) {
      return tied && llvm::is_contained(tied.getAsRange<StringAttr>(), w.getTensorAttr());
    };
    // Over two stages the pp group is the two; over more, the first and
    // the last exchange their sums (the first sends first: blocking sends
    // meet) and each adds them in stage order (combine_stages).
    const int64_t stage = train.getStage();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!isTied(params[i]))
        continue;
      if (pp == 2) {
        allReduceOver(mesh, "pp", sumAndError(i));
        continue;
      }
      const int64_t other = stage == 0 ? pp - 1 : 0;
      SmallVector<Value> own = sumAndError(i), theirs;
      for (Value v : own) {
        auto buffer = v.getDefiningOp<exec::BufferOp>();
        OpBuilder::InsertionGuard guard(b); // (among the declarations)
        b.setInsertionPointAfter(buffer);
        theirs.push_back(b.create<exec::BufferOp>(loc, bufferType, f32, buffer.getRows(),
                                                  buffer.getWidth(), StringAttr(), IntegerAttr(),
                                                  StringAttr()));
      }
      auto peer = [&](StringRef kind, ValueRange ins, ValueRange outs) {
        b.create<exec::CollectiveOp>(
            loc, b.getStringAttr(kind), FlatSymbolRefAttr(), StringAttr(), ins, ValueRange{},
            outs, b.getDictionaryAttr({b.getNamedAttr("stage", b.getI64IntegerAttr(other))}),
            StringAttr());
      };
      auto sends = [&] {
        for (Value v : own)
          peer("send", v, {});
      };
      auto recvs = [&] {
        for (Value v : theirs)
          peer("recv", {}, v);
      };
      if (stage == 0) {
        sends();
        recvs();
      } else {
        recvs();
        sends();
      }
      SmallVector<Value> ins = stage == 0 ? own : theirs;
      ins.append(stage == 0 ? theirs : own);
      launch("combine_stages", ins, {}, own, {});
    }
    // A compensated sum's error added back, once.
    for (size_t i = 0; i < params.size(); ++i)
      if (comp[i])
        launch("grad_total", sumAndError(i), {}, sumAndError(i), {});
    launch("lr_schedule", {step}, {}, {stats},
           {b.getNamedAttr("schedule", b.getStringAttr(schedule)),
            b.getNamedAttr("lr", b.getF64FloatAttr(lr)),
            b.getNamedAttr("min_lr", b.getF64FloatAttr(minLr)),
            b.getNamedAttr("warmup_steps", b.getI64IntegerAttr(warmupSteps)),
            b.getNamedAttr("decay_steps", b.getI64IntegerAttr(decaySteps))});
    SmallVector<Value> normIns{stats};
    NamedAttribute maxNorm = b.getNamedAttr("max_norm", b.getF64FloatAttr(clipGradNorm)),
                   micro = b.getNamedAttr("micro_batches", b.getI64IntegerAttr(microBatches));
    if (fromSquares) {
      // Each sum's squares once: ZeRO-1's of each replica's rows of the
      // whole sums (its edp member's rows for an expert stack), added over
      // the shards' group; the TP parts' over tp as well; the experts' over
      // ep and etp (their ranks hold other experts, other slices).
      SmallVector<NamedAttribute> rowsOf, expertRows;
      if (zero == 1)
        rowsOf.push_back(b.getNamedAttr("replicas", b.getI64IntegerAttr(replicas)));
      const bool expertShards = zero >= 1 && edp > 1;
      if (zero == 1 && expertShards)
        expertRows = {b.getNamedAttr("replicas", b.getI64IntegerAttr(edp)),
                      b.getNamedAttr("shard_group", b.getStringAttr("edp"))};
      SmallVector<Value> dense, parts, experts;
      for (auto [i, w] : llvm::enumerate(params)) {
        if (isTied(w) && train.getStage() != 0) // (counted once: by the first stage)
          continue;
        (distributedExperts(w) ? experts : splitOverTp(w) ? parts : dense).push_back(optSums[i]);
      }
      normIns.append({denseSq, denseErr});
      auto overStages = [&](Value sq, Value err) {
        if (pp > 1)
          allReduceOver(mesh, "pp", ValueRange{sq, err});
      };
      launch("sum_squares", dense, {}, {denseSq, denseErr}, rowsOf);
      if (sharded)
        allReduceOver(mesh, "dp", ValueRange{denseSq, denseErr});
      overStages(denseSq, denseErr);
      if (!parts.empty()) {
        launch("sum_squares", parts, {}, {partSq, partErr}, rowsOf);
        if (sharded)
          allReduceOver(mesh, "dp", ValueRange{partSq, partErr});
        allReduceOver(mesh, "tp", ValueRange{partSq, partErr});
        overStages(partSq, partErr);
        normIns.append({partSq, partErr});
      }
      if (!experts.empty()) {
        launch("sum_squares", experts, {}, {expertSq, expertErr}, expertRows);
        for (auto [group, n] :
             {std::pair(StringRef("edp"), expertShards ? edp : 1), {"ep", ep}, {"etp", etp}})
          if (n > 1)
            allReduceOver(expertsRef, group, ValueRange{expertSq, expertErr});
        overStages(expertSq, expertErr);
        normIns.append({expertSq, expertErr});
      }
      launch("grad_norm", normIns, {}, {stats},
             {b.getNamedAttr("from_squares", b.getBoolAttr(true)), maxNorm, micro});
    } else {
      normIns.append(optSums.begin(), optSums.end());
      launch("grad_norm", normIns, {}, {stats}, {maxNorm, micro});
    }
    for (auto [i, w] : llvm::enumerate(params)) {
      SmallVector<Value> ins{step, stats, optSums[i], moments[i], squares[i]};
      SmallVector<Value> outs{moments[i], squares[i], optSums[i]};
      if (masters[i]) {
        ins.push_back(masters[i]);
        outs.push_back(masters[i]);
      }
      SmallVector<NamedAttribute> attrs{
          b.getNamedAttr("beta1", b.getF64FloatAttr(beta1)),
          b.getNamedAttr("beta2", b.getF64FloatAttr(beta2)),
          b.getNamedAttr("eps", b.getF64FloatAttr(eps)),
          b.getNamedAttr("weight_decay", b.getF64FloatAttr(weightDecay)),
          b.getNamedAttr("micro_batches", b.getI64IntegerAttr(microBatches))};
      if (i < direct.size() && direct[i])
        attrs.push_back(b.getNamedAttr("keep_sum", b.getBoolAttr(true)));
      launch("adamw", ins, {weightOf.lookup(w.getResult())}, outs, attrs, /*updates=*/true);
    }
    // ZeRO: each member updated its rows of every sharded weight; the
    // weights gathered whole over the group.
    for (exec::WeightOp w : params)
      if (isSharded(w))
        b.create<exec::CollectiveOp>(
            loc, b.getStringAttr("all_gather"), shardOver(w).first,
            b.getStringAttr(shardOver(w).second), ValueRange{},
            ValueRange{weightOf.lookup(w.getResult())}, ValueRange{},
            b.getDictionaryAttr({b.getNamedAttr("shard_rows", b.getI64IntegerAttr(shardRows(w)))}),
            StringAttr());
    for (auto [i, bias] : llvm::enumerate(biases))
      launch("expert_bias_update", {loads[i]}, {weightOf.lookup(bias.first.getResult())},
             {loads[i]}, {b.getNamedAttr("rate", b.getF64FloatAttr(expertBiasUpdateRate))},
             /*updates=*/true);
    b.create<exec::ReturnOp>(loc, Value(), Value(), ValueRange{}, ValueRange{}, stats);
    return success();
  }
};

} // namespace
