//===- Importer.cpp - build the moe IR of a model --------------*- C++ -*-===//
//
// Emits one op per block part, in the order the reference implementation
// runs them, with each weight defined right before its first use so that a
// layer reads top to bottom.
//
//===----------------------------------------------------------------------===//
#include "moe/Frontend/HF/Importer.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Verifier.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>
#include <map>

using namespace mlir;
using namespace ::moe::hf;
using llvm::formatv;

namespace {

llvm::APFloat F(double value) { return llvm::APFloat(value); }

class ModelImporter {
public:
  ModelImporter(const ModelConfig &c, MLIRContext &ctx)
      : c(c), ctx(ctx), b(&ctx), loc(b.getUnknownLoc()) {
    for (TensorSpec &spec : checkpointTensors(c))
      specs.emplace(spec.name, std::move(spec));
    f32 = b.getF32Type();
    if (c.dtype == "bfloat16")
      act = b.getBF16Type();
    else if (c.dtype == "float16")
      act = b.getF16Type();
    else
      act = f32;
    i32 = b.getI32Type();
  }

  OwningOpRef<ModuleOp> run();

private:
  // Types: [?, width] activations in the model dtype.
  RankedTensorType acts(int64_t width, Type element = nullptr) {
    return RankedTensorType::get({ShapedType::kDynamic, width},
                                 element ? element : act);
  }
  /// A checkpoint tensor with its role and layer (checkpointTensors': the
  /// planner, the partitioner and the slices read them from the op).
  Value weight(const std::string &name, ArrayRef<int64_t> shape, Type element = nullptr) {
    const TensorSpec *spec = specOf(name);
    moe::WeightRoleAttr role;
    if (spec && spec->role == TensorRole::Embedding)
      role = moe::WeightRoleAttr::get(&ctx, moe::WeightRole::embedding);
    else if (spec && spec->role == TensorRole::LMHead)
      role = moe::WeightRoleAttr::get(&ctx, moe::WeightRole::lm_head);
    else if (spec && spec->tpSplit == TensorSplit::Column)
      role = moe::WeightRoleAttr::get(&ctx, moe::WeightRole::column);
    else if (spec && spec->tpSplit == TensorSplit::Row)
      role = moe::WeightRoleAttr::get(&ctx, moe::WeightRole::row);
    auto op = b.create<moe::WeightOp>(loc, RankedTensorType::get(shape, element ? element : act),
                                      name, role, layerAttr(spec));
    markFp8(op, spec);
    return op;
  }
  /// An FP8-stored weight (TensorSpec::isFp8) carries its block as
  /// `moe.fp8_block = array<i64: rows, cols>`: the IR computes with the
  /// dequantised weight; the block says how the checkpoint stores it.
  void markFp8(Operation *op, const TensorSpec *spec) {
    if (spec && spec->isFp8())
      op->setAttr("moe.fp8_block",
                  b.getDenseI64ArrayAttr({spec->fp8BlockRows, spec->fp8BlockCols}));
  }
  /// A stack of every routed expert's tensor `name` (with `{e}`).
  Value expertWeight(const std::string &name, ArrayRef<int64_t> shape) {
    std::string first = name;
    first.replace(first.find("{e}"), 3, "0");
    const TensorSpec *spec = specOf(first);
    IntegerAttr etpDim = spec && spec->etpDim ? b.getI64IntegerAttr(spec->etpDim) : nullptr;
    auto op = b.create<moe::ExpertWeightOp>(loc, RankedTensorType::get(shape, act), name, etpDim,
                                            layerAttr(spec));
    markFp8(op, spec);
    return op;
  }
  const TensorSpec *specOf(const std::string &name) {
    auto found = specs.find(name);
    if (found != specs.end())
      return &found->second;
    missing.push_back(name);
    return nullptr;
  }
  IntegerAttr layerAttr(const TensorSpec *spec) {
    return spec && spec->layer >= 0 ? b.getI64IntegerAttr(spec->layer) : nullptr;
  }
  Value linear(Value x, const std::string &prefix, int64_t out, int64_t in,
               bool bias, Type resultElement = nullptr) {
    Value w = weight(prefix + ".weight", {out, in});
    Value bv = bias ? weight(prefix + ".bias", {out}) : Value();
    return b.create<moe::LinearOp>(loc, acts(out, resultElement), x, w, bv);
  }
  Value rmsNorm(Value x, const std::string &prefix, int64_t size) {
    return rmsNorm(x, prefix, size, c.normEps);
  }
  Value rmsNorm(Value x, const std::string &prefix, int64_t size, double eps) {
    Value w = weight(prefix + ".weight", {size});
    return b.create<moe::RMSNormOp>(loc, x.getType(), x, w, /*sum_squares=*/Value(),
                                    b.getF64FloatAttr(eps), /*row_width=*/IntegerAttr());
  }
  Value mlp(Value x, const std::string &prefix, int64_t inter);

