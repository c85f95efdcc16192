// RUN: moe-opt %s | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | moe-opt | FileCheck %s

// Round trip of every moe op and attribute. Inside an op, `#moe.rope<...>` and
// `#moe.routing<...>` are written (and printed) without the `#moe.rope` /
// `#moe.routing` prefix; standalone they keep it.

//===----------------------------------------------------------------------===//
// Weights
//===----------------------------------------------------------------------===//

// The result is named after the checkpoint tensor (without `model.`,
// `.weight` and `.{e}`).
// CHECK-LABEL: func.func @weights
// CHECK:         %layers.0.self_attn.q_proj = moe.weight "model.layers.0.self_attn.q_proj.weight" : tensor<64x64xbf16>
// CHECK:         %layers.0.block_sparse_moe.experts.w1 = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w1.weight" : tensor<4x128x64xbf16>
// CHECK:         %[[NORM:.+]] = moe.weight "model.norm.weight" : tensor<64xf32>
// CHECK:         return
func.func @weights() -> (tensor<64x64xbf16>, tensor<4x128x64xbf16>, tensor<64xf32>) {
  %0 = moe.weight "model.layers.0.self_attn.q_proj.weight" : tensor<64x64xbf16>
  %1 = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w1.weight" : tensor<4x128x64xbf16>
  %2 = moe.weight "model.norm.weight" : tensor<64xf32>
  return %0, %1, %2 : tensor<64x64xbf16>, tensor<4x128x64xbf16>, tensor<64xf32>
}

// Roles and layers (absent: replicated, outside the layers; etp_dim absent: 0).
// CHECK-LABEL: func.func @roles
// CHECK:         moe.weight "model.embed_tokens.weight" as embedding : tensor<100x64xbf16>
// CHECK:         moe.weight "model.layers.3.self_attn.q_proj.weight" as column layer 3 : tensor<64x64xbf16>
// CHECK:         moe.weight "model.layers.3.self_attn.o_proj.weight" as row layer 3 : tensor<64x64xbf16>
// CHECK:         moe.weight "model.layers.3.input_layernorm.weight" as replicated layer 3 : tensor<64xbf16>
// CHECK:         moe.weight "model.norm.weight" : tensor<64xbf16>
// CHECK:         moe.weight "lm_head.weight" as lm_head : tensor<100x64xbf16>
// CHECK:         moe.expert_weight "model.layers.3.mlp.experts.{e}.down_proj.weight" etp_dim 1 layer 3 : tensor<4x64x128xbf16>
func.func @roles() {
  %0 = moe.weight "model.embed_tokens.weight" as embedding : tensor<100x64xbf16>
  %1 = moe.weight "model.layers.3.self_attn.q_proj.weight" as column layer 3 : tensor<64x64xbf16>
  %2 = moe.weight "model.layers.3.self_attn.o_proj.weight" as row layer 3 : tensor<64x64xbf16>
  %3 = moe.weight "model.layers.3.input_layernorm.weight" as replicated layer 3 : tensor<64xbf16>
  %4 = moe.weight "model.norm.weight" : tensor<64xbf16>
  %5 = moe.weight "lm_head.weight" as lm_head : tensor<100x64xbf16>
  %6 = moe.expert_weight "model.layers.3.mlp.experts.{e}.down_proj.weight" etp_dim 1 layer 3 : tensor<4x64x128xbf16>
  return
}

//===----------------------------------------------------------------------===//
// Embedding, norms, linear maps
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @embedding
// CHECK-SAME:    (%[[TABLE:[^:]+]]: tensor<100x64xbf16>, %[[TOK:[^:]+]]: tensor<?xi32>, %[[TOK16:[^:]+]]: tensor<5xi64>)
// CHECK:         %[[E0:.+]] = moe.embedding %[[TABLE]][%[[TOK]]] : tensor<100x64xbf16>, tensor<?xi32> -> tensor<?x64xbf16>
// CHECK:         %[[E1:.+]] = moe.embedding %[[TABLE]][%[[TOK16]]] : tensor<100x64xbf16>, tensor<5xi64> -> tensor<5x64xbf16>
func.func @embedding(%table: tensor<100x64xbf16>, %tokens: tensor<?xi32>, %tokens5: tensor<5xi64>) -> (tensor<?x64xbf16>, tensor<5x64xbf16>) {
  %0 = moe.embedding %table[%tokens] : tensor<100x64xbf16>, tensor<?xi32> -> tensor<?x64xbf16>
  %1 = moe.embedding %table[%tokens5] : tensor<100x64xbf16>, tensor<5xi64> -> tensor<5x64xbf16>
  return %0, %1 : tensor<?x64xbf16>, tensor<5x64xbf16>
}

// The second norm is Qwen3's per-head q/k norm: 4 heads of 32 share one
// 32-wide weight.
// CHECK-LABEL: func.func @rms_norm
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<?x64xbf16>, %[[W:[^:]+]]: tensor<64xbf16>, %[[Q:[^:]+]]: tensor<?x128xbf16>, %[[HW:[^:]+]]: tensor<32xbf16>)
// CHECK:         %[[N0:.+]] = moe.rms_norm %[[X]], %[[W]] eps = 1.000000e-05 : tensor<?x64xbf16>, tensor<64xbf16>
// CHECK:         %[[N1:.+]] = moe.rms_norm %[[Q]], %[[HW]] eps = 9.9999999999999995E-7 : tensor<?x128xbf16>, tensor<32xbf16>
// CHECK:         return %[[N0]], %[[N1]]
func.func @rms_norm(%x: tensor<?x64xbf16>, %w: tensor<64xbf16>, %q: tensor<?x128xbf16>, %hw: tensor<32xbf16>) -> (tensor<?x64xbf16>, tensor<?x128xbf16>) {
  %0 = moe.rms_norm %x, %w eps = 1.0e-05 : tensor<?x64xbf16>, tensor<64xbf16>
  %1 = moe.rms_norm %q, %hw eps = 1.0e-06 : tensor<?x128xbf16>, tensor<32xbf16>
  return %0, %1 : tensor<?x64xbf16>, tensor<?x128xbf16>
}

