//===- MoEBase.td - the moe dialect, its enums and attributes -*- tablegen -*-===//
//
// The `moe` dialect holds a whole decoder-only Mixture-of-Experts transformer
// as one readable function. Weights are named by their checkpoint tensor names;
// activations are ranked tensors whose leading dimension is the token count T
// (dynamic until the workload is fixed by the planner).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_DIALECT_MOE_IR_MOEBASE_TD
#define MOE_DIALECT_MOE_IR_MOEBASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

def MoE_Dialect : Dialect {
  let name = "moe";
  let cppNamespace = "::moe";
  let summary = "Mixture-of-Experts transformer models, weights by checkpoint name";
  let description = [{
    Ops at the granularity of a transformer block's parts (norm, linear, RoPE,
    attention, router, routed experts, ...). Each op is a mathematical
    function of its operands with a documented definition, so its gradient
    can be derived without redesigning the dialect. Sharding is expressed with
    upstream MLIR's `mesh` dialect (see docs/sharding.md).
  }];
  let useDefaultAttributePrinterParser = 1;
  let dependentDialects = ["::mlir::func::FuncDialect"];
}

class MoE_Op<string mnemonic, list<Trait> traits = []>
    : Op<MoE_Dialect, mnemonic, traits>;

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

def MoE_ScoringSoftmax : I32EnumAttrCase<"softmax", 0>;
def MoE_ScoringSigmoid : I32EnumAttrCase<"sigmoid", 1>;
def MoE_ScoringFunc : I32EnumAttr<"ScoringFunc",
    "how router logits become expert scores",
    [MoE_ScoringSoftmax, MoE_ScoringSigmoid]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::moe";
}
def MoE_ScoringFuncAttr : EnumAttr<MoE_Dialect, MoE_ScoringFunc, "scoring">;

def MoE_TopKAfterScoring : I32EnumAttrCase<"scores", 0>;
def MoE_TopKOnLogits : I32EnumAttrCase<"logits", 1>;
def MoE_TopKInput : I32EnumAttr<"TopKInput",
    "whether top-k selects on the scores (post-softmax) or on the raw logits (pre-softmax)",
    [MoE_TopKAfterScoring, MoE_TopKOnLogits]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::moe";
}
def MoE_TopKInputAttr : EnumAttr<MoE_Dialect, MoE_TopKInput, "topk_on">;

def MoE_GroupScoreTop2Sum : I32EnumAttrCase<"top2_sum", 0>;
def MoE_GroupScoreMax : I32EnumAttrCase<"max", 1>;
def MoE_GroupScore : I32EnumAttr<"GroupScore",
    "how a group of experts is scored for group-limited selection",
    [MoE_GroupScoreTop2Sum, MoE_GroupScoreMax]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::moe";
}
def MoE_GroupScoreAttr : EnumAttr<MoE_Dialect, MoE_GroupScore, "group_score">;

def MoE_RoleReplicated : I32EnumAttrCase<"replicated", 0>;
def MoE_RoleColumn : I32EnumAttrCase<"column", 1>;
def MoE_RoleRow : I32EnumAttrCase<"row", 2>;
def MoE_RoleEmbedding : I32EnumAttrCase<"embedding", 3>;
def MoE_RoleLMHead : I32EnumAttrCase<"lm_head", 4>;
def MoE_RoleExperts : I32EnumAttrCase<"experts", 5>;
def MoE_WeightRole : I32EnumAttr<"WeightRole",
    "how a weight is laid out across ranks: replicated (norms, routers, "
    "latent projections), column (tensor parallelism splits dim 0, the "
    "output rows: q/k/v, gate/up and their biases), row (TP splits dim 1, the "
    "input columns: o_proj, down_proj), embedding / lm_head (TP splits the "
    "vocabulary rows, padded), experts (a routed-expert stack: expert "
    "parallelism splits dim 0, expert tensor parallelism `etp_dim`)",
    [MoE_RoleReplicated, MoE_RoleColumn, MoE_RoleRow, MoE_RoleEmbedding,
     MoE_RoleLMHead, MoE_RoleExperts]> {
  let cppNamespace = "::moe";
}

