//===- MoEOps.td - operations of the moe dialect -----------*- tablegen -*-===//
//
// Conventions: activations are tensor<T x D x f> with T the token count (the
// tokens of all sequences of a batch, flattened); linear weights use the
// checkpoint's [out, in] layout; stacked expert weights add a leading expert
// dimension [E, out, in]. Every op is Pure: it is a function of its operands.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_DIALECT_MOE_IR_MOEOPS_TD
#define MOE_DIALECT_MOE_IR_MOEOPS_TD

include "moe/Dialect/MoE/IR/MoEBase.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

def MoE_FloatTensor : RankedTensorOf<[AnyFloat]>;
def MoE_Activations : 2DTensorOf<[AnyFloat]>;
// What pipeline stages send each other: activations, router statistics,
// an expert dispatch's slots and counts (i32).
def MoE_Transferred : RankedTensorOf<[AnyFloat, I32]>;
def MoE_TokenIds : 1DTensorOf<[AnySignlessInteger]>;
def MoE_Vector : 1DTensorOf<[AnyFloat]>;
def MoE_Matrix : 2DTensorOf<[AnyFloat]>;
def MoE_ExpertStack : 3DTensorOf<[AnyFloat]>;

class MoE_NamedResultOp<string mnemonic, list<Trait> traits = []>
    : MoE_Op<mnemonic, !listconcat(traits, [Pure,
        DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>])>;

//===----------------------------------------------------------------------===//
// Weights
//===----------------------------------------------------------------------===//

def MoE_WeightOpInterface : OpInterface<"WeightOpInterface"> {
  let cppNamespace = "::moe";
  let description = [{
    A checkpoint tensor and what the importer knows of it: how it is laid
    out across ranks (its role) and which decoder layer it belongs to. The
    sharding passes, the partitioner and the weight slices read these,
    never the tensor's name.
  }];
  let methods = [
    InterfaceMethod<"the checkpoint name (`{e}` for an expert stack)",
                    "::llvm::StringRef", "getTensorName">,
    InterfaceMethod<"how tensor / expert parallelism split it",
                    "::moe::WeightRole", "getWeightRole">,
    InterfaceMethod<"its decoder layer; none outside the layers",
                    "std::optional<int64_t>", "getDecoderLayer">,
  ];
}

def MoE_AdjointOpInterface : OpInterface<"AdjointOpInterface"> {
  let cppNamespace = "::moe";
  let description = [{
    The op's adjoint rule: given the gradients of the loss with respect to
    its results (null where none flows), builds the ops that compute the
    gradients with respect to its operands (null where the operand is not
    differentiable: ids, positions, labels, routing choices).
  }];
  let methods = [
    InterfaceMethod<"builds the operands' gradients at the builder's point",
      "::mlir::LogicalResult", "buildAdjoint",
      (ins "::mlir::OpBuilder &":$b, "::mlir::ArrayRef<::mlir::Value>":$resultGrads,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGrads)>,
  ];
}

