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
    rows and in the padding columns from `vocab` on. With `moe.vocab_shard`
    the logits are the rank's part of the padded vocabulary and `stats`
    the parts' moe.vocab_stats side by side: the softmax's shift and
    normaliser come from them (the vocabulary-parallel cross-entropy).

    ```mlir
    %dl = moe.cross_entropy_grad %logits, %labels, %ce vocab = 251 : tensor<?x251xf32>, tensor<?xi32>, tensor<2xf32> -> tensor<?x251xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$logits, 1DTensorOf<[I32]>:$labels,
                       1DTensorOf<[F32]>:$cross_entropy, Optional<MoE_Activations>:$stats,
                       I64Attr:$vocab);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $logits `,` $labels `,` $cross_entropy (`stats` `(` $stats^ `:` type($stats) `)`)?
    `vocab` `=` $vocab attr-dict `:` type($logits) `,` type($labels) `,` type($cross_entropy)
    `->` type($result)
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

    With `row_stats` ([T, 2] f32) the input is a part of rows of
    `row_width` values that tensor parallelism splits (moe.rms_norm with
    sum_squares): the row's sum of squares and its sum of dy w x
    (moe.rms_norm_grad_stats of each part, added over tp) stand for the
    group's; `weight_grad` is the part's.

    ```mlir
    %dx, %dw = moe.rms_norm_grad %dy, %x, %w eps = 1.0e-05 : tensor<?x64xf32>, tensor<?x64xf32>, tensor<64xf32> -> tensor<?x64xf32>, tensor<64xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$grad, MoE_Activations:$input, MoE_Vector:$weight,
                       Optional<MoE_Activations>:$row_stats, F64Attr:$epsilon,
                       OptionalAttr<I64Attr>:$row_width);
  let results = (outs MoE_Activations:$input_grad, 1DTensorOf<[F32]>:$weight_grad);
  let assemblyFormat = [{
    $grad `,` $input `,` $weight (`row_stats` `(` $row_stats^ `:` type($row_stats) `)`)?
    `eps` `=` $epsilon attr-dict `:` type($grad) `,` type($input)
    `,` type($weight) `->` type($input_grad) `,` type($weight_grad)
  }];
  let hasVerifier = 1;
}