def MoE_ActSilu : I32EnumAttrCase<"silu", 0>;
def MoE_ActGelu : I32EnumAttrCase<"gelu", 1>;
def MoE_ActGeluTanh : I32EnumAttrCase<"gelu_tanh", 2>;
def MoE_ActRelu : I32EnumAttrCase<"relu", 3>;
def MoE_Activation : I32EnumAttr<"Activation",
    "the activation of a gated MLP: act(x W_gate^T) * (x W_up^T)",
    [MoE_ActSilu, MoE_ActGelu, MoE_ActGeluTanh, MoE_ActRelu]> {
  let cppNamespace = "::moe";
}

def MoE_RopeDefault : I32EnumAttrCase<"plain", 0, "default">;
def MoE_RopeLinear : I32EnumAttrCase<"linear", 1>;
def MoE_RopeDynamic : I32EnumAttrCase<"dynamic", 2>;
def MoE_RopeLlama3 : I32EnumAttrCase<"llama3", 3>;
def MoE_RopeYarn : I32EnumAttrCase<"yarn", 4>;
def MoE_RopeKind : I32EnumAttr<"RopeKind", "rotary embedding frequency scaling",
    [MoE_RopeDefault, MoE_RopeLinear, MoE_RopeDynamic, MoE_RopeLlama3, MoE_RopeYarn]> {
  let genSpecializedAttr = 0;
  let cppNamespace = "::moe";
}
def MoE_RopeKindAttr : EnumAttr<MoE_Dialect, MoE_RopeKind, "rope_kind">;

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

/// A double printed in the shortest form that parses back to the same value.
/// (an APFloat of double semantics: APFloat brings hashing and equality).
class MoE_F64Param<string desc> : APFloatParameter<desc> {
  let parser = [{ [&]() -> ::mlir::FailureOr<::llvm::APFloat> {
      double value;
      if ($_parser.parseFloat(value)) return ::mlir::failure();
      return ::llvm::APFloat(value); }() }];
  let printer = [{ $_printer.printFloat($_self) }];
}
/// A bool printed as `true` / `false`, false when omitted.
class MoE_BoolParam<string desc> : DefaultValuedParameter<"bool", "false", desc> {
  let parser = [{ [&]() -> ::mlir::FailureOr<bool> {
      if (::mlir::succeeded($_parser.parseOptionalKeyword("true"))) return true;
      if (::mlir::succeeded($_parser.parseOptionalKeyword("false"))) return false;
      return $_parser.emitError($_parser.getCurrentLocation(),
                                "expected 'true' or 'false'"); }() }];
  let printer = [{ $_printer << ($_self ? "true" : "false") }];
}
/// A bool printed as `true` / `false`, true when omitted.
class MoE_TrueParam<string desc> : DefaultValuedParameter<"bool", "true", desc> {
  let parser = [{ [&]() -> ::mlir::FailureOr<bool> {
      if (::mlir::succeeded($_parser.parseOptionalKeyword("true"))) return true;
      if (::mlir::succeeded($_parser.parseOptionalKeyword("false"))) return false;
      return $_parser.emitError($_parser.getCurrentLocation(),
                                "expected 'true' or 'false'"); }() }];
  let printer = [{ $_printer << ($_self ? "true" : "false") }];
}
class MoE_F64DefaultParam<string value, string desc> : MoE_F64Param<desc> {
  let defaultValue = "::llvm::APFloat(" # value # ")";
}

//===----------------------------------------------------------------------===//
// (attribute definitions)
//===----------------------------------------------------------------------===//