def MoE_WeightOp : MoE_NamedResultOp<"weight", [
    DeclareOpInterfaceMethods<MoE_WeightOpInterface>]> {
  let summary = "a checkpoint tensor, by its name";
  let description = [{
    The value of the checkpoint tensor `name` (its Hugging Face name, e.g.
    `model.layers.0.self_attn.q_proj.weight`) with the result's static shape
    and element type. `as ROLE` says how tensor parallelism lays it out
    (`#moe` WeightRole; absent: replicated) and `layer N` its decoder layer
    (absent: outside the layers: embedding, final norm, LM head); the
    importer records both, and the sharding passes read them through
    `WeightOpInterface`. The printed SSA name is the tensor name without the
    `model.` prefix and `.weight` suffix.

    ```mlir
    %layers.0.self_attn.q_proj = moe.weight "model.layers.0.self_attn.q_proj.weight" as column layer 0 : tensor<4096x4096xbf16>
    ```
  }];
  let arguments = (ins StrAttr:$name, OptionalAttr<MoE_WeightRole>:$role,
                       OptionalAttr<I64Attr>:$layer);
  let results = (outs MoE_FloatTensor:$result);
  let assemblyFormat = [{
    $name (`as` $role^)? (`layer` $layer^)? attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
  let builders = [
    OpBuilder<(ins "::mlir::Type":$type, "::llvm::StringRef":$name), [{
      build($_builder, $_state, type, name, nullptr, nullptr);
    }]>
  ];
}

def MoE_ExpertWeightOp : MoE_NamedResultOp<"expert_weight", [
    DeclareOpInterfaceMethods<MoE_WeightOpInterface>]> {
  let summary = "the same tensor of every routed expert, stacked along dimension 0";
  let description = [{
    Row `e` of the result is the checkpoint tensor named `name` with `{e}`
    replaced by the decimal expert index, so a [E, out, in] stack stands for E
    per-expert tensors as published (Mixtral's
    `model.layers.0.block_sparse_moe.experts.{e}.w1.weight`). Expert
    parallelism splits this value along dimension 0; expert tensor
    parallelism splits each expert's dimension `etp_dim` (0: its output rows,
    gate / up; 1: its input columns, down; absent: 0). `layer N`: its decoder
    layer.

    ```mlir
    %w1 = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w1.weight" layer 0 : tensor<8x14336x4096xbf16>
    %w2 = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w2.weight" etp_dim 1 layer 0 : tensor<8x4096x14336xbf16>
    ```
  }];
  let arguments = (ins StrAttr:$name, OptionalAttr<I64Attr>:$etp_dim,
                       OptionalAttr<I64Attr>:$layer);
  let results = (outs MoE_ExpertStack:$result);
  let assemblyFormat = [{
    $name (`etp_dim` $etp_dim^)? (`layer` $layer^)? attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
  let builders = [
    OpBuilder<(ins "::mlir::Type":$type, "::llvm::StringRef":$name), [{
      build($_builder, $_state, type, name, nullptr, nullptr);
    }]>
  ];
  let extraClassDeclaration = [{
    /// The checkpoint name of expert `expert`'s tensor.
    std::string getExpertTensorName(int64_t expert);
    int64_t getNumExperts() { return getType().getDimSize(0); }
    /// The dimension of one expert's tensor that ETP splits (0 or 1).
    int64_t getEtpDimOrDefault() { return getEtpDim().value_or(0); }
  }];
}

//===----------------------------------------------------------------------===//
// Embedding, norms, linear maps
//===----------------------------------------------------------------------===//

def MoE_EmbeddingOp : MoE_NamedResultOp<"embedding", [DeclareOpInterfaceMethods<MoE_AdjointOpInterface>]> {
  let summary = "look up token embeddings";
  let description = [{
    `result[t, :] = table[tokens[t], :]`. Token ids must lie in [0, V); the
    runtime checks them before any compute. `padding_idx` (config.json's
    `pad_token_id`, which transformers gives its `nn.Embedding`) changes
    only the gradient: the table's row of that id gets none from the lookup.

    ```mlir
    %h = moe.embedding %embed_tokens[%tokens] padding_idx = 0 : tensor<32000x4096xbf16>, tensor<?xi32> -> tensor<?x4096xbf16>
    ```
  }];
  let arguments = (ins MoE_Matrix:$table, MoE_TokenIds:$tokens,
                       OptionalAttr<I64Attr>:$padding_idx);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $table `[` $tokens `]` (`padding_idx` `=` $padding_idx^)? attr-dict `:` type($table) `,`
    type($tokens) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_RMSNormOp : MoE_NamedResultOp<"rms_norm", [AllTypesMatch<["input", "result"]>,
    DeclareOpInterfaceMethods<MoE_AdjointOpInterface>]> {
  let summary = "root-mean-square normalisation with a learned scale";
  let description = [{
    With `weight` of size N dividing the last dimension D of `input`, each row
    is split into D/N groups of N (D/N = 1: the usual norm over the hidden
    size; D/N = heads: Qwen3's per-head q/k norm) and each group g becomes
    `g / sqrt(mean(g^2) + epsilon) * weight`, computed in f32 and rounded to the
    result type after the scaling.

    With `sum_squares` ([T, 1] f32) the input is a part of rows of
    `row_width` values that tensor parallelism splits (moe-partition's form
    of OLMoE's q_norm / k_norm, which normalise the whole row): the mean
    is `sum_squares / row_width` (the whole row's sum of squares, each
    rank's moe.row_sum_squares added over tp), and `weight` is the part's.

    ```mlir
    %n = moe.rms_norm %h, %input_layernorm eps = 1.000000e-05 : tensor<?x4096xbf16>, tensor<4096xbf16>
    ```
  }];
  let arguments = (ins MoE_Activations:$input, MoE_Vector:$weight,
                       Optional<MoE_Activations>:$sum_squares, F64Attr:$epsilon,
                       OptionalAttr<I64Attr>:$row_width);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $input `,` $weight (`sum_squares` `(` $sum_squares^ `:` type($sum_squares) `)`)?
    `eps` `=` $epsilon attr-dict `:` type($input) `,` type($weight)
  }];
  let hasVerifier = 1;
}

def MoE_RowSumSquaresOp : MoE_NamedResultOp<"row_sum_squares"> {
  let summary = "each row's sum of squares, [T, D] -> [T, 1] in f32";
  let description = [{
    The sum of the squares of each row's values (in f32, accumulated in
    double): under tensor parallelism a rank's part of the sum a whole-row
    moe.rms_norm needs (`sum_squares`, added over tp).
  }];
  let arguments = (ins MoE_Activations:$input);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def MoE_LayerNormOp : MoE_NamedResultOp<"layer_norm", [AllTypesMatch<["input", "result"]>]> {
  let summary = "layer normalisation over the last dimension";
  let description = [{
    `(x - mean(x)) / sqrt(var(x) + epsilon) * weight + bias` per row, with
    the biased variance, computed in f32; `bias` is optional.
  }];
  let arguments = (ins MoE_Activations:$input, MoE_Vector:$weight,
                       Optional<MoE_Vector>:$bias, F64Attr:$epsilon);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $input `,` $weight (`,` $bias^)? `eps` `=` $epsilon attr-dict `:` type($input) `,` type($weight) (`,` type($bias)^)?
  }];
  let hasVerifier = 1;
}

def MoE_AddNormOp : MoE_Op<"add_norm", [Pure,
    AllTypesMatch<["lhs", "rhs", "sum", "result"]>,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]> {
  let summary = "a residual add and the norm of its sum, in one pass over the rows";
  let description = [{
    `sum = lhs + rhs` (as `moe.add`) and `result` = the norm of `sum`: with
    `layer`, `moe.layer_norm` (weight spanning the row, optional bias),
    otherwise `moe.rms_norm` (weight size dividing the row width). Bit for
    bit the two ops it replaces; `moe-fuse-add-norm` makes it after
    partitioning so that every backend reads each residual row once. When
    nothing reads `sum` the backends need not store it.

    ```mlir
    %h1, %norm = moe.add_norm %h0, %attn_out, %post_attention_layernorm eps = 1.000000e-05 : tensor<?x4096xbf16>, tensor<4096xbf16>
    ```
  }];
  let arguments = (ins MoE_Activations:$lhs, MoE_Activations:$rhs, MoE_Vector:$weight,
                       Optional<MoE_Vector>:$bias, F64Attr:$epsilon, UnitAttr:$layer);
  let results = (outs MoE_Activations:$sum, MoE_Activations:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs `,` (`layer` $layer^)? $weight (`,` $bias^)? `eps` `=` $epsilon attr-dict `:`
    type($lhs) `,` type($weight) (`,` type($bias)^)?
  }];
  let hasVerifier = 1;
}

def MoE_LinearOp : MoE_NamedResultOp<"linear", [DeclareOpInterfaceMethods<MoE_AdjointOpInterface>]> {
  let summary = "y = x W^T (+ b), the checkpoint's [out, in] layout";
  let description = [{
    `result[t, o] = sum_i input[t, i] * weight[o, i] + bias[o]`, accumulated in
    f32 and rounded once to the result element type (which may differ from
    the input's: the LM head produces f32 logits).

    ```mlir
    %q = moe.linear %n, %layers.0.self_attn.q_proj : tensor<?x4096xbf16>, tensor<4096x4096xbf16> -> tensor<?x4096xbf16>
    ```
  }];
  let arguments = (ins MoE_Activations:$input, MoE_Matrix:$weight, Optional<MoE_Vector>:$bias);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $input `,` $weight (`,` $bias^)? attr-dict `:` type($input) `,` type($weight) (`,` type($bias)^)? `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_SplitOp : MoE_NamedResultOp<"split", [DeclareOpInterfaceMethods<MoE_AdjointOpInterface>]> {
  let summary = "split the last dimension into consecutive pieces";
  let description = [{
    The results' last dimensions add up to the input's; result i holds the
    columns after those of results 0..i-1 (MLA's compressed KV and its
    rotary key part).

    ```mlir
    %ckv, %k_rope = moe.split %kv_a : tensor<?x576xbf16> -> tensor<?x512xbf16>, tensor<?x64xbf16>
    ```
  }];
  let arguments = (ins MoE_Activations:$input);
  let results = (outs Variadic<MoE_Activations>:$results);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($results)";
  let hasVerifier = 1;
}

def MoE_ConcatOp : MoE_NamedResultOp<"concat", [DeclareOpInterfaceMethods<MoE_AdjointOpInterface>]> {
  let summary = "join pieces along the last dimension (the inverse of moe.split)";
  let description = [{
    The result's columns are input 0's, then input 1's, and so on: its last
    dimension is the sum of theirs, its rows and element type theirs. The
    inverse of `moe.split` (and its gradient: the backward of a split is the
    concat of the pieces' gradients, the backward of a concat the split).

    ```mlir
    %kv_a = moe.concat %ckv, %k_rope : tensor<?x512xbf16>, tensor<?x64xbf16> -> tensor<?x576xbf16>
    ```
  }];
  let arguments = (ins Variadic<MoE_Activations>:$inputs);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = "$inputs attr-dict `:` type($inputs) `->` type($result)";
  let hasVerifier = 1;
}

def MoE_AddOp : MoE_NamedResultOp<"add", [SameOperandsAndResultType,
    DeclareOpInterfaceMethods<MoE_AdjointOpInterface>]> {
  let summary = "elementwise sum (the residual connection)";
  let description = [{
    ```mlir
    %h1 = moe.add %h0, %attn_out : tensor<?x4096xbf16>
    ```
  }];
  let arguments = (ins MoE_Activations:$lhs, MoE_Activations:$rhs);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def MoE_SigmoidGateOp : MoE_NamedResultOp<"sigmoid_gate", [AllTypesMatch<["input", "result"]>,
    DeclareOpInterfaceMethods<MoE_AdjointOpInterface>]> {
  let summary = "scale each row by the sigmoid of a per-row logit";
  let description = [{
    `result[t, :] = input[t, :] * sigmoid(gate[t, 0])`: Qwen2-MoE's shared
    expert gate, where `gate` is a [T, 1] linear map of the hidden state.
  }];
  let arguments = (ins MoE_Activations:$input, MoE_Activations:$gate);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = "$input `,` $gate attr-dict `:` type($input) `,` type($gate)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

def MoE_RopeOp : MoE_NamedResultOp<"rope", [AllTypesMatch<["input", "result"]>,
    DeclareOpInterfaceMethods<MoE_AdjointOpInterface>]> {
  let summary = "rotary position embedding applied to every head";
  let description = [{
    `input` holds heads of `head_dim` values side by side; in each head the
    first `rope.rotary_dim` values are rotated by angle
    `positions[t] * inv_freq[i]` (see `#moe.rope` for the frequencies and the
    pairing), the rest pass unchanged.

    In IR the attribute is written without its `#moe.rope` prefix (the op
    knows its kind), as printed:
    ```mlir
    %q_rot = moe.rope %q, %positions head_dim = 128 <kind = default, theta = 1.000000e+06, rotary_dim = 128> : tensor<?x4096xbf16>, tensor<?xi32>
    ```
  }];
  let arguments = (ins MoE_Activations:$input, MoE_TokenIds:$positions,
                       I64Attr:$head_dim, MoE_RopeAttr:$rope);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $input `,` $positions `head_dim` `=` $head_dim $rope attr-dict `:` type($input) `,` type($positions)
  }];
  let hasVerifier = 1;
}

