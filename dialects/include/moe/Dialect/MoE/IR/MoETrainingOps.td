//===- MoETrainingOps.td - the loss of a training program --*- tablegen -*-===//
//
// `moe-append-loss` (moec compile --train) ends the model with these ops:
// the causal-LM cross-entropy of the logits against the next tokens, each
// MoE layer's router statistics and the loss that combines them as
// transformers' `*ForCausalLM.forward` does with `output_router_logits`
// (docs/training.md). Their results are small static tensors, so that the
// sums of several micro-batches, pipeline stages or data-parallel replicas
// are the same ops' results added up.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_DIALECT_MOE_IR_MOETRAININGOPS_TD
#define MOE_DIALECT_MOE_IR_MOETRAININGOPS_TD

def MoE_CrossEntropyOp : MoE_NamedResultOp<"cross_entropy", [DeclareOpInterfaceMethods<MoE_AdjointOpInterface>]> {
  let summary = "the cross-entropy of logits against label ids: its sum and the rows counted";
  let description = [{
    `result = [sum_t (logsumexp(logits[t, :vocab]) - logits[t, labels[t]]), n]`
    over the rows t whose label is not -100 (PyTorch's `ignore_index`), n
    their number, in f32 (the logits read as f32, as transformers upcasts
    them; accumulated in f64). Columns from `vocab` on
    (the padding of a vocabulary split over ranks) take no part. A label
    outside [0, vocab) other than -100 is an error of the kernel.
    transformers' mean is `result[0] / result[1]`.

    ```mlir
    %ce = moe.cross_entropy %logits, %labels vocab = 251 : tensor<?x251xf32>, tensor<?xi32> -> tensor<2xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$logits, 1DTensorOf<[I32]>:$labels, I64Attr:$vocab);
  let results = (outs 1DTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $logits `,` $labels `vocab` `=` $vocab attr-dict `:` type($logits) `,` type($labels) `->`
    type($result)
  }];
  let hasVerifier = 1;
}

def MoE_VocabStatsOp : MoE_NamedResultOp<"vocab_stats"> {
  let summary = "a rank's share of the cross-entropy of vocabulary-split logits";
  let description = [{
    Megatron's vocabulary-parallel cross-entropy, a rank's part: `logits`
    [T, w] are columns [p w, (p + 1) w) of the padded vocabulary (p: the
    rank's tensor-parallel coordinate, `moe.vocab_shard`), of which those
    below `vocab` count. Per row t: `result[t] = [m, s_hi, s_lo, target]`
    with m the part's largest logit (-inf without a column), s = sum_c
    exp(logits[t, c] - m) in f64 kept as two f32 (s_hi + s_lo), and target
    the label's logit if the part holds it, else 0. The group's results
    side by side (an all_gather, [T, 4 n]) give every rank the whole
    cross-entropy (moe.cross_entropy_of_stats) and the softmax's
    normaliser (moe.cross_entropy_grad's `stats`) without gathering the
    logits.

    ```mlir
    %s = moe.vocab_stats %logits, %labels vocab = 251 {moe.vocab_shard} : tensor<?x128xf32>, tensor<?xi32> -> tensor<?x4xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$logits, 1DTensorOf<[I32]>:$labels, I64Attr:$vocab);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $logits `,` $labels `vocab` `=` $vocab attr-dict `:` type($logits) `,` type($labels) `->`
    type($result)
  }];
  let hasVerifier = 1;
}