// A rank's part of rows tensor parallelism splits (OLMoE's whole-row q
// norm): its sum of squares, and the norm of its part by the whole row's.
// CHECK-LABEL: func.func @rms_norm_of_part
// CHECK:         %[[S:.+]] = moe.row_sum_squares %{{.+}} : tensor<?x32xf32> -> tensor<?x1xf32>
// CHECK:         moe.rms_norm %{{.+}}, %{{.+}} sum_squares(%[[S]] : tensor<?x1xf32>) eps = 1.000000e-05 {row_width = 64 : i64} : tensor<?x32xf32>, tensor<32xf32>
func.func @rms_norm_of_part(%x: tensor<?x32xf32>, %w: tensor<32xf32>) -> tensor<?x32xf32> {
  %s = moe.row_sum_squares %x : tensor<?x32xf32> -> tensor<?x1xf32>
  %0 = moe.rms_norm %x, %w sum_squares(%s : tensor<?x1xf32>) eps = 1.0e-05 {row_width = 64 : i64} : tensor<?x32xf32>, tensor<32xf32>
  return %0 : tensor<?x32xf32>
}

// CHECK-LABEL: func.func @layer_norm
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<?x64xf32>, %[[W:[^:]+]]: tensor<64xf32>, %[[B:[^:]+]]: tensor<64xf32>)
// CHECK:         %[[N0:.+]] = moe.layer_norm %[[X]], %[[W]], %[[B]] eps = 1.000000e-05 : tensor<?x64xf32>, tensor<64xf32>, tensor<64xf32>
// CHECK:         %[[N1:.+]] = moe.layer_norm %[[N0]], %[[W]] eps = 9.9999999999999995E-7 : tensor<?x64xf32>, tensor<64xf32>
// CHECK:         return %[[N1]]
func.func @layer_norm(%x: tensor<?x64xf32>, %w: tensor<64xf32>, %b: tensor<64xf32>) -> tensor<?x64xf32> {
  %0 = moe.layer_norm %x, %w, %b eps = 1.0e-05 : tensor<?x64xf32>, tensor<64xf32>, tensor<64xf32>
  %1 = moe.layer_norm %0, %w eps = 1.000000e-06 : tensor<?x64xf32>, tensor<64xf32>
  return %1 : tensor<?x64xf32>
}

// moe.add_norm: the sum and the norm of it, rms (grouped too) or layer with a bias.
// CHECK-LABEL: func.func @add_norm
// CHECK-SAME:    (%[[A:[^:]+]]: tensor<?x64xf32>, %[[B:[^:]+]]: tensor<?x64xf32>, %[[W:[^:]+]]: tensor<64xf32>, %[[G:[^:]+]]: tensor<16xf32>)
// CHECK:         %h, %norm = moe.add_norm %[[A]], %[[B]], %[[W]] eps = 1.000000e-05 : tensor<?x64xf32>, tensor<64xf32>
// CHECK:         %h_0, %norm_1 = moe.add_norm %h, %norm, %[[G]] eps = 1.000000e-05 : tensor<?x64xf32>, tensor<16xf32>
// CHECK:         %h_2, %norm_3 = moe.add_norm %h_0, %norm_1, layer %[[W]], %[[W]] eps = 9.9999999999999995E-7 : tensor<?x64xf32>, tensor<64xf32>, tensor<64xf32>
// CHECK:         return %h_2, %norm_3
func.func @add_norm(%a: tensor<?x64xf32>, %b: tensor<?x64xf32>, %w: tensor<64xf32>, %g: tensor<16xf32>) -> (tensor<?x64xf32>, tensor<?x64xf32>) {
  %s0, %n0 = moe.add_norm %a, %b, %w eps = 1.0e-05 : tensor<?x64xf32>, tensor<64xf32>
  %s1, %n1 = moe.add_norm %s0, %n0, %g eps = 1.0e-05 : tensor<?x64xf32>, tensor<16xf32>
  %s2, %n2 = moe.add_norm %s1, %n1, layer %w, %w eps = 1.0e-06 : tensor<?x64xf32>, tensor<64xf32>, tensor<64xf32>
  return %s2, %n2 : tensor<?x64xf32>, tensor<?x64xf32>
}

// A linear result is named after its weight's module; the LM head's is
// `logits`.
// CHECK-LABEL: func.func @linear
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<?x64xbf16>, %[[B:[^:]+]]: tensor<32xbf16>, %[[W:[^:]+]]: tensor<32x64xbf16>)
// CHECK:         %[[QW:.+]] = moe.weight "model.layers.0.self_attn.q_proj.weight" : tensor<32x64xbf16>
// CHECK:         %q_proj = moe.linear %[[X]], %[[QW]] : tensor<?x64xbf16>, tensor<32x64xbf16> -> tensor<?x32xbf16>
// CHECK:         %[[Y1:.+]] = moe.linear %[[X]], %[[W]], %[[B]] : tensor<?x64xbf16>, tensor<32x64xbf16>, tensor<32xbf16> -> tensor<?x32xbf16>
// CHECK:         %[[HEAD:.+]] = moe.weight "lm_head.weight" : tensor<100x64xbf16>
// CHECK:         %logits = moe.linear %[[X]], %[[HEAD]] : tensor<?x64xbf16>, tensor<100x64xbf16> -> tensor<?x100xf32>
func.func @linear(%x: tensor<?x64xbf16>, %b: tensor<32xbf16>, %w: tensor<32x64xbf16>) -> (tensor<?x32xbf16>, tensor<?x32xbf16>, tensor<?x100xf32>) {
  %qw = moe.weight "model.layers.0.self_attn.q_proj.weight" : tensor<32x64xbf16>
  %0 = moe.linear %x, %qw : tensor<?x64xbf16>, tensor<32x64xbf16> -> tensor<?x32xbf16>
  %1 = moe.linear %x, %w, %b : tensor<?x64xbf16>, tensor<32x64xbf16>, tensor<32xbf16> -> tensor<?x32xbf16>
  %head = moe.weight "lm_head.weight" : tensor<100x64xbf16>
  %2 = moe.linear %x, %head : tensor<?x64xbf16>, tensor<100x64xbf16> -> tensor<?x100xf32>
  return %0, %1, %2 : tensor<?x32xbf16>, tensor<?x32xbf16>, tensor<?x100xf32>
}