def MoE_RMSNormGradStatsOp : MoE_Op<"rms_norm_grad_stats", [Pure]> {
  let summary = "each row's sum of squares and sum of dy w x, [T, 2] in f32";
  let description = [{
    The two row sums the gradient of a norm of whole rows needs (moe.rms_norm
    with sum_squares): under tensor parallelism each rank's over its part of
    the rows (accumulated in double), added over tp into moe.rms_norm_grad's
    `row_stats`.
  }];
  let arguments = (ins MoE_Activations:$grad, MoE_Activations:$input, MoE_Vector:$weight);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $grad `,` $input `,` $weight attr-dict `:` type($grad) `,` type($input) `,` type($weight)
    `->` type($result)
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
    f32, rows of ids that do not occur 0, and the row `padding_idx` 0 (as
    PyTorch's embedding backward leaves it).

    ```mlir
    %dtable = moe.embedding_grad %dy[%tokens] padding_idx = 0 : tensor<?x64xf32>, tensor<?xi32> -> tensor<251x64xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$grad, MoE_TokenIds:$tokens,
                       OptionalAttr<I64Attr>:$padding_idx);
  let results = (outs 2DTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $grad `[` $tokens `]` (`padding_idx` `=` $padding_idx^)? attr-dict `:` type($grad) `,`
    type($tokens) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_RouteGradOp : MoE_NamedResultOp<"route_grad"> {
  let summary = "d(routing weights) / d(router logits), the selection held fixed";
  let description = [{
    The transpose of `#moe.routing`'s steps 1, 5-7 at the experts moe.route
    selected (`experts`): with r_j the selected scores before renormalising
    (s_{e_j}; softmax over the selected logits for `topk_on = logits` with
    softmax scoring), S = sum_j r_j + 1e-20 and c the scaling factor,
    `dr_j = c (dw_j / S - sum_i dw_i r_i / S^2)` (normalize) or `c dw_j`,
    then through the scores: softmax `dl = s (ds - sum_e s_e ds_e)` with
    ds the dr scattered to the selected experts, sigmoid
    `dl_{e_j} = dr_j s (1 - s)`. The selection itself (top-k, groups, the
    correction bias) takes no gradient, as in autograd.

    ```mlir
    %dl = moe.route_grad %dw, %logits, %experts <scoring = softmax, top_k = 2, normalize = true, compute_type = f32> : tensor<?x2xf32>, tensor<?x8xf32>, tensor<?x2xi32> -> tensor<?x8xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$grad, MoE_Activations:$logits,
                       2DTensorOf<[I32]>:$experts, MoE_RoutingAttr:$routing);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $grad `,` $logits `,` $experts $routing attr-dict `:` type($grad) `,` type($logits) `,`
    type($experts) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_ExpertsGradOp : MoE_Op<"experts_grad", [Pure]> {
  let summary = "the gradients of moe.experts: input, routing weights and expert stacks";
  let description = [{
    Per expert e over the (token t, slot j) routed to it, with y_e = moe.mlp
    of slice e (recomputed, or read from moe.experts_saved's `saved`
    results: its gate and up products and outputs):
    `weights_grad[t, j] = dy[t] . y_e(x[t])`, and
    moe.mlp_grad of slice e with the cotangent `weights[t, j] dy[t]` gives
    the rows' input gradients (summed per token over j in order) and the
    slice's weight gradients. An expert no token reached has weight
    gradients of exactly 0. With `capacity_factor`, the assignments
    moe.experts_saved drops take no part (their weights_grad is 0).

    ```mlir
    %dx, %dw, %d1, %d3, %d2 = moe.experts_grad silu %dy, %x, %weights, %experts, %w1, %w3, %w2 : tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x48x64xf32>, tensor<8x48x64xf32>, tensor<8x64x48xf32> -> tensor<?x64xf32>, tensor<?x2xf32>, tensor<8x48x64xf32>, tensor<8x48x64xf32>, tensor<8x64x48xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$grad, MoE_Activations:$input, MoE_Activations:$weights,
                       2DTensorOf<[I32]>:$experts, MoE_ExpertStack:$gate_weights,
                       MoE_ExpertStack:$up_weights, MoE_ExpertStack:$down_weights,
                       Variadic<MoE_Activations>:$saved, MoE_Activation:$activation,
                       OptionalAttr<F64Attr>:$capacity_factor);
  let results = (outs MoE_Activations:$input_grad, MoE_Activations:$weights_grad,
                      3DTensorOf<[F32]>:$gate_weights_grad, 3DTensorOf<[F32]>:$up_weights_grad,
                      3DTensorOf<[F32]>:$down_weights_grad);
  let assemblyFormat = [{
    $activation $grad `,` $input `,` $weights `,` $experts `,` $gate_weights `,` $up_weights `,`
    $down_weights (`saved` `(` $saved^ `:` type($saved) `)`)? attr-dict `:` type($grad) `,`
    type($input) `,` type($weights) `,` type($experts) `,` type($gate_weights) `,`
    type($up_weights) `,` type($down_weights) `->`
    type($input_grad) `,` type($weights_grad) `,` type($gate_weights_grad) `,`
    type($up_weights_grad) `,` type($down_weights_grad)
  }];
  let hasVerifier = 1;
}