def MoE_RopeAttr : AttrDef<MoE_Dialect, "Rope"> {
  let mnemonic = "rope";
  let summary = "rotary position embedding: base, rotated width and frequency scaling";
  let description = [{
    Inverse frequencies for pair i of a rotated width R (i in [0, R/2)) are
    `inv_freq[i] = theta^(-2i/R)`, then rescaled by `kind`:
    - `default`: unchanged.
    - `linear`: positions are divided by `factor`.
    - `dynamic`: NTK scaling; for sequences longer than
      `original_max_position` the base becomes
      `theta * ((factor * L / original_max_position) - (factor - 1))^(R/(R-2))`.
    - `llama3`: wavelength w = 2*pi/inv_freq; w > original/low_freq_factor:
      inv_freq/factor; w < original/high_freq_factor: unchanged; otherwise the
      smooth interpolation s = (original/w - low)/(high - low),
      (1-s)*inv_freq/factor + s*inv_freq.
    - `yarn`: inv_freq blends extrapolated and interpolated frequencies with a
      linear ramp between the correction dims given by `beta_fast` and
      `beta_slow` (rounded outwards to integers unless `truncate` is false).
    cos and sin are multiplied by `attention_factor` (1 unless the frontend
    derived another, e.g. YaRN's `mscale(factor, mscale) /
    mscale(factor, mscale_all_dim)`).
    `interleaved` selects the pairing: false rotates (x[i], x[i + R/2])
    (the "rotate_half" layout), true rotates (x[2i], x[2i+1]).
  }];
  let parameters = (ins
    "::moe::RopeKind":$kind,
    MoE_F64Param<"base of the inverse frequencies">:$theta,
    "int64_t":$rotary_dim,
    MoE_BoolParam<"pairs (2i, 2i+1) instead of (i, i + R/2)">:$interleaved,
    MoE_F64DefaultParam<"1.0", "scaling factor">:$factor,
    DefaultValuedParameter<"int64_t", "0">:$original_max_position,
    MoE_F64DefaultParam<"1.0", "llama3 low_freq_factor">:$low_freq_factor,
    MoE_F64DefaultParam<"4.0", "llama3 high_freq_factor">:$high_freq_factor,
    MoE_F64DefaultParam<"32.0", "yarn beta_fast">:$beta_fast,
    MoE_F64DefaultParam<"1.0", "yarn beta_slow">:$beta_slow,
    MoE_F64DefaultParam<"1.0", "factor on cos and sin">:$attention_factor,
    MoE_TrueParam<"yarn: correction range rounded to integers">:$truncate
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def MoE_RoutingAttr : AttrDef<MoE_Dialect, "Routing"> {
  let mnemonic = "routing";
  let summary = "every routing option of a Hugging Face MoE config, with its exact math";
  let description = [{
    For one token with router logits `l = x W_g^T` (E values, computed in
    `compute_type`), the router selects k = `top_k` experts and their weights:

    1. Scores: `scoring = softmax`: `s = softmax(l)` over all E experts;
       `scoring = sigmoid`: `s_e = 1 / (1 + exp(-l_e))`.
    2. Selection key: `c = s + b` when a score-correction bias `b` is given
       (DeepSeek-V3's `e_score_correction_bias`), else `c = s`; with
       `topk_on = logits` the key is `l` (pre-softmax top-k; with softmax
       scoring this selects the same experts). The bias only ever affects
       which experts are selected, never their weights.
    3. Group limit (`num_groups` G > 1): experts are split into G contiguous
       groups of E/G; a group's score is the sum of its two highest keys
       (`group_score = top2_sum`, DeepSeek-V3) or its highest key
       (`group_score = max`, DeepSeek-V2); the `topk_groups` best groups are
       kept and the keys of all other experts are set to 0.0 (as the reference
       implementation does with `masked_fill(..., 0.0)`).
    4. Top-k: the k experts with the highest keys, ties broken by the lower
       expert index; the result lists them in descending key order.
    5. Weights: `w_j = s_{e_j}` (for `topk_on = logits` with softmax scoring:
       `w = softmax(l_{e_1..e_k})`).
    6. `normalize = true`: `w_j = w_j / (sum_j w_j + 1e-20)` (the 1e-20 guards
       a zero sum and is below fp32 resolution for any non-zero sum).
    7. `w_j = w_j * scaling_factor` (DeepSeek's `routed_scaling_factor`).

    Weights are produced in `compute_type`; Mixtral-style "softmax over the
    top-k logits" is `scoring = softmax, normalize = true`.
  }];
  let parameters = (ins
    "::moe::ScoringFunc":$scoring,
    "int64_t":$top_k,
    DefaultValuedParameter<"::moe::TopKInput", "::moe::TopKInput::scores">:$topk_on,
    MoE_BoolParam<"renormalise the selected weights to sum to one">:$normalize,
    MoE_F64DefaultParam<"1.0", "routed scaling factor">:$scaling_factor,
    DefaultValuedParameter<"int64_t", "1">:$num_groups,
    DefaultValuedParameter<"int64_t", "1">:$topk_groups,
    DefaultValuedParameter<"::moe::GroupScore", "::moe::GroupScore::top2_sum">:$group_score,
    "::mlir::Type":$compute_type
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

#endif // MOE_DIALECT_MOE_IR_MOEBASE_TD