def MoE_CrossEntropyOfStatsOp : MoE_NamedResultOp<"cross_entropy_of_stats"> {
  let summary = "moe.cross_entropy from the vocabulary parts' statistics";
  let description = [{
    `stats` [T, 4 n]: the moe.vocab_stats of the n parts, in part order.
    Per row with a label (not -100): M = max_q m_q, S = sum_q s_q exp(m_q -
    M), `logsumexp = M + log S`, the target logit the parts' targets'
    sum (one holds it); the result is moe.cross_entropy's [sum_t
    (logsumexp - target), rows counted] (f64 sums, in row order).

    ```mlir
    %ce = moe.cross_entropy_of_stats %stats, %labels vocab = 251 : tensor<?x8xf32>, tensor<?xi32> -> tensor<2xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$stats, 1DTensorOf<[I32]>:$labels, I64Attr:$vocab);
  let results = (outs 1DTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $stats `,` $labels `vocab` `=` $vocab attr-dict `:` type($stats) `,` type($labels) `->`
    type($result)
  }];
  let hasVerifier = 1;
}

def MoE_RouterStatsOp : MoE_NamedResultOp<"router_stats", [DeclareOpInterfaceMethods<MoE_AdjointOpInterface>]> {
  let summary = "a MoE layer's router statistics for the balancing and z losses";
  let description = [{
    From the router logits l [T, E] (read as f32), with p_t = softmax(l_t) and S_t
    the `top_k` largest entries of p_t (PyTorch's `topk`: ties to the lower
    index): row 0 is `sum_t p_t[e]`, row 1 the number of tokens t with e in
    S_t, row 2 holds `sum_t logsumexp(l_t)^2` in column 0 and T in column 1
    (zeros after). transformers' `load_balancing_loss_func` and the
    ST-MoE router z-loss are functions of these sums (moe.lm_loss).

    With `sequences` = B (DeepSeek-V3's sequence-wise balancing loss): the
    T rows are B sequences of T / B consecutive tokens; row 2 also holds
    `top_k` in column 2, and 2B rows follow: row 3 + b is `sum_{t in b}
    s'_t[e]` with s = sigmoid(l_t) and s' = s / sum(s), row 3 + B + b the
    number of tokens t of b with e among the `top_k` largest s_t (the
    affinities without correction bias or group limit, as the V3 paper and
    Megatron's seq_aux_loss count them).

    ```mlir
    %stats = moe.router_stats %gate top_k = 2 : tensor<?x8xf32> -> tensor<3x8xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$logits, I64Attr:$top_k,
                       OptionalAttr<I64Attr>:$sequences);
  let results = (outs 2DTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $logits `top_k` `=` $top_k attr-dict `:` type($logits) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_LMLossOp : MoE_NamedResultOp<"lm_loss", [DeclareOpInterfaceMethods<MoE_AdjointOpInterface>]> {
  let summary = "the training loss: cross-entropy, balancing loss and router z-loss";
  let description = [{
    `result = [loss, ce, aux, z]` with `ce = ce_sum / n` (moe.cross_entropy;
    0 when n = 0), and over the L router statistics (moe.router_stats, one
    per MoE layer, E experts, T tokens each): with P_e and C_e row 0 and
    row 1 summed over the layers and N = L * T,
    `aux = E * sum_e (C_e / N) * (P_e / N)` (transformers'
    `load_balancing_loss_func` over the layers' concatenated logits, no
    attention mask), `z = sum_layers (sum_t lse_t^2) / T`, and
    `loss = ce + aux_coef * aux + z_coef * z`. aux is 0 when aux_coef is
    (no balancing loss, or turned off), aux and z are 0 with no statistics
    (a dense model). With per-sequence statistics (router_stats'
    `sequences` B; DeepSeek-V3), aux is the sequence-wise balancing loss of
    the V3 paper (Megatron's seq_aux_loss) summed over the layers: per layer
    `(1 / B) sum_b sum_e f_be P_be` with f_be = C_be E / (L k), P_be =
    S'_be / L, L = T / B.

    ```mlir
    %loss = moe.lm_loss %ce, %s0, %s1 aux_coef = 1.0e-03 z_coef = 0.0 : tensor<2xf32>, tensor<3x8xf32>, tensor<3x8xf32> -> tensor<4xf32>
    ```
  }];
  let arguments = (ins 1DTensorOf<[F32]>:$cross_entropy,
                       Variadic<2DTensorOf<[F32]>>:$router_stats, F64Attr:$aux_coef,
                       F64Attr:$z_coef);
  let results = (outs 1DTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $cross_entropy (`,` $router_stats^)? `aux_coef` `=` $aux_coef `z_coef` `=` $z_coef attr-dict
    `:` type($cross_entropy) (`,` type($router_stats)^)? `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_ExpertsSavedOp : MoE_Op<"experts_saved", [Pure, AllTypesMatch<["input", "result"]>,
    DeclareOpInterfaceMethods<MoE_AdjointOpInterface>]> {
  let summary = "moe.experts that also returns what its gradient reads";
  let description = [{
    `result` is moe.experts'. Per token t and slot j, with e = experts[t, j],
    the slot's block of each saved row holds expert e's intermediates:
    `saved_gate[t, j*I:(j+1)*I] = input[t] gate_e^T`, `saved_up` the same
    with up_e, `saved_output[t, j*H:(j+1)*H] = mlp_e(input[t])` (before the
    routing weight). `moe-differentiate` puts it in place of moe.experts
    (unless told to recompute the experts: moec compile --recompute
    experts), so that moe.experts_grad reads them instead of recomputing
    three of its nine products per expert. With `capacity_factor` cf > 0 an
    expert takes only its first min(T, ceil(cf T k / E)) assignments in
    (t, j) order, moe.dispatch's position drop policy
    (docs/partitioned-execution.md): a dropped assignment contributes
    nothing and its saved blocks are 0.

    ```mlir
    %y, %g, %u, %o = moe.experts_saved silu %x, %weights, %experts, %w1, %w3, %w2 : tensor<?x64xf32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x48x64xf32>, tensor<8x48x64xf32>, tensor<8x64x48xf32> -> tensor<?x64xf32>, tensor<?x96xf32>, tensor<?x96xf32>, tensor<?x128xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$input, MoE_Activations:$weights,
                       2DTensorOf<[I32]>:$experts, MoE_ExpertStack:$gate_weights,
                       MoE_ExpertStack:$up_weights, MoE_ExpertStack:$down_weights,
                       MoE_Activation:$activation, OptionalAttr<F64Attr>:$capacity_factor);
  let results = (outs MoE_Activations:$result, MoE_Activations:$saved_gate,
                      MoE_Activations:$saved_up, MoE_Activations:$saved_output);
  let assemblyFormat = [{
    $activation $input `,` $weights `,` $experts `,` $gate_weights `,` $up_weights `,`
    $down_weights attr-dict `:` type($input) `,` type($weights) `,` type($experts) `,`
    type($gate_weights) `,` type($up_weights) `,` type($down_weights) `->` type($result) `,`
    type($saved_gate) `,` type($saved_up) `,` type($saved_output)
  }];
  let hasVerifier = 1;
}

#endif // MOE_DIALECT_MOE_IR_MOETRAININGOPS_TD