def MoE_AttentionOp : MoE_NamedResultOp<"attention", [DeclareOpInterfaceMethods<MoE_AdjointOpInterface>]> {
  let summary = "causal multi-head / grouped-query attention";
  let description = [{
    `query` holds `num_heads` heads, `key` and `value` `num_kv_heads` heads
    (query head h reads kv head h / (num_heads / num_kv_heads)). Per sequence,
    token t attends to the tokens s <= t of its own sequence (and, with
    `sliding_window` W, only to s > t - W):
    `out_h = softmax(q_h K_h^T * scale) V_h`, in f32. The head dims follow from
    the operand widths; q and k must agree. The runtime decides how the keys
    and values of earlier steps are cached.

    ```mlir
    %a = moe.attention %q_rot, %k_rot, %v heads = 32 kv_heads = 8 scale = 0.088388347648318433 : tensor<?x4096xbf16>, tensor<?x1024xbf16>, tensor<?x1024xbf16> -> tensor<?x4096xbf16>
    ```
  }];
  let arguments = (ins MoE_Activations:$query, MoE_Activations:$key, MoE_Activations:$value,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads, F64Attr:$scale,
                       OptionalAttr<I64Attr>:$sliding_window);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $query `,` $key `,` $value `heads` `=` $num_heads `kv_heads` `=` $num_kv_heads `scale` `=` $scale
    attr-dict `:` type($query) `,` type($key) `,` type($value) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_MLAttentionOp : MoE_NamedResultOp<"mla_attention", [DeclareOpInterfaceMethods<MoE_AdjointOpInterface>]> {
  let summary = "DeepSeek's multi-head latent attention core";
  let description = [{
    Operands, per token: `query` [H x (n + r)] (per head: n "nope" values then
    r rotary values), `kv` [H x (n + v)], the up-projected latent (per head: n
    key values then v value values), `key_rope` [r] shared by all heads, and
    the positions. The rotary parts of the query and of `key_rope` are rotated
    with `rope` (DeepSeek uses `interleaved = true`); head h's key is
    `concat(kv_h[:n], rope(key_rope))`, its value `kv_h[n:]`, and the output is
    causal attention `softmax(q_h k_h^T * scale) v_h`, [T, H x v]. H is
    `num_heads`; n, r and v follow from the operand widths.

    ```mlir
    %a = moe.mla_attention %q, %kv, %k_rope, %positions heads = 128 scale = 0.1352 <kind = yarn, theta = 1.000000e+04, rotary_dim = 64, interleaved = true, factor = 4.000000e+01, original_max_position = 4096, mscale_all_dim = 1.000000e+00> : ...
    ```
  }];
  let arguments = (ins MoE_Activations:$query, MoE_Activations:$kv, MoE_Activations:$key_rope,
                       MoE_TokenIds:$positions, I64Attr:$num_heads, F64Attr:$scale,
                       MoE_RopeAttr:$rope);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $query `,` $kv `,` $key_rope `,` $positions `heads` `=` $num_heads `scale` `=` $scale $rope
    attr-dict `:` type($query) `,` type($kv) `,` type($key_rope) `,` type($positions) `->` type($result)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    int64_t getRopeHeadDim() { return getKeyRope().getType().getDimSize(1); }
    int64_t getNopeHeadDim() {
      return getQuery().getType().getDimSize(1) / getNumHeads() - getRopeHeadDim();
    }
    int64_t getValueHeadDim() {
      return getKv().getType().getDimSize(1) / getNumHeads() - getNopeHeadDim();
    }
  }];
}