def MoE_CombineGradOp : MoE_Op<"combine_grad", [Pure, AllTypesMatch<["outputs", "outputs_grad"]>]> {
  let summary = "the gradients of moe.combine: the expert outputs' blocks and the routing weights";
  let description = [{
    The transpose of moe.combine's weighted sum at the kept slots
    (`slots[t, j] >= 0`): `outputs_grad[slots[t, j]] = weights[t, j]
    grad[t]` and `weights_grad[t, j] = grad[t] . outputs[slots[t, j]]`
    (summed in f64); a dropped slot's weights_grad is 0 and rows that no
    slot names are left undefined (moe.expert_ffn_grad reads only a block's
    first counts rows). The blocks then travel to their experts as the
    forward's did (all_to_all under expert parallelism).

    ```mlir
    %dout, %dw = moe.combine_grad %dy, %back, %slots, %routing_weights : tensor<?x64xf32>, tensor<8x64x64xf32>, tensor<?x2xi32>, tensor<?x2xf32> -> tensor<8x64x64xf32>, tensor<?x2xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$grad, 3DTensorOf<[AnyFloat]>:$outputs,
                       2DTensorOf<[I32]>:$slots, MoE_Activations:$weights);
  let results = (outs 3DTensorOf<[AnyFloat]>:$outputs_grad, MoE_Activations:$weights_grad);
  let assemblyFormat = [{
    $grad `,` $outputs `,` $slots `,` $weights attr-dict `:` type($grad) `,` type($outputs) `,`
    type($slots) `,` type($weights) `->` type($outputs_grad) `,` type($weights_grad)
  }];
  let hasVerifier = 1;
}

def MoE_ExpertFFNGradOp : MoE_Op<"expert_ffn_grad", [Pure, AllTypesMatch<["grad", "buffer", "buffer_grad"]>]> {
  let summary = "the gradients of moe.expert_ffn: its blocks and the local expert stacks";
  let description = [{
    `buffer` [E, C, H] read as [n, El, C, H] as moe.expert_ffn reads it (the
    blocks its forward ran on) and `grad` its outputs' gradient in the same
    layout: per local expert l, over the rows `r < counts[q El + l]` of
    every source q in order, moe.mlp_grad of slice l (its gate and up
    products recomputed from the block) gives `buffer_grad`'s rows and the
    slice's weight gradients, summed over all of the expert's rows (f32).
    An expert no row reached has weight gradients of exactly 0; rows past
    the counts are left undefined.

    ```mlir
    %dbuf, %d1, %d3, %d2 = moe.expert_ffn_grad silu %dout, %rbuf, %rcounts, %w1, %w3, %w2 : tensor<8x64x64xf32>, tensor<8x64x64xf32>, tensor<8xi32>, tensor<4x48x64xf32>, tensor<4x48x64xf32>, tensor<4x64x48xf32> -> tensor<8x64x64xf32>, tensor<4x48x64xf32>, tensor<4x48x64xf32>, tensor<4x64x48xf32>
    ```
  }];
  let arguments = (ins 3DTensorOf<[AnyFloat]>:$grad, 3DTensorOf<[AnyFloat]>:$buffer,
                       1DTensorOf<[I32]>:$counts, MoE_ExpertStack:$gate_weights,
                       MoE_ExpertStack:$up_weights, MoE_ExpertStack:$down_weights,
                       MoE_Activation:$activation);
  let results = (outs 3DTensorOf<[AnyFloat]>:$buffer_grad, 3DTensorOf<[F32]>:$gate_weights_grad,
                      3DTensorOf<[F32]>:$up_weights_grad, 3DTensorOf<[F32]>:$down_weights_grad);
  let assemblyFormat = [{
    $activation $grad `,` $buffer `,` $counts `,` $gate_weights `,` $up_weights `,`
    $down_weights attr-dict `:` type($grad) `,` type($buffer) `,` type($counts) `,`
    type($gate_weights) `,` type($up_weights) `,` type($down_weights) `->`
    type($buffer_grad) `,` type($gate_weights_grad) `,` type($up_weights_grad) `,`
    type($down_weights_grad)
  }];
  let hasVerifier = 1;
}

def MoE_DispatchGradOp : MoE_NamedResultOp<"dispatch_grad"> {
  let summary = "the gradient of moe.dispatch's input: each token's slots summed back";
  let description = [{
    `result[t] = sum_j grad[slots[t, j]]` over the kept slots, j in order
    (f32); a token whose choices were all dropped gets 0 (its value reached
    the output only through the residual).

    ```mlir
    %dx = moe.dispatch_grad %dbuf, %slots : tensor<8x64x64xf32>, tensor<?x2xi32> -> tensor<?x64xf32>
    ```
  }];
  let arguments = (ins 3DTensorOf<[AnyFloat]>:$grad, 2DTensorOf<[I32]>:$slots);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $grad `,` $slots attr-dict `:` type($grad) `,` type($slots) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_RouterStatsGradOp : MoE_NamedResultOp<"router_stats_grad"> {
  let summary = "d(aux_coef aux + z_coef z) / d(one layer's router logits)";
  let description = [{
    `logits` are the layer's router logits [T, E] and `router_stats` every
    MoE layer's statistics (moe.lm_loss's operands, this layer's among
    them). With p = softmax(l_t), C_e the top-k counts summed over the
    layers and N = layers x T: the balancing loss's gradient through the
    probabilities (the counts are constant, as in autograd) is
    `g_e = aux_coef E C_e / N^2`, the z-loss's `2 z_coef lse_t / T p`;
    `result[t] = p (g - sum_e p_e g_e) + 2 z_coef lse_t / T p`.
    With per-sequence statistics (router_stats' `sequences` B: DeepSeek-V3's
    sequence-wise loss) the balancing part is instead, for t in sequence b
    of L tokens, s = sigmoid(l_t), S = sum(s) and this layer's f_be
    (its top-k counts recomputed from `logits`, constant):
    `g_e = aux_coef f_be / (B L)`, `s (1 - s) (g / S - sum_e g_e s_e / S^2)`.

    ```mlir
    %dl = moe.router_stats_grad %gate, %s0, %s1 aux_coef = 1.0e-03 z_coef = 0.0 : tensor<?x8xf32>, tensor<3x8xf32>, tensor<3x8xf32> -> tensor<?x8xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$logits, Variadic<2DTensorOf<[F32]>>:$router_stats,
                       F64Attr:$aux_coef, F64Attr:$z_coef);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $logits `,` $router_stats `aux_coef` `=` $aux_coef `z_coef` `=` $z_coef attr-dict `:`
    type($logits) `,` type($router_stats) `->` type($result)
  }];
}