// CHECK-LABEL: func.func @split
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<?x96xbf16>)
// CHECK:         %[[A:.+]], %[[B:.+]] = moe.split %[[X]] : tensor<?x96xbf16> -> tensor<?x64xbf16>, tensor<?x32xbf16>
// CHECK:         %[[C:.+]] = moe.split %[[X]] : tensor<?x96xbf16> -> tensor<?x96xbf16>
// CHECK:         return %[[A]], %[[B]], %[[C]]
func.func @split(%x: tensor<?x96xbf16>) -> (tensor<?x64xbf16>, tensor<?x32xbf16>, tensor<?x96xbf16>) {
  %0:2 = moe.split %x : tensor<?x96xbf16> -> tensor<?x64xbf16>, tensor<?x32xbf16>
  %1 = moe.split %x : tensor<?x96xbf16> -> tensor<?x96xbf16>
  return %0#0, %0#1, %1 : tensor<?x64xbf16>, tensor<?x32xbf16>, tensor<?x96xbf16>
}

// CHECK-LABEL: func.func @add_and_sigmoid_gate
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<?x64xbf16>, %[[Y:[^:]+]]: tensor<?x64xbf16>, %[[G:[^:]+]]: tensor<?x1xbf16>)
// CHECK:         %[[S:.+]] = moe.add %[[X]], %[[Y]] : tensor<?x64xbf16>
// CHECK:         %[[R:.+]] = moe.sigmoid_gate %[[S]], %[[G]] : tensor<?x64xbf16>, tensor<?x1xbf16>
// CHECK:         return %[[R]]
func.func @add_and_sigmoid_gate(%x: tensor<?x64xbf16>, %y: tensor<?x64xbf16>, %g: tensor<?x1xbf16>) -> tensor<?x64xbf16> {
  %0 = moe.add %x, %y : tensor<?x64xbf16>
  %1 = moe.sigmoid_gate %0, %g : tensor<?x64xbf16>, tensor<?x1xbf16>
  return %1 : tensor<?x64xbf16>
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

// One rope per #moe.rope kind; default-valued parameters are not printed.
// CHECK-LABEL: func.func @rope
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<?x128xbf16>, %[[P:[^:]+]]: tensor<?xi32>)
// CHECK:         moe.rope %[[X]], %[[P]] head_dim = 32 <kind = default, theta = 1.000000e+04, rotary_dim = 32> : tensor<?x128xbf16>, tensor<?xi32>
// CHECK:         moe.rope %[[X]], %[[P]] head_dim = 32 <kind = default, theta = 1.000000e+06, rotary_dim = 16> : tensor<?x128xbf16>, tensor<?xi32>
// CHECK:         moe.rope %[[X]], %[[P]] head_dim = 32 <kind = linear, theta = 1.000000e+04, rotary_dim = 32, factor = 2.000000e+00> : tensor<?x128xbf16>, tensor<?xi32>
// CHECK:         moe.rope %[[X]], %[[P]] head_dim = 32 <kind = dynamic, theta = 1.000000e+04, rotary_dim = 32, factor = 4.000000e+00, original_max_position = 2048> : tensor<?x128xbf16>, tensor<?xi32>
// CHECK:         moe.rope %[[X]], %[[P]] head_dim = 32 <kind = llama3, theta = 5.000000e+05, rotary_dim = 32, factor = 8.000000e+00, original_max_position = 8192, low_freq_factor = 2.000000e+00, high_freq_factor = 8.000000e+00> : tensor<?x128xbf16>, tensor<?xi32>
// CHECK:         moe.rope %[[X]], %[[P]] head_dim = 32 <kind = yarn, theta = 1.000000e+04, rotary_dim = 32, interleaved = true, factor = 4.000000e+01, original_max_position = 4096, beta_fast = 1.600000e+01, beta_slow = 2.000000e+00, attention_factor = 7.070000e-01, truncate = false> : tensor<?x128xbf16>, tensor<?xi32>
func.func @rope(%x: tensor<?x128xbf16>, %p: tensor<?xi32>) {
  %0 = moe.rope %x, %p head_dim = 32 <kind = default, theta = 1.0e4, rotary_dim = 32> : tensor<?x128xbf16>, tensor<?xi32>
  // Partial rotary embedding; explicit defaults are dropped when printed.
  %1 = moe.rope %x, %p head_dim = 32 <kind = default, theta = 1.0e6, rotary_dim = 16, interleaved = false, factor = 1.0> : tensor<?x128xbf16>, tensor<?xi32>
  %2 = moe.rope %x, %p head_dim = 32 <kind = linear, theta = 1.0e4, rotary_dim = 32, factor = 2.0> : tensor<?x128xbf16>, tensor<?xi32>
  %3 = moe.rope %x, %p head_dim = 32 <kind = dynamic, theta = 1.0e4, rotary_dim = 32, factor = 4.0, original_max_position = 2048> : tensor<?x128xbf16>, tensor<?xi32>
  %4 = moe.rope %x, %p head_dim = 32 <kind = llama3, theta = 5.0e5, rotary_dim = 32, factor = 8.0, original_max_position = 8192, low_freq_factor = 2.0, high_freq_factor = 8.0> : tensor<?x128xbf16>, tensor<?xi32>
  %5 = moe.rope %x, %p head_dim = 32 <kind = yarn, theta = 1.0e4, rotary_dim = 32, interleaved = true, factor = 40.0, original_max_position = 4096, beta_fast = 16.0, beta_slow = 2.0, attention_factor = 0.707, truncate = false> : tensor<?x128xbf16>, tensor<?xi32>
  return
}