//===----------------------------------------------------------------------===//
// Feed-forward: dense MLP, router, routed experts
//===----------------------------------------------------------------------===//

def MoE_MLPOp : MoE_NamedResultOp<"mlp", [AllTypesMatch<["input", "result"]>,
    DeclareOpInterfaceMethods<MoE_AdjointOpInterface>]> {
  let summary = "gated MLP: down(act(gate(x)) * up(x))";
  let description = [{
    `result = (act(x W_gate^T) * (x W_up^T)) W_down^T` with weights [I, H],
    [I, H] and [H, I]: a dense layer's MLP or a shared expert.

    ```mlir
    %y = moe.mlp silu %n, %gate_proj, %up_proj, %down_proj : tensor<?x7168xbf16>, tensor<18432x7168xbf16>, tensor<18432x7168xbf16>, tensor<7168x18432xbf16>
    ```
  }];
  let arguments = (ins MoE_Activations:$input, MoE_Matrix:$gate_weight,
                       MoE_Matrix:$up_weight, MoE_Matrix:$down_weight,
                       MoE_Activation:$activation);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $activation $input `,` $gate_weight `,` $up_weight `,` $down_weight attr-dict `:`
    type($input) `,` type($gate_weight) `,` type($up_weight) `,` type($down_weight)
  }];
  let hasVerifier = 1;
}