def MoE_BiasGradOp : MoE_NamedResultOp<"bias_grad"> {
  let summary = "the gradient of a linear's bias: dy summed over the rows";
  let description = [{
    `result[o] = sum_t grad[t, o]` (in row order, f32).

    ```mlir
    %db = moe.bias_grad %dy : tensor<?x64xf32> -> tensor<64xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$grad);
  let results = (outs 1DTensorOf<[F32]>:$result);
  let assemblyFormat = "$grad attr-dict `:` type($grad) `->` type($result)";
  let hasVerifier = 1;
}

def MoE_SigmoidGateGradOp : MoE_Op<"sigmoid_gate_grad", [Pure]> {
  let summary = "the gradients of moe.sigmoid_gate with respect to its input and gate";
  let description = [{
    With s = sigmoid(gate[t, 0]): `input_grad[t] = grad[t] s`,
    `gate_grad[t, 0] = (grad[t] . input[t]) s (1 - s)`.

    ```mlir
    %dx, %dg = moe.sigmoid_gate_grad %dy, %x, %g : tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x1xf32> -> tensor<?x64xf32>, tensor<?x1xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$grad, MoE_Activations:$input, MoE_Activations:$gate);
  let results = (outs MoE_Activations:$input_grad, MoE_Activations:$gate_grad);
  let assemblyFormat = [{
    $grad `,` $input `,` $gate attr-dict `:` type($grad) `,` type($input) `,` type($gate) `->`
    type($input_grad) `,` type($gate_grad)
  }];
}

def MoE_MLAttentionGradOp : MoE_Op<"mla_attention_grad", [Pure]> {
  let summary = "the gradients of moe.mla_attention with respect to query, kv and key_rope";
  let description = [{
    moe.mla_attention is moe.attention (as many kv heads as heads) on the
    rotated query and the keys `[kv_h[:n], rope(key_rope)]`, values
    `kv_h[n:]`: its gradient is moe.attention_grad's on those, then
    `query_grad` takes the transposed rotation on each head's rotary part,
    `kv_grad` the keys' first n and the values' gradients, and
    `key_rope_grad` the sum over the heads of the keys' rotary gradients,
    rotated back.

    ```mlir
    %dq, %dkv, %dkr = moe.mla_attention_grad %do, %q, %kv, %kr, %positions heads = 4 scale = 0.2 <kind = default, theta = 1.000000e+04, rotary_dim = 8, interleaved = true> : ...
    ```
  }];
  let arguments = (ins MoE_Activations:$grad, MoE_Activations:$query, MoE_Activations:$kv,
                       MoE_Activations:$key_rope, MoE_TokenIds:$positions, I64Attr:$num_heads,
                       F64Attr:$scale, MoE_RopeAttr:$rope);
  let results = (outs MoE_Activations:$query_grad, MoE_Activations:$kv_grad,
                      MoE_Activations:$key_rope_grad);
  let assemblyFormat = [{
    $grad `,` $query `,` $kv `,` $key_rope `,` $positions `heads` `=` $num_heads `scale` `=`
    $scale $rope attr-dict `:` type($grad) `,` type($query) `,` type($kv) `,` type($key_rope)
    `,` type($positions) `->` type($query_grad) `,` type($kv_grad) `,` type($key_rope_grad)
  }];
}

#endif // MOE_DIALECT_MOE_IR_MOEGRADIENTOPS_TD