  moe::RopeAttr rope(int64_t rotaryDim, bool interleaved);
  moe::Activation activation();
  Value attention(Value x, const std::string &prefix);
  Value latentAttention(Value x, const std::string &prefix);
  Value moeBlock(Value x, const std::string &prefix);

public:
  /// Tensors the importer named that checkpointTensors does not list (an
  /// importer bug: their roles are unknown).
  std::vector<std::string> missing;

private:
  const ModelConfig &c;
  std::map<std::string, TensorSpec> specs;
  MLIRContext &ctx;
  OpBuilder b;
  Location loc;
  Type act, f32, i32;
  Value positions;
};

moe::Activation ModelImporter::activation() {
  if (c.hiddenAct == "gelu")
    return moe::Activation::gelu;
  if (c.hiddenAct == "gelu_pytorch_tanh")
    return moe::Activation::gelu_tanh;
  if (c.hiddenAct == "relu")
    return moe::Activation::relu;
  return moe::Activation::silu;
}

moe::RopeAttr ModelImporter::rope(int64_t rotaryDim, bool interleaved) {
  const RopeScaling &s = c.ropeScaling;
  moe::RopeKind kind = moe::RopeKind::plain;
  switch (s.kind) {
  case RopeScalingKind::None: kind = moe::RopeKind::plain; break;
  case RopeScalingKind::Linear: kind = moe::RopeKind::linear; break;
  case RopeScalingKind::Dynamic: kind = moe::RopeKind::dynamic; break;
  case RopeScalingKind::Llama3: kind = moe::RopeKind::llama3; break;
  case RopeScalingKind::Yarn: kind = moe::RopeKind::yarn; break;
  case RopeScalingKind::LongRope: llvm_unreachable("rejected before import");
  }
  if (kind == moe::RopeKind::plain)
    return moe::RopeAttr::get(&ctx, kind, F(c.ropeTheta), rotaryDim,
                              interleaved, F(1.0), 0, F(1.0), F(4.0), F(32.0),
                              F(1.0), F(1.0), true);
  return moe::RopeAttr::get(&ctx, kind, F(c.ropeTheta), rotaryDim, interleaved,
                            F(s.factor), s.originalMaxPosition,
                            F(s.lowFreqFactor), F(s.highFreqFactor),
                            F(s.betaFast), F(s.betaSlow),
                            F(ropeAttentionFactor(s)), s.truncate);
}

Value ModelImporter::mlp(Value x, const std::string &prefix, int64_t inter) {
  int64_t h = c.hiddenSize;
  Value gate = weight(prefix + ".gate_proj.weight", {inter, h});
  Value up = weight(prefix + ".up_proj.weight", {inter, h});
  Value down = weight(prefix + ".down_proj.weight", {h, inter});
  return b.create<moe::MLPOp>(loc, x.getType(), x, gate, up, down,
                              activation());
}

Value ModelImporter::attention(Value x, const std::string &p) {
  int64_t h = c.hiddenSize, q = c.numHeads * c.headDim,
          kv = c.numKVHeads * c.headDim;
  Value qs = linear(x, p + ".q_proj", q, h, c.qkvBias);
  Value ks = linear(x, p + ".k_proj", kv, h, c.qkvBias);
  Value vs = linear(x, p + ".v_proj", kv, h, c.qkvBias);
  if (c.qkNorm == QKNorm::PerHead) {
    qs = rmsNorm(qs, p + ".q_norm", c.headDim);
    ks = rmsNorm(ks, p + ".k_norm", c.headDim);
  } else if (c.qkNorm == QKNorm::Full) {
    qs = rmsNorm(qs, p + ".q_norm", q);
    ks = rmsNorm(ks, p + ".k_norm", kv);
  }
  moe::RopeAttr r = rope(c.headDim, /*interleaved=*/false);
  auto headDim = b.getI64IntegerAttr(c.headDim);
  qs = b.create<moe::RopeOp>(loc, qs.getType(), qs, positions, headDim, r);
  ks = b.create<moe::RopeOp>(loc, ks.getType(), ks, positions, headDim, r);
  double scale = 1.0 / std::sqrt(static_cast<double>(c.headDim));
  auto attn = b.create<moe::AttentionOp>(
      loc, acts(q), qs, ks, vs, b.getI64IntegerAttr(c.numHeads),
      b.getI64IntegerAttr(c.numKVHeads), b.getF64FloatAttr(scale),
      c.slidingWindow ? b.getI64IntegerAttr(*c.slidingWindow) : IntegerAttr());
  return linear(attn, p + ".o_proj", h, q, c.oBias);
}

Value ModelImporter::latentAttention(Value x, const std::string &p) {
  int64_t h = c.hiddenSize, heads = c.numHeads;
  int64_t qHead = c.qkNopeHeadDim + c.qkRopeHeadDim;
  Value q;
  if (c.qLoraRank > 0) {
    Value qa = linear(x, p + ".q_a_proj", c.qLoraRank, h, c.qkvBias);
    qa = rmsNorm(qa, p + ".q_a_layernorm", c.qLoraRank, c.latentNormEps);
    q = linear(qa, p + ".q_b_proj", heads * qHead, c.qLoraRank, false);
  } else {
    q = linear(x, p + ".q_proj", heads * qHead, h, false);
  }
  Value kva = linear(x, p + ".kv_a_proj_with_mqa", c.kvLoraRank + c.qkRopeHeadDim,
                     h, c.qkvBias);
  auto split = b.create<moe::SplitOp>(
      loc, TypeRange{acts(c.kvLoraRank), acts(c.qkRopeHeadDim)}, kva);
  Value latent = rmsNorm(split.getResult(0), p + ".kv_a_layernorm", c.kvLoraRank,
                         c.latentNormEps);
  Value kv = linear(latent, p + ".kv_b_proj", heads * (c.qkNopeHeadDim + c.vHeadDim),
                    c.kvLoraRank, false);
  // DeepSeek scales the softmax by mscale(factor, mscale_all_dim)^2 on top of
  // 1/sqrt(qk head dim) whenever the config scales RoPE (any kind) and sets
  // mscale_all_dim: DeepSeek's own V2/V3 code and transformers 5.x for both
  // versions; transformers 4.57's V2 port leaves it out (docs/conformance.md).
  double scale = 1.0 / std::sqrt(static_cast<double>(qHead));
  const RopeScaling &s = c.ropeScaling;
  if (s.present && s.mscaleAllDim) {
    double m = yarnMscale(s.factor, *s.mscaleAllDim);
    scale *= m * m;
  }
  auto attn = b.create<moe::MLAttentionOp>(
      loc, acts(heads * c.vHeadDim), q, kv, split.getResult(1), positions,
      b.getI64IntegerAttr(heads), b.getF64FloatAttr(scale),
      rope(c.qkRopeHeadDim, c.ropeInterleave));
  return linear(attn, p + ".o_proj", h, heads * c.vHeadDim, c.oBias);
}

Value ModelImporter::moeBlock(Value x, const std::string &layer) {
  int64_t h = c.hiddenSize, e = c.numExperts, inter = c.moeIntermediateSize;
  bool mixtral = c.modelType == "mixtral";
  std::string p = layer + (mixtral ? ".block_sparse_moe" : ".mlp");
  Value gate = weight(p + ".gate.weight", {e, h});
  Value bias = c.scoreCorrectionBias
                   ? weight(p + ".gate.e_score_correction_bias", {e},
                            c.correctionBiasF32 ? f32 : Type())
                   : Value();
  Type computeType = c.routerInF32 ? f32 : act;
  auto routing = moe::RoutingAttr::get(
      &ctx,
      c.scoring == Scoring::Sigmoid ? moe::ScoringFunc::sigmoid
                                    : moe::ScoringFunc::softmax,
      c.expertsPerToken, moe::TopKInput::scores, c.normTopK,
      F(c.routedScalingFactor), c.numGroups, c.topkGroups,
      c.groupScoring == GroupScoring::Max ? moe::GroupScore::max
                                          : moe::GroupScore::top2_sum,
      computeType);
  int64_t k = c.expertsPerToken;
  // The gate's logits, then the routing (moe-fuse-router makes them one
  // moe.router).
  Value logits = b.create<moe::LinearOp>(loc, acts(e, computeType), x, gate, Value());
  auto router = b.create<moe::RouteOp>(loc, acts(k, computeType), acts(k, i32), logits, bias,
                                       routing);
  StringRef w1 = mixtral ? "w1" : "gate_proj", w3 = mixtral ? "w3" : "up_proj",
            w2 = mixtral ? "w2" : "down_proj";
  Value gates = expertWeight(formatv("{0}.experts.{{e}.{1}.weight", p, w1), {e, inter, h});
  Value ups = expertWeight(formatv("{0}.experts.{{e}.{1}.weight", p, w3), {e, inter, h});
  Value downs = expertWeight(formatv("{0}.experts.{{e}.{1}.weight", p, w2), {e, h, inter});
  Value routed = b.create<moe::ExpertsOp>(
      loc, x.getType(), x, router.getWeights(), router.getExperts(), gates, ups,
      downs, activation());
  if (c.numSharedExperts == 0)
    return routed;
  bool qwen2 = c.modelType == "qwen2_moe";
  Value shared = mlp(x, p + (qwen2 ? ".shared_expert" : ".shared_experts"),
                     c.sharedExpertIntermediateSize);
  if (c.sharedExpertGate) {
    Value logit = linear(x, p + ".shared_expert_gate", 1, h, false);
    shared = b.create<moe::SigmoidGateOp>(loc, shared.getType(), shared, logit);
  }
  return b.create<moe::AddOp>(loc, routed, shared);
}

OwningOpRef<ModuleOp> ModelImporter::run() {
  // Diagnostics about the whole model point at its config.json.
  OwningOpRef<ModuleOp> module =
      ModuleOp::create(FileLineColLoc::get(&ctx, c.path, 0, 0));
  ModuleOp m = *module;
  m->setAttr("moe.model_type", b.getStringAttr(c.modelType));
  m->setAttr("moe.source", b.getStringAttr(c.path));
  // The config itself: the planner reads the model's sizes from the module,
  // wherever the module and the file have gone since.
  m->setAttr("moe.config", b.getStringAttr(c.text));
  m->setAttr("moe.vocab_size", b.getI64IntegerAttr(c.vocabSize));
  m->setAttr("moe.eos_token_ids", b.getDenseI64ArrayAttr(c.eosTokenIds));
  m->setAttr("moe.max_position_embeddings",
             b.getI64IntegerAttr(c.maxPositionEmbeddings));
  // Checkpoint tensors the model does not use at inference (DeepSeek-V3's
  // multi-token-prediction layers): the runtime accepts and skips them.
  SmallVector<Attribute> ignored;
  for (int64_t i = 0; i < c.numMTPLayers; ++i)
    ignored.push_back(b.getStringAttr(formatv("model.layers.{0}.", c.numLayers + i).str()));
  if (!ignored.empty())
    m->setAttr("moe.unused_tensor_prefixes", b.getArrayAttr(ignored));

  auto ids = RankedTensorType::get({ShapedType::kDynamic}, i32);
  auto logitsType = acts(c.vocabSize, f32);
  b.setInsertionPointToEnd(m.getBody());
  auto func = b.create<func::FuncOp>(
      loc, "forward", b.getFunctionType({ids, ids}, {logitsType}));
  func.setArgAttr(0, "moe.name", b.getStringAttr("tokens"));
  func.setArgAttr(1, "moe.name", b.getStringAttr("positions"));
  Block *body = func.addEntryBlock();
  b.setInsertionPointToEnd(body);
  Value tokens = body->getArgument(0);
  positions = body->getArgument(1);

  int64_t h = c.hiddenSize;
  Value table = weight("model.embed_tokens.weight", {c.vocabSize, h});
  // pad_token_id is nn.Embedding's padding_idx in transformers (when it is
  // a row of the table): it changes the table's gradient only.
  IntegerAttr padding;
  if (c.padTokenId && *c.padTokenId >= 0 && *c.padTokenId < c.vocabSize)
    padding = b.getI64IntegerAttr(*c.padTokenId);
  Value hidden = b.create<moe::EmbeddingOp>(loc, acts(h), table, tokens, padding);
  for (int64_t i = 0; i < c.numLayers; ++i) {
    std::string p = formatv("model.layers.{0}", i).str();
    loc = NameLoc::get(b.getStringAttr(p));
    Value n = rmsNorm(hidden, p + ".input_layernorm", h);
    Value a = c.isMLA() ? latentAttention(n, p + ".self_attn")
                        : attention(n, p + ".self_attn");
    hidden = b.create<moe::AddOp>(loc, hidden, a);
    n = rmsNorm(hidden, p + ".post_attention_layernorm", h);
    Value ffn = c.moeLayers[i] ? moeBlock(n, p)
                               : mlp(n, p + ".mlp", c.intermediateSize);
    hidden = b.create<moe::AddOp>(loc, hidden, ffn);
  }
  loc = b.getUnknownLoc();
  hidden = rmsNorm(hidden, "model.norm", h);
  Value head = c.tieWordEmbeddings ? table
                                   : weight("lm_head.weight", {c.vocabSize, h});
  Value logits =
      b.create<moe::LinearOp>(loc, logitsType, hidden, head, Value());
  b.create<func::ReturnOp>(loc, logits);
  return module;
}

} // namespace

namespace moe::hf {
llvm::Expected<OwningOpRef<ModuleOp>>
importModel(const ModelConfig &config, MLIRContext &context) {
  if (!config.unsupportedFeature.empty())
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "%s: not supported yet: %s",
                                   config.path.c_str(),
                                   config.unsupportedFeature.c_str());
  context.loadDialect<moe::MoEDialect, func::FuncDialect>();
  ModelImporter importer(config, context);
  OwningOpRef<ModuleOp> module = importer.run();
  if (!importer.missing.empty())
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "%s: internal error: the importer names tensor '%s', which "
                                   "the %s checkpoint layout does not list",
                                   config.path.c_str(), importer.missing.front().c_str(),
                                   config.modelType.c_str());
  if (failed(verify(*module)))
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "%s: the imported IR does not verify",
                                   config.path.c_str());
  return std::move(module);
}
} // namespace moe::hf
