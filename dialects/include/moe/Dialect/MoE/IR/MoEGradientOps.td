//===- MoEGradientOps.td - the backward pass's ops ---------*- tablegen -*-===//
//
// `moe-differentiate` builds a training program's backward pass from these:
// each is the vector-Jacobian product of one forward op (the op's adjoint
// rule, AdjointOpInterface, says which), taking the gradient of the forward
// op's result and what the forward op read (its saved activations), and
// giving the gradients of its operands. Weight gradients are f32 whatever
// the weight's dtype. docs/training.md.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_DIALECT_MOE_IR_MOEGRADIENTOPS_TD
#define MOE_DIALECT_MOE_IR_MOEGRADIENTOPS_TD

def MoE_CrossEntropyGradOp : MoE_NamedResultOp<"cross_entropy_grad"> {
  let summary = "d(mean cross-entropy) / d logits";
  let description = [{
    `result[t] = (softmax(logits[t, :vocab]) - onehot(labels[t])) / n` for
    the rows counted by `ce` = moe.cross_entropy's [sum, n], 0 in the other
    rows and in the padding columns from `vocab` on.

    ```mlir
    %dl = moe.cross_entropy_grad %logits, %labels, %ce vocab = 251 : tensor<?x251xf32>, tensor<?xi32>, tensor<2xf32> -> tensor<?x251xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$logits, 1DTensorOf<[I32]>:$labels,
                       1DTensorOf<[F32]>:$cross_entropy, I64Attr:$vocab);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $logits `,` $labels `,` $cross_entropy `vocab` `=` $vocab attr-dict `:` type($logits) `,`
    type($labels) `,` type($cross_entropy) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_LinearGradOp : MoE_Op<"linear_grad", [Pure]> {
  let summary = "the gradients of y = x W^T: dx = dy W and dW = dy^T x";
  let description = [{
    `dy` [T, out], `input` x [T, in], `weight` W [out, in]: `input_grad`
    [T, in] = dy W, `weight_grad` [out, in] (f32) = dy^T x, summed over the
    rows in order.

    ```mlir
    %dx, %dw = moe.linear_grad %dy, %x, %w : tensor<?x64xf32>, tensor<?x32xf32>, tensor<64x32xf32> -> tensor<?x32xf32>, tensor<64x32xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$grad, MoE_Activations:$input, MoE_Matrix:$weight);
  let results = (outs MoE_Activations:$input_grad, 2DTensorOf<[F32]>:$weight_grad);
  let assemblyFormat = [{
    $grad `,` $input `,` $weight attr-dict `:` type($grad) `,` type($input) `,` type($weight)
    `->` type($input_grad) `,` type($weight_grad)
  }];
  let hasVerifier = 1;
}

def MoE_RMSNormGradOp : MoE_Op<"rms_norm_grad", [Pure]> {
  let summary = "the gradients of moe.rms_norm with respect to its input and scale";
  let description = [{
    Per group g of N values (moe.rms_norm's groups) with r = 1 / sqrt(mean(g^2)
    + eps) and n = g r: `input_grad = r (dy w - n mean(dy w n))`,
    `weight_grad[i] = sum over rows and groups of dy[i] n[i]` (f32).

    ```mlir
    %dx, %dw = moe.rms_norm_grad %dy, %x, %w eps = 1.0e-05 : tensor<?x64xf32>, tensor<?x64xf32>, tensor<64xf32> -> tensor<?x64xf32>, tensor<64xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$grad, MoE_Activations:$input, MoE_Vector:$weight,
                       F64Attr:$epsilon);
  let results = (outs MoE_Activations:$input_grad, 1DTensorOf<[F32]>:$weight_grad);
  let assemblyFormat = [{
    $grad `,` $input `,` $weight `eps` `=` $epsilon attr-dict `:` type($grad) `,` type($input)
    `,` type($weight) `->` type($input_grad) `,` type($weight_grad)
  }];
  let hasVerifier = 1;
}

def MoE_RopeGradOp : MoE_NamedResultOp<"rope_grad", [AllTypesMatch<["grad", "result"]>]> {
  let summary = "the gradient of moe.rope: the rotation by the opposite angle";
  let description = [{
    moe.rope is a rotation of each pair by `positions[t] * inv_freq[i]`
    (times the attention factor of YaRN-style scalings, as the forward
    applies it); its transpose rotates `grad` by the opposite angle with
    the same factor. The values past `rotary_dim` pass unchanged.

    ```mlir
    %dq = moe.rope_grad %dq_rot, %positions head_dim = 16 <kind = default, theta = 1.000000e+06, rotary_dim = 16> : tensor<?x64xf32>, tensor<?xi32>
    ```
  }];
  let arguments = (ins MoE_Activations:$grad, MoE_TokenIds:$positions, I64Attr:$head_dim,
                       MoE_RopeAttr:$rope);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $grad `,` $positions `head_dim` `=` $head_dim $rope attr-dict `:` type($grad) `,`
    type($positions)
  }];
}

def MoE_AttentionGradOp : MoE_Op<"attention_grad", [Pure]> {
  let summary = "the gradients of moe.attention with respect to q, k and v";
  let description = [{
    Per sequence and head, with P = softmax(q K^T * scale) over the keys
    moe.attention reads (causal, sliding window) recomputed from `query` and
    `key`: dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dP P)),
    dQ = dS K scale, dK = dS^T Q scale; a kv head's dK and dV sum over the
    query heads that read it.

    ```mlir
    %dq, %dk, %dv = moe.attention_grad %do, %q, %k, %v heads = 4 kv_heads = 2 scale = 2.500000e-01 : tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x32xf32>, tensor<?x32xf32> -> tensor<?x64xf32>, tensor<?x32xf32>, tensor<?x32xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$grad, MoE_Activations:$query, MoE_Activations:$key,
                       MoE_Activations:$value, I64Attr:$num_heads, I64Attr:$num_kv_heads,
                       F64Attr:$scale, OptionalAttr<I64Attr>:$sliding_window);
  let results = (outs MoE_Activations:$query_grad, MoE_Activations:$key_grad,
                      MoE_Activations:$value_grad);
  let assemblyFormat = [{
    $grad `,` $query `,` $key `,` $value `heads` `=` $num_heads `kv_heads` `=` $num_kv_heads
    `scale` `=` $scale attr-dict `:` type($grad) `,` type($query) `,` type($key) `,`
    type($value) `->` type($query_grad) `,` type($key_grad) `,` type($value_grad)
  }];
  let hasVerifier = 1;
}

def MoE_MLPGradOp : MoE_Op<"mlp_grad", [Pure]> {
  let summary = "the gradients of moe.mlp with respect to its input and three weights";
  let description = [{
    With a = x Wg^T, u = x Wu^T, h = act(a) u (recomputed):
    `dWd = dy^T h`, `dh = dy Wd`, `da = dh u act'(a)`, `du = dh act(a)`,
    `dWg = da^T x`, `dWu = du^T x`, `dx = da Wg + du Wu`; weight gradients
    in f32.

    ```mlir
    %dx, %dwg, %dwu, %dwd = moe.mlp_grad silu %dy, %x, %wg, %wu, %wd : tensor<?x64xf32>, tensor<?x64xf32>, tensor<96x64xf32>, tensor<96x64xf32>, tensor<64x96xf32> -> tensor<?x64xf32>, tensor<96x64xf32>, tensor<96x64xf32>, tensor<64x96xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$grad, MoE_Activations:$input, MoE_Matrix:$gate_weight,
                       MoE_Matrix:$up_weight, MoE_Matrix:$down_weight,
                       MoE_Activation:$activation);
  let results = (outs MoE_Activations:$input_grad, 2DTensorOf<[F32]>:$gate_weight_grad,
                      2DTensorOf<[F32]>:$up_weight_grad, 2DTensorOf<[F32]>:$down_weight_grad);
  let assemblyFormat = [{
    $activation $grad `,` $input `,` $gate_weight `,` $up_weight `,` $down_weight attr-dict `:`
    type($grad) `,` type($input) `,` type($gate_weight) `,` type($up_weight) `,`
    type($down_weight) `->` type($input_grad) `,` type($gate_weight_grad) `,`
    type($up_weight_grad) `,` type($down_weight_grad)
  }];
  let hasVerifier = 1;
}

def MoE_EmbeddingGradOp : MoE_NamedResultOp<"embedding_grad"> {
  let summary = "the gradient of the embedding table: dy scattered to the rows of the ids";
  let description = [{
    `result[v] = sum over the t with tokens[t] = v of grad[t]` (in order),
    f32, rows of ids that do not occur 0.

    ```mlir
    %dtable = moe.embedding_grad %dy[%tokens] : tensor<?x64xf32>, tensor<?xi32> -> tensor<251x64xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$grad, MoE_TokenIds:$tokens);
  let results = (outs 2DTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $grad `[` $tokens `]` attr-dict `:` type($grad) `,` type($tokens) `->` type($result)
  }];
  let hasVerifier = 1;
}

#endif // MOE_DIALECT_MOE_IR_MOEGRADIENTOPS_TD