def MoE_RouterOp : MoE_Op<"router", [Pure,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]> {
  let summary = "choose the top-k routed experts of every token and their weights";
  let description = [{
    Computes the logits `x W_g^T` (W_g: [E, H]) in the routing's
    `compute_type` and applies `#moe.routing` (whose description gives the
    exact math) with the optional score-correction bias [E]. Results: the
    selected experts' weights [T, k] (in `compute_type`) and their indices
    [T, k] (i32), in descending order of the selection key. The fusion
    of `moe.linear` (the logits) and `moe.route` that `moe-fuse-router`
    makes.

    ```mlir
    %weights, %experts = moe.router %n, %gate <scoring = softmax, top_k = 2, normalize = true, compute_type = f32> : tensor<?x4096xbf16>, tensor<8x4096xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
    ```
  }];
  let arguments = (ins MoE_Activations:$input, MoE_Matrix:$gate_weight,
                       Optional<MoE_Vector>:$correction_bias, MoE_RoutingAttr:$routing);
  let results = (outs MoE_Activations:$weights, 2DTensorOf<[I32]>:$experts);
  let assemblyFormat = [{
    $input `,` $gate_weight (`bias` $correction_bias^)? $routing attr-dict `:`
    type($input) `,` type($gate_weight) (`,` type($correction_bias)^)? `->` type($weights) `,` type($experts)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    int64_t getNumExperts() { return getGateWeight().getType().getDimSize(0); }
  }];
}