// 4 query heads and 2 kv heads of 32.
// CHECK-LABEL: func.func @attention
// CHECK-SAME:    (%[[Q:[^:]+]]: tensor<?x128xbf16>, %[[K:[^:]+]]: tensor<?x64xbf16>, %[[V:[^:]+]]: tensor<?x64xbf16>)
// CHECK:         %[[A0:.+]] = moe.attention %[[Q]], %[[K]], %[[V]] heads = 4 kv_heads = 2 scale = 0.17677669529663687 : tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x64xbf16> -> tensor<?x128xbf16>
// CHECK:         %[[A1:.+]] = moe.attention %[[Q]], %[[K]], %[[V]] heads = 4 kv_heads = 2 scale = 1.250000e-01 {sliding_window = 16 : i64} : tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x64xbf16> -> tensor<?x128xbf16>
// CHECK:         return %[[A0]], %[[A1]]
func.func @attention(%q: tensor<?x128xbf16>, %k: tensor<?x64xbf16>, %v: tensor<?x64xbf16>) -> (tensor<?x128xbf16>, tensor<?x128xbf16>) {
  %0 = moe.attention %q, %k, %v heads = 4 kv_heads = 2 scale = 0.17677669529663687 : tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x64xbf16> -> tensor<?x128xbf16>
  %1 = moe.attention %q, %k, %v heads = 4 kv_heads = 2 scale = 0.125 {sliding_window = 16 : i64} : tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x64xbf16> -> tensor<?x128xbf16>
  return %0, %1 : tensor<?x128xbf16>, tensor<?x128xbf16>
}

// 2 heads; per head: nope 16 + rope 8 query values, 16 key + 24 value kv
// values; result 2 x 24.
// CHECK-LABEL: func.func @mla_attention
// CHECK-SAME:    (%[[Q:[^:]+]]: tensor<?x48xbf16>, %[[KV:[^:]+]]: tensor<?x80xbf16>, %[[KR:[^:]+]]: tensor<?x8xbf16>, %[[P:[^:]+]]: tensor<?xi32>)
// CHECK:         %[[A:.+]] = moe.mla_attention %[[Q]], %[[KV]], %[[KR]], %[[P]] heads = 2 scale = 2.500000e-01 <kind = yarn, theta = 1.000000e+04, rotary_dim = 8, interleaved = true, factor = 4.000000e+01, original_max_position = 4096, attention_factor = 1.250000e+00> : tensor<?x48xbf16>, tensor<?x80xbf16>, tensor<?x8xbf16>, tensor<?xi32> -> tensor<?x48xbf16>
// CHECK:         return %[[A]]
func.func @mla_attention(%q: tensor<?x48xbf16>, %kv: tensor<?x80xbf16>, %k_rope: tensor<?x8xbf16>, %p: tensor<?xi32>) -> tensor<?x48xbf16> {
  %0 = moe.mla_attention %q, %kv, %k_rope, %p heads = 2 scale = 0.25 <kind = yarn, theta = 1.0e4, rotary_dim = 8, interleaved = true, factor = 40.0, original_max_position = 4096, attention_factor = 1.25> : tensor<?x48xbf16>, tensor<?x80xbf16>, tensor<?x8xbf16>, tensor<?xi32> -> tensor<?x48xbf16>
  return %0 : tensor<?x48xbf16>
}

//===----------------------------------------------------------------------===//
// Feed-forward
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @mlp
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<?x64xbf16>, %[[G:[^:]+]]: tensor<128x64xbf16>, %[[U:[^:]+]]: tensor<128x64xbf16>, %[[D:[^:]+]]: tensor<64x128xbf16>)
// CHECK:         %[[M0:.+]] = moe.mlp silu %[[X]], %[[G]], %[[U]], %[[D]] : tensor<?x64xbf16>, tensor<128x64xbf16>, tensor<128x64xbf16>, tensor<64x128xbf16>
// CHECK:         %[[M1:.+]] = moe.mlp gelu %[[M0]], %[[G]], %[[U]], %[[D]] :
// CHECK:         %[[M2:.+]] = moe.mlp gelu_tanh %[[M1]], %[[G]], %[[U]], %[[D]] :
// CHECK:         %[[M3:.+]] = moe.mlp relu %[[M2]], %[[G]], %[[U]], %[[D]] :
// CHECK:         return %[[M3]]
func.func @mlp(%x: tensor<?x64xbf16>, %g: tensor<128x64xbf16>, %u: tensor<128x64xbf16>, %d: tensor<64x128xbf16>) -> tensor<?x64xbf16> {
  %0 = moe.mlp silu %x, %g, %u, %d : tensor<?x64xbf16>, tensor<128x64xbf16>, tensor<128x64xbf16>, tensor<64x128xbf16>
  %1 = moe.mlp gelu %0, %g, %u, %d : tensor<?x64xbf16>, tensor<128x64xbf16>, tensor<128x64xbf16>, tensor<64x128xbf16>
  %2 = moe.mlp gelu_tanh %1, %g, %u, %d : tensor<?x64xbf16>, tensor<128x64xbf16>, tensor<128x64xbf16>, tensor<64x128xbf16>
  %3 = moe.mlp relu %2, %g, %u, %d : tensor<?x64xbf16>, tensor<128x64xbf16>, tensor<128x64xbf16>, tensor<64x128xbf16>
  return %3 : tensor<?x64xbf16>
}

// One router per routing variant: Mixtral (softmax, normalize, bf16),
// f32 compute type, DeepSeek-V3 (sigmoid + correction bias + top2_sum groups
// + scaling factor), DeepSeek-V2 (group_score = max), top-k on the logits.
// CHECK-LABEL: func.func @router
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<?x64xbf16>, %[[G8:[^:]+]]: tensor<8x64xbf16>, %[[G16:[^:]+]]: tensor<16x64xbf16>, %[[BIAS:[^:]+]]: tensor<16xf32>)
// CHECK:         %[[W0:.+]], %[[E0:.+]] = moe.router %[[X]], %[[G8]] <scoring = softmax, top_k = 2, normalize = true, compute_type = bf16> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xbf16>, tensor<?x2xi32>
// CHECK:         %[[W1:.+]], %[[E1:.+]] = moe.router %[[X]], %[[G8]] <scoring = softmax, top_k = 2, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
// CHECK:         %[[W2:.+]], %[[E2:.+]] = moe.router %[[X]], %[[G16]] bias %[[BIAS]] <scoring = sigmoid, top_k = 4, normalize = true, scaling_factor = 2.500000e+00, num_groups = 4, topk_groups = 2, compute_type = f32> : tensor<?x64xbf16>, tensor<16x64xbf16>, tensor<16xf32> -> tensor<?x4xf32>, tensor<?x4xi32>
// CHECK:         %[[W3:.+]], %[[E3:.+]] = moe.router %[[X]], %[[G16]] <scoring = softmax, top_k = 6, scaling_factor = 1.500000e+00, num_groups = 8, topk_groups = 3, group_score = max, compute_type = f32> : tensor<?x64xbf16>, tensor<16x64xbf16> -> tensor<?x6xf32>, tensor<?x6xi32>
// CHECK:         %[[W4:.+]], %[[E4:.+]] = moe.router %[[X]], %[[G8]] <scoring = softmax, top_k = 2, topk_on = logits, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
func.func @router(%x: tensor<?x64xbf16>, %g8: tensor<8x64xbf16>, %g16: tensor<16x64xbf16>, %bias: tensor<16xf32>) {
  %w0, %e0 = moe.router %x, %g8 <scoring = softmax, top_k = 2, normalize = true, compute_type = bf16> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xbf16>, tensor<?x2xi32>
  %w1, %e1 = moe.router %x, %g8 <scoring = softmax, top_k = 2, normalize = false, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
  %w2, %e2 = moe.router %x, %g16 bias %bias <scoring = sigmoid, top_k = 4, normalize = true, scaling_factor = 2.5, num_groups = 4, topk_groups = 2, group_score = top2_sum, compute_type = f32> : tensor<?x64xbf16>, tensor<16x64xbf16>, tensor<16xf32> -> tensor<?x4xf32>, tensor<?x4xi32>
  %w3, %e3 = moe.router %x, %g16 <scoring = softmax, top_k = 6, scaling_factor = 1.5, num_groups = 8, topk_groups = 3, group_score = max, compute_type = f32> : tensor<?x64xbf16>, tensor<16x64xbf16> -> tensor<?x6xf32>, tensor<?x6xi32>
  %w4, %e4 = moe.router %x, %g8 <scoring = softmax, top_k = 2, topk_on = logits, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// moe.route: the routing of logits a moe.linear computed (the importer's
// form; moe-fuse-router makes moe.router of the pair), with and without
// the correction bias.
// CHECK-LABEL: func.func @route
// CHECK-SAME:    (%[[L8:[^:]+]]: tensor<?x8xf32>, %[[L16:[^:]+]]: tensor<?x16xbf16>, %[[BIAS:[^:]+]]: tensor<16xf32>)
// CHECK:         %[[W0:.+]], %[[E0:.+]] = moe.route %[[L8]] <scoring = softmax, top_k = 2, normalize = true, compute_type = f32> : tensor<?x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
// CHECK:         %[[W1:.+]], %[[E1:.+]] = moe.route %[[L16]] bias %[[BIAS]] <scoring = sigmoid, top_k = 4, normalize = true, scaling_factor = 2.500000e+00, num_groups = 4, topk_groups = 2, compute_type = bf16> : tensor<?x16xbf16>, tensor<16xf32> -> tensor<?x4xbf16>, tensor<?x4xi32>
func.func @route(%l8: tensor<?x8xf32>, %l16: tensor<?x16xbf16>, %bias: tensor<16xf32>) {
  %w0, %e0 = moe.route %l8 <scoring = softmax, top_k = 2, normalize = true, compute_type = f32> : tensor<?x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  %w1, %e1 = moe.route %l16 bias %bias <scoring = sigmoid, top_k = 4, normalize = true, scaling_factor = 2.5, num_groups = 4, topk_groups = 2, compute_type = bf16> : tensor<?x16xbf16>, tensor<16xf32> -> tensor<?x4xbf16>, tensor<?x4xi32>
  return
}

// moe.concat: the inverse of moe.split (and the op its gradient needs).
// CHECK-LABEL: func.func @concat
// CHECK:         %[[A:.+]], %[[B:.+]] = moe.split %arg0 : tensor<?x576xbf16> -> tensor<?x512xbf16>, tensor<?x64xbf16>
// CHECK:         %[[J:.+]] = moe.concat %[[A]], %[[B]] : tensor<?x512xbf16>, tensor<?x64xbf16> -> tensor<?x576xbf16>
// CHECK:         %[[K:.+]] = moe.concat %[[B]], %[[A]], %[[B]] : tensor<?x64xbf16>, tensor<?x512xbf16>, tensor<?x64xbf16> -> tensor<?x640xbf16>
// CHECK:         return %[[J]], %[[K]]
func.func @concat(%x: tensor<?x576xbf16>) -> (tensor<?x576xbf16>, tensor<?x640xbf16>) {
  %a, %b = moe.split %x : tensor<?x576xbf16> -> tensor<?x512xbf16>, tensor<?x64xbf16>
  %j = moe.concat %a, %b : tensor<?x512xbf16>, tensor<?x64xbf16> -> tensor<?x576xbf16>
  %k = moe.concat %b, %a, %b : tensor<?x64xbf16>, tensor<?x512xbf16>, tensor<?x64xbf16> -> tensor<?x640xbf16>
  return %j, %k : tensor<?x576xbf16>, tensor<?x640xbf16>
}

// CHECK-LABEL: func.func @experts
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<?x64xbf16>, %[[G:[^:]+]]: tensor<8x64xbf16>)
// CHECK:         %[[W:.+]], %[[E:.+]] = moe.router %[[X]], %[[G]]
// CHECK:         %[[W1:.+]] = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w1.weight" : tensor<8x128x64xbf16>
// CHECK:         %[[W3:.+]] = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w3.weight" : tensor<8x128x64xbf16>
// CHECK:         %[[W2:.+]] = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w2.weight" : tensor<8x64x128xbf16>
// CHECK:         %[[Y:.+]] = moe.experts silu %[[X]], %[[W]], %[[E]], %[[W1]], %[[W3]], %[[W2]] : tensor<?x64xbf16>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x128x64xbf16>, tensor<8x128x64xbf16>, tensor<8x64x128xbf16>
// CHECK:         %[[Z:.+]] = moe.experts gelu %[[X]], %[[W]], %[[E]], %[[W1]], %[[W3]], %[[W2]] :
// CHECK:         return %[[Y]], %[[Z]]
func.func @experts(%x: tensor<?x64xbf16>, %gate: tensor<8x64xbf16>) -> (tensor<?x64xbf16>, tensor<?x64xbf16>) {
  %w, %e = moe.router %x, %gate <scoring = softmax, top_k = 2, normalize = true, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
  %w1 = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w1.weight" : tensor<8x128x64xbf16>
  %w3 = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w3.weight" : tensor<8x128x64xbf16>
  %w2 = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w2.weight" : tensor<8x64x128xbf16>
  %0 = moe.experts silu %x, %w, %e, %w1, %w3, %w2 : tensor<?x64xbf16>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x128x64xbf16>, tensor<8x128x64xbf16>, tensor<8x64x128xbf16>
  %1 = moe.experts gelu %x, %w, %e, %w1, %w3, %w2 : tensor<?x64xbf16>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x128x64xbf16>, tensor<8x128x64xbf16>, tensor<8x64x128xbf16>
  return %0, %1 : tensor<?x64xbf16>, tensor<?x64xbf16>
}