def MoE_RouteOp : MoE_Op<"route", [Pure, DeclareOpInterfaceMethods<MoE_AdjointOpInterface>,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]> {
  let summary = "choose each token's top-k experts and their weights from its router logits";
  let description = [{
    Applies `#moe.routing` (whose description gives the exact math) to the
    router logits [T, E] (the gate's `moe.linear`, in the routing's
    `compute_type`) with the optional score-correction bias [E]. Results:
    the selected experts' weights [T, k] (in `compute_type`) and their
    indices [T, k] (i32), in descending order of the selection key. The
    importer emits `moe.linear` + `moe.route`; `moe-fuse-router` folds the
    pair into `moe.router` (one kernel: the GEMM and the routing epilogue).

    ```mlir
    %weights, %experts = moe.route %logits <scoring = softmax, top_k = 2, normalize = true, compute_type = f32> : tensor<?x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
    ```
  }];
  let arguments = (ins MoE_Activations:$logits, Optional<MoE_Vector>:$correction_bias,
                       MoE_RoutingAttr:$routing);
  let results = (outs MoE_Activations:$weights, 2DTensorOf<[I32]>:$experts);
  let assemblyFormat = [{
    $logits (`bias` $correction_bias^)? $routing attr-dict `:`
    type($logits) (`,` type($correction_bias)^)? `->` type($weights) `,` type($experts)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    int64_t getNumExperts() { return getLogits().getType().getDimSize(1); }
  }];
}

def MoE_ExpertsOp : MoE_NamedResultOp<"experts", [AllTypesMatch<["input", "result"]>,
    DeclareOpInterfaceMethods<MoE_AdjointOpInterface>]> {
  let summary = "the weighted sum of each token's selected routed experts";
  let description = [{
    `result[t] = sum_j weights[t, j] * mlp_{experts[t, j]}(input[t])` where
    expert e's MLP is `moe.mlp` with slices e of the three stacks ([E, I, H],
    [E, I, H], [E, H, I]). Mathematically a sum over tokens; implementations
    compute it as grouped GEMMs over the tokens routed to each expert.

    ```mlir
    %y = moe.experts silu %n, %weights, %experts, %w1, %w3, %w2 : tensor<?x4096xbf16>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x14336x4096xbf16>, tensor<8x14336x4096xbf16>, tensor<8x4096x14336xbf16>
    ```
  }];
  let arguments = (ins MoE_Activations:$input, MoE_Activations:$weights,
                       2DTensorOf<[I32]>:$experts, MoE_ExpertStack:$gate_weights,
                       MoE_ExpertStack:$up_weights, MoE_ExpertStack:$down_weights,
                       MoE_Activation:$activation);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $activation $input `,` $weights `,` $experts `,` $gate_weights `,` $up_weights `,` $down_weights
    attr-dict `:` type($input) `,` type($weights) `,` type($experts) `,`
    type($gate_weights) `,` type($up_weights) `,` type($down_weights)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Partitioned programs: capacity-limited dispatch and collectives
//
// `moe-partition` rewrites a sharded module into one program per pipeline
// stage with rank-local shapes and these ops (docs/partitioned-execution.md
// has the complete semantics). A collective names a device mesh (@mesh or
// @experts, from moe-plan-sharding) and one of its axes; its group is the
// ranks that agree with the caller on every other axis. Collectives and
// point-to-point ops have side effects: they are never CSE'd, hoisted or
// removed.
//===----------------------------------------------------------------------===//

class MoE_CollectiveOp<string mnemonic, list<Trait> traits = []>
    : MoE_Op<mnemonic, traits>;

def MoE_AllReduceOp : MoE_CollectiveOp<"all_reduce",
    [AllTypesMatch<["input", "result"]>]> {
  let summary = "elementwise sum over a mesh axis group";
  let description = [{
    Every member of the group contributes `input`; each gets the elementwise
    sum. Inserted after row-parallel layers (partial sums) and the
    vocabulary-sharded embedding, and in a training program for a weight
    gradient the group's ranks computed in parts (a norm's or an expert
    stack's: 1-D to 3-D).

    ```mlir
    %r = moe.all_reduce %o_proj over @mesh[2] : tensor<?x4096xf32>
    ```
  }];
  let arguments = (ins TensorOf<[AnyFloat]>:$input, FlatSymbolRefAttr:$mesh,
                       I64Attr:$axis);
  let results = (outs TensorOf<[AnyFloat]>:$result);
  let assemblyFormat = "$input `over` $mesh `[` $axis `]` attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def MoE_AllGatherOp : MoE_CollectiveOp<"all_gather"> {
  let summary = "concatenate the members' columns, in group order";
  let description = [{
    `result[:, q*w:(q+1)*w] = input of member q` for an input [T, w]: the
    result is n times as wide (n: the group's size). Joins the
    vocabulary-parallel LM head's logits.

    ```mlir
    %all = moe.all_gather %logits over @mesh[2] : tensor<?x16032xf32> -> tensor<?x128256xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$input, FlatSymbolRefAttr:$mesh,
                       I64Attr:$axis);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $input `over` $mesh `[` $axis `]` attr-dict `:` type($input) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_SendOp : MoE_Op<"send"> {
  let summary = "send a value to a neighbouring pipeline stage";
  let description = [{
    Sends `input` to the rank of stage `stage` with the same dp and tp
    coordinates; that rank's program has the matching `moe.recv` (sends and
    receives between two stages are in the same order). Activations go to
    the next stage; a pipelined training program also sends other values
    its neighbours read (a layer's router statistics, an expert dispatch's
    slots, i32) and, backward, gradients to the stage before.

    ```mlir
    moe.send %residual to 1 : tensor<?x4096xf32>
    ```
  }];
  let arguments = (ins MoE_Transferred:$input, I64Attr:$stage);
  let assemblyFormat = "$input `to` $stage attr-dict `:` type($input)";
}

def MoE_RecvOp : MoE_Op<"recv"> {
  let summary = "receive a value from a neighbouring pipeline stage";
  let description = [{
    ```mlir
    %residual = moe.recv from 0 : tensor<?x4096xf32>
    ```
  }];
  let arguments = (ins I64Attr:$stage);
  let results = (outs MoE_Transferred:$result);
  let assemblyFormat = "`from` $stage attr-dict `:` type($result)";
}

def MoE_DispatchOp : MoE_Op<"dispatch", [Pure,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmResultNames"]>]> {
  let summary = "capacity-limited dispatch of tokens into per-expert slots";
  let description = [{
    Copies each kept (token, choice) assignment's row of `input` into the
    slots of its expert: `buffer` [E, C, H] holds expert e's rows at
    `buffer[e, 0..counts[e])`, `slots` [T, k] says where each assignment went
    (`e * C + n`) or -1 when it was dropped or belongs to another rank's row
    part. The step's capacity is `c(T) = min(T, ceil(capacity_factor * T *
    k / E))` (`capacity_factor` 0: dropless, `c(T) = T`), and the static
    `capacity` C is c(max_batch_tokens). Drop policy: assignments in (t, j)
    order; one is kept when fewer than c(T) assignments to its expert came
    before it, counting all T rows. The rank dispatches only rows
    `[T*p/P, T*(p+1)/P)` of its part `p = tp / row_part_stride` (P =
    `row_parts`), so that the ranks of a TP group share the work.

    ```mlir
    %buf, %counts, %slots = moe.dispatch %n, %experts capacity = 640 factor = 1.25 parts = 1 stride = 1 : tensor<?x4096xf32>, tensor<?x2xi32> -> tensor<8x640x4096xf32>, tensor<8xi32>, tensor<?x2xi32>
    ```
  }];
  let arguments = (ins MoE_Activations:$input, 2DTensorOf<[I32]>:$experts,
                       I64Attr:$capacity, F64Attr:$capacity_factor,
                       I64Attr:$row_parts, I64Attr:$row_part_stride);
  let results = (outs 3DTensorOf<[AnyFloat]>:$buffer, 1DTensorOf<[I32]>:$counts,
                      2DTensorOf<[I32]>:$slots);
  let assemblyFormat = [{
    $input `,` $experts `capacity` `=` $capacity `factor` `=` $capacity_factor
    `parts` `=` $row_parts `stride` `=` $row_part_stride attr-dict `:`
    type($input) `,` type($experts) `->` type($buffer) `,` type($counts) `,` type($slots)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    int64_t getNumExperts() { return getBuffer().getType().getDimSize(0); }
  }];
}

def MoE_AllToAllOp : MoE_CollectiveOp<"all_to_all",
    [AllTypesMatch<["buffer", "result"]>, AllTypesMatch<["counts", "result_counts"]>]> {
  let summary = "exchange per-expert slots between the ranks of an EP group";
  let description = [{
    With n members and E = n * El experts, chunk q of `buffer` and `counts`
    (experts [q*El, (q+1)*El)) goes to member q; chunk q of the results is
    what member q sent. Only each expert's first `counts[e]` rows move. The
    same op brings expert outputs back (with the received counts).

    ```mlir
    %rbuf, %rcounts = moe.all_to_all %buf, %counts over @experts[2] : tensor<8x640x4096xf32>, tensor<8xi32>
    ```
  }];
  let arguments = (ins 3DTensorOf<[AnyFloat]>:$buffer, 1DTensorOf<[I32]>:$counts,
                       FlatSymbolRefAttr:$mesh, I64Attr:$axis);
  let results = (outs 3DTensorOf<[AnyFloat]>:$result, 1DTensorOf<[I32]>:$result_counts);
  let assemblyFormat = [{
    $buffer `,` $counts `over` $mesh `[` $axis `]` attr-dict `:` type($buffer) `,` type($counts)
  }];
  let hasVerifier = 1;
}

def MoE_ExpertFFNOp : MoE_NamedResultOp<"expert_ffn",
    [AllTypesMatch<["buffer", "result"]>]> {
  let summary = "the local experts' MLPs over their slots";
  let description = [{
    `buffer` [E, C, H] read as [n, El, C, H] (n = E / El sources, El the
    stacks' experts): `result[q, l, r] = mlp_l(buffer[q, l, r])` for `r <
    counts[q*El + l]` (rows past the count are left undefined). With expert
    tensor parallelism the stacks are this rank's slices of every expert and
    the result is a partial sum.

    ```mlir
    %y = moe.expert_ffn silu %rbuf, %rcounts, %w1, %w3, %w2 : tensor<8x640x4096xf32>, tensor<8xi32>, tensor<4x14336x4096xbf16>, tensor<4x14336x4096xbf16>, tensor<4x4096x14336xbf16>
    ```
  }];
  let arguments = (ins 3DTensorOf<[AnyFloat]>:$buffer, 1DTensorOf<[I32]>:$counts,
                       MoE_ExpertStack:$gate_weights, MoE_ExpertStack:$up_weights,
                       MoE_ExpertStack:$down_weights, MoE_Activation:$activation);
  let results = (outs 3DTensorOf<[AnyFloat]>:$result);
  let assemblyFormat = [{
    $activation $buffer `,` $counts `,` $gate_weights `,` $up_weights `,` $down_weights
    attr-dict `:` type($buffer) `,` type($counts) `,` type($gate_weights) `,`
    type($up_weights) `,` type($down_weights)
  }];
  let hasVerifier = 1;
}

def MoE_CombineOp : MoE_NamedResultOp<"combine"> {
  let summary = "weighted sum of each token's expert outputs, back in token order";
  let description = [{
    `result[t] = sum_j weights[t, j] * outputs[slots[t, j]]` over the j with
    `slots[t, j] >= 0`, j in order (f32); rows without a kept assignment are
    0 (a token whose choices were all dropped passes through the residual).

    ```mlir
    %moe = moe.combine %back, %slots, %routing_weights : tensor<8x640x4096xf32>, tensor<?x2xi32>, tensor<?x2xf32> -> tensor<?x4096xf32>
    ```
  }];
  let arguments = (ins 3DTensorOf<[AnyFloat]>:$outputs, 2DTensorOf<[I32]>:$slots,
                       MoE_Activations:$weights);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $outputs `,` $slots `,` $weights attr-dict `:` type($outputs) `,` type($slots) `,`
    type($weights) `->` type($result)
  }];
  let hasVerifier = 1;
}

include "moe/Dialect/MoE/IR/MoETrainingOps.td"
include "moe/Dialect/MoE/IR/MoEGradientOps.td"

#endif // MOE_DIALECT_MOE_IR_MOEOPS_TD