//===----------------------------------------------------------------------===//
// Standalone attributes
//===----------------------------------------------------------------------===//

// Every parameter of #moe.rope and #moe.routing set to a non-default value,
// and the enum attributes (in the `#moe<mnemonic value>` form).
// CHECK-LABEL: func.func @attributes
// CHECK-SAME:    test.enums = [#moe<scoring sigmoid>, #moe<topk_on logits>, #moe<group_score max>, #moe<rope_kind default>, #moe<rope_kind yarn>]
// CHECK-SAME:    test.rope = #moe.rope<kind = yarn, theta = 1.000000e+04, rotary_dim = 64, interleaved = true, factor = 4.000000e+01, original_max_position = 4096, low_freq_factor = 2.000000e+00, high_freq_factor = 3.000000e+00, beta_fast = 1.600000e+01, beta_slow = 5.000000e-01, attention_factor = 7.070000e-01, truncate = false>
// CHECK-SAME:    test.routing = #moe.routing<scoring = softmax, top_k = 6, topk_on = logits, normalize = true, scaling_factor = 1.600000e+01, num_groups = 8, topk_groups = 3, group_score = max, compute_type = f64>
func.func @attributes() attributes {
    test.enums = [#moe<scoring sigmoid>, #moe<topk_on logits>, #moe<group_score max>, #moe<rope_kind default>, #moe<rope_kind yarn>],
    test.rope = #moe.rope<kind = yarn, theta = 10000.0, rotary_dim = 64, interleaved = true, factor = 40.0, original_max_position = 4096, low_freq_factor = 2.0, high_freq_factor = 3.0, beta_fast = 16.0, beta_slow = 0.5, attention_factor = 0.707, truncate = false>,
    test.routing = #moe.routing<scoring = softmax, top_k = 6, topk_on = logits, normalize = true, scaling_factor = 16.0, num_groups = 8, topk_groups = 3, group_score = max, compute_type = f64>} {
  return
}

//===----------------------------------------------------------------------===//
// Partitioned programs: dispatch and collectives
//===----------------------------------------------------------------------===//

// CHECK-LABEL: func.func @partitioned
// CHECK: %[[R:.*]] = moe.all_reduce %arg0 over @mesh[2] : tensor<?x64xf32>
// CHECK: moe.all_gather %[[R]] over @mesh[2] : tensor<?x64xf32> -> tensor<?x128xf32>
// CHECK: %dispatched, %counts, %slots = moe.dispatch %[[R]], %arg1 capacity = 16 factor = 1.250000e+00 parts = 2 stride = 1 : tensor<?x64xf32>, tensor<?x2xi32> -> tensor<8x16x64xf32>, tensor<8xi32>, tensor<?x2xi32>
// CHECK: %[[B:.*]], %[[C:.*]] = moe.all_to_all %dispatched, %counts over @experts[2] : tensor<8x16x64xf32>, tensor<8xi32>
// CHECK: %expert_out = moe.expert_ffn silu %[[B]], %[[C]], %arg3, %arg3, %arg4 : tensor<8x16x64xf32>, tensor<8xi32>, tensor<4x32x64xf32>, tensor<4x32x64xf32>, tensor<4x64x32xf32>
// CHECK: %moe = moe.combine %expert_out, %slots, %arg2 : tensor<8x16x64xf32>, tensor<?x2xi32>, tensor<?x2xf32> -> tensor<?x64xf32>
// CHECK: moe.send %moe to 1 : tensor<?x64xf32>
// CHECK: moe.recv from 0 : tensor<?x64xf32>
func.func @partitioned(%x: tensor<?x64xf32>, %experts: tensor<?x2xi32>, %weights: tensor<?x2xf32>,
                       %w1: tensor<4x32x64xf32>, %w2: tensor<4x64x32xf32>) -> tensor<?x64xf32> {
  %r = moe.all_reduce %x over @mesh[2] : tensor<?x64xf32>
  %g = moe.all_gather %r over @mesh[2] : tensor<?x64xf32> -> tensor<?x128xf32>
  %b, %c, %s = moe.dispatch %r, %experts capacity = 16 factor = 1.25 parts = 2 stride = 1 : tensor<?x64xf32>, tensor<?x2xi32> -> tensor<8x16x64xf32>, tensor<8xi32>, tensor<?x2xi32>
  %rb, %rc = moe.all_to_all %b, %c over @experts[2] : tensor<8x16x64xf32>, tensor<8xi32>
  %y = moe.expert_ffn silu %rb, %rc, %w1, %w1, %w2 : tensor<8x16x64xf32>, tensor<8xi32>, tensor<4x32x64xf32>, tensor<4x32x64xf32>, tensor<4x64x32xf32>
  %o = moe.combine %y, %s, %weights : tensor<8x16x64xf32>, tensor<?x2xi32>, tensor<?x2xf32> -> tensor<?x64xf32>
  moe.send %o to 1 : tensor<?x64xf32>
  %in = moe.recv from 0 : tensor<?x64xf32>
  return %in : tensor<?x64xf32>
}

// The training loss (moe-append-loss).
// CHECK-LABEL: func.func @loss
// CHECK:         %[[CE:.+]] = moe.cross_entropy %{{.+}}, %{{.+}} vocab = 251 : tensor<?x256xbf16>, tensor<?xi32> -> tensor<2xf32>
// CHECK:         %[[S:.+]] = moe.router_stats %{{.+}} top_k = 2 : tensor<?x8xf32> -> tensor<3x8xf32>
// CHECK:         moe.lm_loss %[[CE]], %[[S]], %[[S]] aux_coef = 1.000000e-03 z_coef = 0.000000e+00 : tensor<2xf32>, tensor<3x8xf32>, tensor<3x8xf32> -> tensor<4xf32>
// CHECK:         moe.lm_loss %[[CE]] aux_coef = 0.000000e+00 z_coef = 0.000000e+00 : tensor<2xf32> -> tensor<4xf32>
// CHECK:         %[[Q:.+]] = moe.router_stats %{{.+}} top_k = 2 {sequences = 2 : i64} : tensor<?x8xf32> -> tensor<7x8xf32>
// CHECK:         moe.lm_loss %[[CE]], %[[Q]] aux_coef = 1.000000e-02 z_coef = 0.000000e+00 : tensor<2xf32>, tensor<7x8xf32> -> tensor<4xf32>
func.func @loss(%logits: tensor<?x256xbf16>, %labels: tensor<?xi32>, %gate: tensor<?x8xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %ce = moe.cross_entropy %logits, %labels vocab = 251 : tensor<?x256xbf16>, tensor<?xi32> -> tensor<2xf32>
  %s = moe.router_stats %gate top_k = 2 : tensor<?x8xf32> -> tensor<3x8xf32>
  %l = moe.lm_loss %ce, %s, %s aux_coef = 1.0e-03 z_coef = 0.0 : tensor<2xf32>, tensor<3x8xf32>, tensor<3x8xf32> -> tensor<4xf32>
  %d = moe.lm_loss %ce aux_coef = 0.0 z_coef = 0.0 : tensor<2xf32> -> tensor<4xf32>
  %q = moe.router_stats %gate top_k = 2 {sequences = 2 : i64} : tensor<?x8xf32> -> tensor<7x8xf32>
  %sq = moe.lm_loss %ce, %q aux_coef = 1.0e-02 z_coef = 0.0 : tensor<2xf32>, tensor<7x8xf32> -> tensor<4xf32>
  return %l, %d : tensor<4xf32>, tensor<4xf32>
}

// The backward pass's ops (moe-differentiate).
// CHECK-LABEL: func.func @gradients
// CHECK: moe.cross_entropy_grad %{{.+}}, %{{.+}}, %{{.+}} vocab = 251 : tensor<?x256xf32>, tensor<?xi32>, tensor<2xf32> -> tensor<?x256xf32>
// CHECK: moe.linear_grad %{{.+}}, %{{.+}}, %{{.+}} : tensor<?x256xf32>, tensor<?x64xf32>, tensor<256x64xbf16> -> tensor<?x64xf32>, tensor<256x64xf32>
// CHECK: moe.rms_norm_grad %{{.+}}, %{{.+}}, %{{.+}} eps = 1.000000e-05 : tensor<?x64xf32>, tensor<?x64xf32>, tensor<64xf32> -> tensor<?x64xf32>, tensor<64xf32>
// CHECK: moe.rope_grad %{{.+}}, %{{.+}} head_dim = 16 <kind = default, theta = 1.000000e+04, rotary_dim = 16> : tensor<?x64xf32>, tensor<?xi32>
// CHECK: moe.attention_grad %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} heads = 4 kv_heads = 2 scale = 2.500000e-01 {sliding_window = 8 : i64} : tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x32xf32>, tensor<?x32xf32> -> tensor<?x64xf32>, tensor<?x32xf32>, tensor<?x32xf32>
// CHECK: moe.mlp_grad silu %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} : tensor<?x64xf32>, tensor<?x64xf32>, tensor<96x64xf32>, tensor<96x64xf32>, tensor<64x96xf32> -> tensor<?x64xf32>, tensor<96x64xf32>, tensor<96x64xf32>, tensor<64x96xf32>
// CHECK: moe.embedding_grad %{{.+}}[%{{.+}}] padding_idx = 0 : tensor<?x64xf32>, tensor<?xi32> -> tensor<251x64xf32>
// CHECK: moe.route_grad %{{.+}}, %{{.+}}, %{{.+}} <scoring = softmax, top_k = 2, normalize = true, compute_type = f32> : tensor<?x2xf32>, tensor<?x8xf32>, tensor<?x2xi32> -> tensor<?x8xf32>
// CHECK: moe.experts_grad silu %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} : {{.*}} -> tensor<?x64xf32>, tensor<?x2xf32>, tensor<8x96x64xf32>, tensor<8x96x64xf32>, tensor<8x64x96xf32>
// CHECK: %{{.+}}, %[[SG:.+]], %[[SU:.+]], %[[SO:.+]] = moe.experts_saved silu %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} : tensor<?x64xf32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x96x64xf32>, tensor<8x96x64xf32>, tensor<8x64x96xf32> -> tensor<?x64xf32>, tensor<?x192xf32>, tensor<?x192xf32>, tensor<?x128xf32>
// CHECK: moe.experts_grad silu %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} saved(%[[SG]], %[[SU]], %[[SO]] : tensor<?x192xf32>, tensor<?x192xf32>, tensor<?x128xf32>) : {{.*}} -> tensor<?x64xf32>, tensor<?x2xf32>
// CHECK: moe.router_stats_grad %{{.+}}, %{{.+}}, %{{.+}} aux_coef = 1.000000e-03 z_coef = 0.000000e+00 : tensor<?x8xf32>, tensor<3x8xf32>, tensor<3x8xf32> -> tensor<?x8xf32>
// CHECK: moe.bias_grad %{{.+}} : tensor<?x64xf32> -> tensor<64xf32>
// CHECK: moe.mla_attention_grad %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} heads = 2 scale = 5.000000e-01 <kind = default, theta = 1.000000e+04, rotary_dim = 8, interleaved = true> : tensor<?x32xf32>, tensor<?x48xf32>, tensor<?x64xf32>, tensor<?x8xf32>, tensor<?xi32> -> tensor<?x48xf32>, tensor<?x64xf32>, tensor<?x8xf32>
// CHECK: moe.sigmoid_gate_grad %{{.+}}, %{{.+}}, %{{.+}} : tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x2xf32> -> tensor<?x64xf32>, tensor<?x2xf32>
func.func @gradients(%l: tensor<?x256xf32>, %y: tensor<?xi32>, %ce: tensor<2xf32>, %x: tensor<?x64xf32>, %w: tensor<256x64xbf16>, %n: tensor<64xf32>, %q: tensor<?x64xf32>, %k: tensor<?x32xf32>, %g: tensor<96x64xf32>, %d: tensor<64x96xf32>) {
  %dl = moe.cross_entropy_grad %l, %y, %ce vocab = 251 : tensor<?x256xf32>, tensor<?xi32>, tensor<2xf32> -> tensor<?x256xf32>
  %dx, %dw = moe.linear_grad %dl, %x, %w : tensor<?x256xf32>, tensor<?x64xf32>, tensor<256x64xbf16> -> tensor<?x64xf32>, tensor<256x64xf32>
  %dn, %dnw = moe.rms_norm_grad %dx, %x, %n eps = 1.0e-05 : tensor<?x64xf32>, tensor<?x64xf32>, tensor<64xf32> -> tensor<?x64xf32>, tensor<64xf32>
  %dr = moe.rope_grad %dn, %y head_dim = 16 <kind = default, theta = 1.0e+04, rotary_dim = 16> : tensor<?x64xf32>, tensor<?xi32>
  %dq, %dk, %dv = moe.attention_grad %dr, %q, %k, %k heads = 4 kv_heads = 2 scale = 0.25 {sliding_window = 8 : i64} : tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x32xf32>, tensor<?x32xf32> -> tensor<?x64xf32>, tensor<?x32xf32>, tensor<?x32xf32>
  %mx, %mg, %mu, %md = moe.mlp_grad silu %dq, %x, %g, %g, %d : tensor<?x64xf32>, tensor<?x64xf32>, tensor<96x64xf32>, tensor<96x64xf32>, tensor<64x96xf32> -> tensor<?x64xf32>, tensor<96x64xf32>, tensor<96x64xf32>, tensor<64x96xf32>
  %dt = moe.embedding_grad %mx[%y] padding_idx = 0 : tensor<?x64xf32>, tensor<?xi32> -> tensor<251x64xf32>
  return
}

func.func @moe_gradients(%dw: tensor<?x2xf32>, %gate: tensor<?x8xf32>, %sel: tensor<?x2xi32>, %x: tensor<?x64xf32>, %w1: tensor<8x96x64xf32>, %w2: tensor<8x64x96xf32>, %s: tensor<3x8xf32>, %q32: tensor<?x32xf32>, %q48: tensor<?x48xf32>, %kr: tensor<?x8xf32>, %pos: tensor<?xi32>) {
  %dl = moe.route_grad %dw, %gate, %sel <scoring = softmax, top_k = 2, normalize = true, compute_type = f32> : tensor<?x2xf32>, tensor<?x8xf32>, tensor<?x2xi32> -> tensor<?x8xf32>
  %dx, %dr, %d1, %d3, %d2 = moe.experts_grad silu %x, %x, %dw, %sel, %w1, %w1, %w2 : tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x96x64xf32>, tensor<8x96x64xf32>, tensor<8x64x96xf32> -> tensor<?x64xf32>, tensor<?x2xf32>, tensor<8x96x64xf32>, tensor<8x96x64xf32>, tensor<8x64x96xf32>
  %ey, %eg, %eu, %eo = moe.experts_saved silu %x, %dw, %sel, %w1, %w1, %w2 : tensor<?x64xf32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x96x64xf32>, tensor<8x96x64xf32>, tensor<8x64x96xf32> -> tensor<?x64xf32>, tensor<?x192xf32>, tensor<?x192xf32>, tensor<?x128xf32>
  %ex, %er, %e1, %e3, %e2 = moe.experts_grad silu %x, %x, %dw, %sel, %w1, %w1, %w2 saved(%eg, %eu, %eo : tensor<?x192xf32>, tensor<?x192xf32>, tensor<?x128xf32>) : tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x96x64xf32>, tensor<8x96x64xf32>, tensor<8x64x96xf32> -> tensor<?x64xf32>, tensor<?x2xf32>, tensor<8x96x64xf32>, tensor<8x96x64xf32>, tensor<8x64x96xf32>
  %ds = moe.router_stats_grad %gate, %s, %s aux_coef = 1.0e-03 z_coef = 0.0 : tensor<?x8xf32>, tensor<3x8xf32>, tensor<3x8xf32> -> tensor<?x8xf32>
  %db = moe.bias_grad %x : tensor<?x64xf32> -> tensor<64xf32>
  %mq, %mkv, %mkr = moe.mla_attention_grad %q32, %q48, %x, %kr, %pos heads = 2 scale = 0.5 <kind = default, theta = 1.0e+04, rotary_dim = 8, interleaved = true> : tensor<?x32xf32>, tensor<?x48xf32>, tensor<?x64xf32>, tensor<?x8xf32>, tensor<?xi32> -> tensor<?x48xf32>, tensor<?x64xf32>, tensor<?x8xf32>
  %sx, %sg = moe.sigmoid_gate_grad %x, %x, %dw : tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x2xf32> -> tensor<?x64xf32>, tensor<?x2xf32>
  return
}
