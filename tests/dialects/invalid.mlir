// RUN: moe-opt --split-input-file --verify-diagnostics %s

// One case per verifier message of lib/MoE/IR/MoEOps.cpp and of the
// #moe.rope / #moe.routing attribute verifiers in lib/MoE/IR/MoEDialect.cpp.
// Attribute verifier errors are reported where the attribute is parsed.

//===----------------------------------------------------------------------===//
// moe.weight, moe.expert_weight
//===----------------------------------------------------------------------===//

func.func @weight_empty_name() {
  // expected-error@+1 {{'moe.weight' op expected a non-empty checkpoint tensor name}}
  %0 = moe.weight "" : tensor<4x4xf32>
  return
}

// -----

func.func @weight_dynamic_shape() {
  // expected-error@+1 {{'moe.weight' op expected a static shape for weight 'model.norm.weight' but got 'tensor<?xf32>'}}
  %0 = moe.weight "model.norm.weight" : tensor<?xf32>
  return
}

// -----

func.func @weight_zero_dim() {
  // expected-error@+1 {{'moe.weight' op expected every dimension of weight 'model.norm.weight' to be > 0 but got 'tensor<0x4xf32>'}}
  %0 = moe.weight "model.norm.weight" : tensor<0x4xf32>
  return
}

// -----

func.func @weight_placeholder() {
  // expected-error@+1 {{'moe.weight' op expected a plain tensor name; '{e}' belongs to moe.expert_weight but got 'model.layers.0.experts.{e}.w1.weight'}}
  %0 = moe.weight "model.layers.0.experts.{e}.w1.weight" : tensor<4x4xf32>
  return
}

// -----

func.func @expert_weight_no_placeholder() {
  // expected-error@+1 {{'moe.expert_weight' op expected exactly one '{e}' placeholder in 'model.layers.0.experts.0.w1.weight'}}
  %0 = moe.expert_weight "model.layers.0.experts.0.w1.weight" : tensor<2x4x4xf32>
  return
}

// -----

func.func @weight_role_experts() {
  // expected-error@+1 {{'moe.weight' op expected role 'experts' only on moe.expert_weight}}
  %0 = moe.weight "model.layers.0.mlp.gate_proj.weight" as experts layer 0 : tensor<4x4xf32>
  return
}

// -----

func.func @weight_role_row_vector() {
  // expected-error@+1 {{'moe.weight' op expected a matrix for a row-parallel weight but got 'tensor<4xf32>'}}
  %0 = moe.weight "model.layers.0.self_attn.o_proj.bias" as row layer 0 : tensor<4xf32>
  return
}

// -----

func.func @weight_negative_layer() {
  // expected-error@+1 {{'moe.weight' op expected a decoder layer >= 0 but got -1}}
  %0 = moe.weight "model.layers.0.input_layernorm.weight" layer -1 : tensor<4xf32>
  return
}

// -----

func.func @expert_weight_negative_layer() {
  // expected-error@+1 {{'moe.expert_weight' op expected a decoder layer >= 0 but got -2}}
  %0 = moe.expert_weight "model.layers.0.experts.{e}.w1.weight" layer -2 : tensor<2x4x4xf32>
  return
}

// -----

func.func @expert_weight_etp_dim() {
  // expected-error@+1 {{'moe.expert_weight' op expected etp_dim 0 (an expert's output rows) or 1 (its input columns) but got 2}}
  %0 = moe.expert_weight "model.layers.0.experts.{e}.w1.weight" etp_dim 2 : tensor<2x4x4xf32>
  return
}

// -----

func.func @expert_weight_two_placeholders() {
  // expected-error@+1 {{'moe.expert_weight' op expected exactly one '{e}' placeholder in 'model.layers.{e}.experts.{e}.w1.weight'}}
  %0 = moe.expert_weight "model.layers.{e}.experts.{e}.w1.weight" : tensor<2x4x4xf32>
  return
}

// -----

// verifyStaticWeight is shared: the expert stack must be static too.
func.func @expert_weight_dynamic_shape() {
  // expected-error@+1 {{'moe.expert_weight' op expected a static shape for weight 'model.layers.0.experts.{e}.w1.weight' but got 'tensor<?x4x4xf32>'}}
  %0 = moe.expert_weight "model.layers.0.experts.{e}.w1.weight" : tensor<?x4x4xf32>
  return
}

//===----------------------------------------------------------------------===//
// moe.embedding
//===----------------------------------------------------------------------===//

// -----

func.func @embedding_width(%table: tensor<100x64xbf16>, %tokens: tensor<?xi32>) {
  // expected-error@+1 {{'moe.embedding' op expected result width 64 (the table's) but got 32}}
  %0 = moe.embedding %table[%tokens] : tensor<100x64xbf16>, tensor<?xi32> -> tensor<?x32xbf16>
  return
}

// -----

func.func @embedding_rows(%table: tensor<100x64xbf16>, %tokens: tensor<5xi32>) {
  // expected-error@+1 {{'moe.embedding' op expected one row per token (5) but got 6}}
  %0 = moe.embedding %table[%tokens] : tensor<100x64xbf16>, tensor<5xi32> -> tensor<6x64xbf16>
  return
}

//===----------------------------------------------------------------------===//
// moe.rms_norm, moe.layer_norm
//===----------------------------------------------------------------------===//

// -----

func.func @rms_norm_width(%x: tensor<?x64xbf16>, %w: tensor<48xbf16>) {
  // expected-error@+1 {{'moe.rms_norm' op expected the weight size 48 to divide the input width 64}}
  %0 = moe.rms_norm %x, %w eps = 1.0e-05 : tensor<?x64xbf16>, tensor<48xbf16>
  return
}

// -----

func.func @rms_norm_epsilon(%x: tensor<?x64xbf16>, %w: tensor<64xbf16>) {
  // expected-error@+1 {{'moe.rms_norm' op expected epsilon > 0 but got 0.000000e+00}}
  %0 = moe.rms_norm %x, %w eps = 0.0 : tensor<?x64xbf16>, tensor<64xbf16>
  return
}

// -----

func.func @rms_norm_squares_type(%x: tensor<?x32xf32>, %w: tensor<32xf32>, %s: tensor<?x2xf32>) {
  // expected-error@+1 {{'moe.rms_norm' op expected sum_squares of [T, 1] f32 but got 'tensor<?x2xf32>'}}
  %0 = moe.rms_norm %x, %w sum_squares(%s : tensor<?x2xf32>) eps = 1.0e-05 {row_width = 64 : i64} : tensor<?x32xf32>, tensor<32xf32>
  return
}

// -----

func.func @rms_norm_squares_weight(%x: tensor<?x32xf32>, %w: tensor<16xf32>, %s: tensor<?x1xf32>) {
  // expected-error@+1 {{'moe.rms_norm' op with sum_squares, expected the weight of the input width 32 but got 16}}
  %0 = moe.rms_norm %x, %w sum_squares(%s : tensor<?x1xf32>) eps = 1.0e-05 {row_width = 64 : i64} : tensor<?x32xf32>, tensor<16xf32>
  return
}

// -----

func.func @rms_norm_squares_row_width(%x: tensor<?x32xf32>, %w: tensor<32xf32>, %s: tensor<?x1xf32>) {
  // expected-error@+1 {{'moe.rms_norm' op with sum_squares, expected row_width: a multiple of the input width}}
  %0 = moe.rms_norm %x, %w sum_squares(%s : tensor<?x1xf32>) eps = 1.0e-05 {row_width = 48 : i64} : tensor<?x32xf32>, tensor<32xf32>
  return
}

// -----

func.func @rms_norm_row_width_alone(%x: tensor<?x32xf32>, %w: tensor<32xf32>) {
  // expected-error@+1 {{'moe.rms_norm' op row_width: only with sum_squares}}
  %0 = moe.rms_norm %x, %w eps = 1.0e-05 {row_width = 64 : i64} : tensor<?x32xf32>, tensor<32xf32>
  return
}

// -----

func.func @row_sum_squares_result(%x: tensor<?x32xf32>) {
  // expected-error@+1 {{'moe.row_sum_squares' op expected a result of [T, 1] f32 but got 'tensor<?x1xbf16>'}}
  %0 = moe.row_sum_squares %x : tensor<?x32xf32> -> tensor<?x1xbf16>
  return
}

// -----

func.func @layer_norm_width(%x: tensor<?x64xf32>, %w: tensor<32xf32>) {
  // expected-error@+1 {{'moe.layer_norm' op expected a weight of the input width 64 but got 32}}
  %0 = moe.layer_norm %x, %w eps = 1.0e-05 : tensor<?x64xf32>, tensor<32xf32>
  return
}

// -----

func.func @layer_norm_bias(%x: tensor<?x64xf32>, %w: tensor<64xf32>, %b: tensor<64xbf16>) {
  // expected-error@+1 {{'moe.layer_norm' op expected the bias type 'tensor<64xf32>' but got 'tensor<64xbf16>'}}
  %0 = moe.layer_norm %x, %w, %b eps = 1.0e-05 : tensor<?x64xf32>, tensor<64xf32>, tensor<64xbf16>
  return
}

// -----

func.func @add_norm_width(%a: tensor<?x64xf32>, %w: tensor<48xf32>) {
  // expected-error@+1 {{'moe.add_norm' op expected the weight size 48 to divide the input width 64}}
  %s, %n = moe.add_norm %a, %a, %w eps = 1.0e-05 : tensor<?x64xf32>, tensor<48xf32>
  return
}

// -----

func.func @add_norm_epsilon(%a: tensor<?x64xf32>, %w: tensor<64xf32>) {
  // expected-error@+1 {{'moe.add_norm' op expected epsilon > 0 but got -1.000000e+00}}
  %s, %n = moe.add_norm %a, %a, %w eps = -1.0 : tensor<?x64xf32>, tensor<64xf32>
  return
}

// -----

func.func @add_norm_layer_width(%a: tensor<?x64xf32>, %w: tensor<32xf32>) {
  // expected-error@+1 {{'moe.add_norm' op expected a layer_norm weight of the input width 64 but got 32}}
  %s, %n = moe.add_norm %a, %a, layer %w eps = 1.0e-05 : tensor<?x64xf32>, tensor<32xf32>
  return
}

// -----

func.func @add_norm_layer_bias(%a: tensor<?x64xf32>, %w: tensor<64xf32>, %b: tensor<64xbf16>) {
  // expected-error@+1 {{'moe.add_norm' op expected the bias type 'tensor<64xf32>' but got 'tensor<64xbf16>'}}
  %s, %n = moe.add_norm %a, %a, layer %w, %b eps = 1.0e-05 : tensor<?x64xf32>, tensor<64xf32>, tensor<64xbf16>
  return
}

// -----

func.func @add_norm_rms_bias(%a: tensor<?x64xf32>, %w: tensor<64xf32>) {
  // expected-error@+1 {{'moe.add_norm' op expected no bias for an rms_norm (only `layer` has one)}}
  %s, %n = moe.add_norm %a, %a, %w, %w eps = 1.0e-05 : tensor<?x64xf32>, tensor<64xf32>, tensor<64xf32>
  return
}

// -----

func.func @add_norm_types(%a: tensor<?x64xf32>, %b: tensor<?x64xbf16>, %w: tensor<64xf32>) {
  // expected-error@+1 {{'moe.add_norm' op failed to verify that all of {lhs, rhs, sum, result} have same type}}
  %s, %n = "moe.add_norm"(%a, %b, %w) {epsilon = 1.0e-05 : f64, operandSegmentSizes = array<i32: 1, 1, 1, 0>} : (tensor<?x64xf32>, tensor<?x64xbf16>, tensor<64xf32>) -> (tensor<?x64xf32>, tensor<?x64xf32>)
  return
}

// -----

// The epsilon check through moe.layer_norm.
func.func @layer_norm_epsilon(%x: tensor<?x64xf32>, %w: tensor<64xf32>) {
  // expected-error@+1 {{'moe.layer_norm' op expected epsilon > 0 but got -1.000000e+00}}
  %0 = moe.layer_norm %x, %w eps = -1.0 : tensor<?x64xf32>, tensor<64xf32>
  return
}

//===----------------------------------------------------------------------===//
// moe.linear
//===----------------------------------------------------------------------===//

// -----

func.func @linear_input_width(%x: tensor<?x32xbf16>, %w: tensor<16x64xbf16>) {
  // expected-error@+1 {{'moe.linear' op expected input width 64 (weight dim 1) but got 32}}
  %0 = moe.linear %x, %w : tensor<?x32xbf16>, tensor<16x64xbf16> -> tensor<?x16xbf16>
  return
}

// -----

func.func @linear_result_width(%x: tensor<?x64xbf16>, %w: tensor<16x64xbf16>) {
  // expected-error@+1 {{'moe.linear' op expected result width 16 (weight dim 0) but got 32}}
  %0 = moe.linear %x, %w : tensor<?x64xbf16>, tensor<16x64xbf16> -> tensor<?x32xbf16>
  return
}

// -----

func.func @linear_rows(%x: tensor<4x64xbf16>, %w: tensor<16x64xbf16>) {
  // expected-error@+1 {{'moe.linear' op expected 4 result rows (one per input row) but got 5}}
  %0 = moe.linear %x, %w : tensor<4x64xbf16>, tensor<16x64xbf16> -> tensor<5x16xbf16>
  return
}

// -----

func.func @linear_bias(%x: tensor<?x64xbf16>, %w: tensor<16x64xbf16>, %b: tensor<64xbf16>) {
  // expected-error@+1 {{'moe.linear' op expected a bias of size 16 but got 64}}
  %0 = moe.linear %x, %w, %b : tensor<?x64xbf16>, tensor<16x64xbf16>, tensor<64xbf16> -> tensor<?x16xbf16>
  return
}

//===----------------------------------------------------------------------===//
// moe.split
//===----------------------------------------------------------------------===//

// -----

// The custom syntax cannot spell zero results; the generic one can.
func.func @split_no_result(%x: tensor<?x4xf32>) {
  // expected-error@+1 {{'moe.split' op expected at least one result}}
  "moe.split"(%x) : (tensor<?x4xf32>) -> ()
  return
}

// -----

func.func @split_dynamic_width(%x: tensor<?x96xbf16>) {
  // expected-error@+1 {{'moe.split' op expected static result widths}}
  %0:2 = moe.split %x : tensor<?x96xbf16> -> tensor<?x64xbf16>, tensor<?x?xbf16>
  return
}

// -----

func.func @split_rows(%x: tensor<4x96xbf16>) {
  // expected-error@+1 {{'moe.split' op expected every result to keep the 4 input rows}}
  %0:2 = moe.split %x : tensor<4x96xbf16> -> tensor<4x64xbf16>, tensor<3x32xbf16>
  return
}

// -----

func.func @split_widths(%x: tensor<?x96xbf16>) {
  // expected-error@+1 {{'moe.split' op expected result widths to add up to 96 but they add up to 80}}
  %0:2 = moe.split %x : tensor<?x96xbf16> -> tensor<?x64xbf16>, tensor<?x16xbf16>
  return
}

//===----------------------------------------------------------------------===//
// moe.sigmoid_gate
//===----------------------------------------------------------------------===//

// -----

func.func @sigmoid_gate_width(%x: tensor<?x64xbf16>, %g: tensor<?x2xbf16>) {
  // expected-error@+1 {{'moe.sigmoid_gate' op expected a [T, 1] gate but got width 2}}
  %0 = moe.sigmoid_gate %x, %g : tensor<?x64xbf16>, tensor<?x2xbf16>
  return
}

// -----

func.func @sigmoid_gate_rows(%x: tensor<4x64xbf16>, %g: tensor<3x1xbf16>) {
  // expected-error@+1 {{'moe.sigmoid_gate' op expected one gate per input row}}
  %0 = moe.sigmoid_gate %x, %g : tensor<4x64xbf16>, tensor<3x1xbf16>
  return
}

//===----------------------------------------------------------------------===//
// moe.rope
//===----------------------------------------------------------------------===//

// -----

func.func @rope_head_dim(%x: tensor<?x64xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{'moe.rope' op expected head_dim > 0 but got 0}}
  %0 = moe.rope %x, %p head_dim = 0 <kind = default, theta = 1.0e4, rotary_dim = 32> : tensor<?x64xbf16>, tensor<?xi32>
  return
}

// -----

func.func @rope_head_dim_divides(%x: tensor<?x64xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{'moe.rope' op expected head_dim 48 to divide the input width 64}}
  %0 = moe.rope %x, %p head_dim = 48 <kind = default, theta = 1.0e4, rotary_dim = 32> : tensor<?x64xbf16>, tensor<?xi32>
  return
}

// -----

func.func @rope_rotary_dim(%x: tensor<?x64xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{'moe.rope' op expected rotary_dim <= head_dim 32 but got 64}}
  %0 = moe.rope %x, %p head_dim = 32 <kind = default, theta = 1.0e4, rotary_dim = 64> : tensor<?x64xbf16>, tensor<?xi32>
  return
}

// -----

func.func @rope_positions(%x: tensor<4x64xbf16>, %p: tensor<3xi32>) {
  // expected-error@+1 {{'moe.rope' op expected one position per token}}
  %0 = moe.rope %x, %p head_dim = 32 <kind = default, theta = 1.0e4, rotary_dim = 32> : tensor<4x64xbf16>, tensor<3xi32>
  return
}

//===----------------------------------------------------------------------===//
// moe.attention
//===----------------------------------------------------------------------===//

// -----

func.func @attention_kv_heads(%q: tensor<?x128xbf16>, %k: tensor<?x96xbf16>, %v: tensor<?x96xbf16>) {
  // expected-error@+1 {{'moe.attention' op expected num_kv_heads to divide num_heads but got 3 and 4}}
  %0 = moe.attention %q, %k, %v heads = 4 kv_heads = 3 scale = 0.125 : tensor<?x128xbf16>, tensor<?x96xbf16>, tensor<?x96xbf16> -> tensor<?x128xbf16>
  return
}

// -----

func.func @attention_dynamic_width(%q: tensor<?x?xbf16>, %k: tensor<?x64xbf16>, %v: tensor<?x64xbf16>) {
  // expected-error@+1 {{'moe.attention' op expected a static query width}}
  %0 = moe.attention %q, %k, %v heads = 4 kv_heads = 2 scale = 0.125 : tensor<?x?xbf16>, tensor<?x64xbf16>, tensor<?x64xbf16> -> tensor<?x128xbf16>
  return
}

// -----

func.func @attention_head_multiple(%q: tensor<?x128xbf16>, %k: tensor<?x64xbf16>, %v: tensor<?x63xbf16>) {
  // expected-error@+1 {{'moe.attention' op expected the value width 63 to be a multiple of 2 heads}}
  %0 = moe.attention %q, %k, %v heads = 4 kv_heads = 2 scale = 0.125 : tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x63xbf16> -> tensor<?x128xbf16>
  return
}

// -----

func.func @attention_qk_head_dim(%q: tensor<?x128xbf16>, %k: tensor<?x32xbf16>, %v: tensor<?x64xbf16>) {
  // expected-error@+1 {{'moe.attention' op expected query and key head dims to match but got 32 and 16}}
  %0 = moe.attention %q, %k, %v heads = 4 kv_heads = 2 scale = 0.125 : tensor<?x128xbf16>, tensor<?x32xbf16>, tensor<?x64xbf16> -> tensor<?x128xbf16>
  return
}

// -----

func.func @attention_result_width(%q: tensor<?x128xbf16>, %k: tensor<?x64xbf16>, %v: tensor<?x32xbf16>) {
  // expected-error@+1 {{'moe.attention' op expected result width 64 (heads x value head dim) but got 128}}
  %0 = moe.attention %q, %k, %v heads = 4 kv_heads = 2 scale = 0.125 : tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x32xbf16> -> tensor<?x128xbf16>
  return
}

// -----

func.func @attention_scale(%q: tensor<?x128xbf16>, %k: tensor<?x64xbf16>, %v: tensor<?x64xbf16>) {
  // expected-error@+1 {{'moe.attention' op expected scale > 0}}
  %0 = moe.attention %q, %k, %v heads = 4 kv_heads = 2 scale = 0.0 : tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x64xbf16> -> tensor<?x128xbf16>
  return
}

// -----

func.func @attention_sliding_window(%q: tensor<?x128xbf16>, %k: tensor<?x64xbf16>, %v: tensor<?x64xbf16>) {
  // expected-error@+1 {{'moe.attention' op expected sliding_window > 0 but got 0}}
  %0 = moe.attention %q, %k, %v heads = 4 kv_heads = 2 scale = 0.125 {sliding_window = 0 : i64} : tensor<?x128xbf16>, tensor<?x64xbf16>, tensor<?x64xbf16> -> tensor<?x128xbf16>
  return
}

//===----------------------------------------------------------------------===//
// moe.mla_attention
//===----------------------------------------------------------------------===//

// -----

func.func @mla_heads(%q: tensor<?x48xbf16>, %kv: tensor<?x80xbf16>, %kr: tensor<?x8xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{'moe.mla_attention' op expected num_heads > 0 but got 0}}
  %0 = moe.mla_attention %q, %kv, %kr, %p heads = 0 scale = 0.25 <kind = default, theta = 1.0e4, rotary_dim = 8, interleaved = true> : tensor<?x48xbf16>, tensor<?x80xbf16>, tensor<?x8xbf16>, tensor<?xi32> -> tensor<?x48xbf16>
  return
}

// -----

// headWidth through moe.mla_attention.
func.func @mla_kv_multiple(%q: tensor<?x48xbf16>, %kv: tensor<?x81xbf16>, %kr: tensor<?x8xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{'moe.mla_attention' op expected the kv width 81 to be a multiple of 2 heads}}
  %0 = moe.mla_attention %q, %kv, %kr, %p heads = 2 scale = 0.25 <kind = default, theta = 1.0e4, rotary_dim = 8, interleaved = true> : tensor<?x48xbf16>, tensor<?x81xbf16>, tensor<?x8xbf16>, tensor<?xi32> -> tensor<?x48xbf16>
  return
}

// -----

func.func @mla_rotary_dim(%q: tensor<?x48xbf16>, %kv: tensor<?x80xbf16>, %kr: tensor<?x8xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{'moe.mla_attention' op expected rotary_dim 8 (the key_rope width) but got 16}}
  %0 = moe.mla_attention %q, %kv, %kr, %p heads = 2 scale = 0.25 <kind = default, theta = 1.0e4, rotary_dim = 16, interleaved = true> : tensor<?x48xbf16>, tensor<?x80xbf16>, tensor<?x8xbf16>, tensor<?xi32> -> tensor<?x48xbf16>
  return
}

// -----

func.func @mla_query_head_dim(%q: tensor<?x16xbf16>, %kv: tensor<?x80xbf16>, %kr: tensor<?x8xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{'moe.mla_attention' op expected a query head dim 8 larger than the rotary dim 8}}
  %0 = moe.mla_attention %q, %kv, %kr, %p heads = 2 scale = 0.25 <kind = default, theta = 1.0e4, rotary_dim = 8, interleaved = true> : tensor<?x16xbf16>, tensor<?x80xbf16>, tensor<?x8xbf16>, tensor<?xi32> -> tensor<?x48xbf16>
  return
}

// -----

func.func @mla_kv_head_dim(%q: tensor<?x48xbf16>, %kv: tensor<?x32xbf16>, %kr: tensor<?x8xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{'moe.mla_attention' op expected a kv head dim 16 larger than the nope dim 16}}
  %0 = moe.mla_attention %q, %kv, %kr, %p heads = 2 scale = 0.25 <kind = default, theta = 1.0e4, rotary_dim = 8, interleaved = true> : tensor<?x48xbf16>, tensor<?x32xbf16>, tensor<?x8xbf16>, tensor<?xi32> -> tensor<?x48xbf16>
  return
}

// -----

func.func @mla_result_width(%q: tensor<?x48xbf16>, %kv: tensor<?x80xbf16>, %kr: tensor<?x8xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{'moe.mla_attention' op expected result width 48 but got 32}}
  %0 = moe.mla_attention %q, %kv, %kr, %p heads = 2 scale = 0.25 <kind = default, theta = 1.0e4, rotary_dim = 8, interleaved = true> : tensor<?x48xbf16>, tensor<?x80xbf16>, tensor<?x8xbf16>, tensor<?xi32> -> tensor<?x32xbf16>
  return
}

// -----

func.func @mla_scale(%q: tensor<?x48xbf16>, %kv: tensor<?x80xbf16>, %kr: tensor<?x8xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{'moe.mla_attention' op expected scale > 0}}
  %0 = moe.mla_attention %q, %kv, %kr, %p heads = 2 scale = -0.25 <kind = default, theta = 1.0e4, rotary_dim = 8, interleaved = true> : tensor<?x48xbf16>, tensor<?x80xbf16>, tensor<?x8xbf16>, tensor<?xi32> -> tensor<?x48xbf16>
  return
}

//===----------------------------------------------------------------------===//
// moe.mlp
//===----------------------------------------------------------------------===//

// -----

func.func @mlp_gate_up(%x: tensor<?x64xbf16>, %g: tensor<128x64xbf16>, %u: tensor<96x64xbf16>, %d: tensor<64x128xbf16>) {
  // expected-error@+1 {{'moe.mlp' op expected gate and up weights of the same shape}}
  %0 = moe.mlp silu %x, %g, %u, %d : tensor<?x64xbf16>, tensor<128x64xbf16>, tensor<96x64xbf16>, tensor<64x128xbf16>
  return
}

// -----

func.func @mlp_gate_width(%x: tensor<?x64xbf16>, %g: tensor<128x32xbf16>, %u: tensor<128x32xbf16>, %d: tensor<64x128xbf16>) {
  // expected-error@+1 {{'moe.mlp' op expected gate/up weights [128, 64] but got [128, 32]}}
  %0 = moe.mlp silu %x, %g, %u, %d : tensor<?x64xbf16>, tensor<128x32xbf16>, tensor<128x32xbf16>, tensor<64x128xbf16>
  return
}

// -----

func.func @mlp_down(%x: tensor<?x64xbf16>, %g: tensor<128x64xbf16>, %u: tensor<128x64xbf16>, %d: tensor<128x64xbf16>) {
  // expected-error@+1 {{'moe.mlp' op expected a down weight [64, 128] but got [128, 64]}}
  %0 = moe.mlp silu %x, %g, %u, %d : tensor<?x64xbf16>, tensor<128x64xbf16>, tensor<128x64xbf16>, tensor<128x64xbf16>
  return
}

//===----------------------------------------------------------------------===//
// moe.concat
//===----------------------------------------------------------------------===//

// -----

func.func @concat_width(%a: tensor<?x8xf32>, %b: tensor<?x4xf32>) {
  // expected-error@+1 {{'moe.concat' op expected a result width of 12 (the inputs' widths added up) but got 16}}
  %j = moe.concat %a, %b : tensor<?x8xf32>, tensor<?x4xf32> -> tensor<?x16xf32>
  return
}

// -----

func.func @concat_element_type(%a: tensor<?x8xf32>, %b: tensor<?x4xbf16>) {
  // expected-error@+1 {{'moe.concat' op expected every input in the result's element type 'f32'}}
  %j = moe.concat %a, %b : tensor<?x8xf32>, tensor<?x4xbf16> -> tensor<?x12xf32>
  return
}

// -----

func.func @concat_rows(%a: tensor<3x8xf32>, %b: tensor<2x4xf32>) {
  // expected-error@+1 {{'moe.concat' op expected every input to have the 3 result rows}}
  %j = moe.concat %a, %b : tensor<3x8xf32>, tensor<2x4xf32> -> tensor<3x12xf32>
  return
}

// -----

func.func @concat_dynamic_width(%a: tensor<?x?xf32>) {
  // expected-error@+1 {{'moe.concat' op expected static input widths}}
  %j = moe.concat %a : tensor<?x?xf32> -> tensor<?x12xf32>
  return
}

// -----

func.func @concat_nothing() {
  // expected-error@+1 {{'moe.concat' op expected at least one input}}
  %j = "moe.concat"() : () -> tensor<?x12xf32>
  return
}

//===----------------------------------------------------------------------===//
// moe.route (the checks it shares with moe.router are tested there once)
//===----------------------------------------------------------------------===//

// -----

func.func @route_dynamic_experts(%l: tensor<?x?xf32>) {
  // expected-error@+1 {{'moe.route' op expected logits of a static number of experts but got 'tensor<?x?xf32>'}}
  %w, %e = moe.route %l <scoring = softmax, top_k = 2, compute_type = f32> : tensor<?x?xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

func.func @route_logits_type(%l: tensor<?x8xbf16>) {
  // expected-error@+1 {{'moe.route' op expected logits in the compute type 'f32'}}
  %w, %e = moe.route %l <scoring = softmax, top_k = 2, compute_type = f32> : tensor<?x8xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

func.func @route_top_k(%l: tensor<?x8xf32>) {
  // expected-error@+1 {{'moe.route' op expected top_k <= 8 experts but got 9}}
  %w, %e = moe.route %l <scoring = softmax, top_k = 9, compute_type = f32> : tensor<?x8xf32> -> tensor<?x9xf32>, tensor<?x9xi32>
  return
}

// -----

func.func @route_bias(%l: tensor<?x8xf32>, %b: tensor<16xf32>) {
  // expected-error@+1 {{'moe.route' op expected a correction bias of 8 values but got 16}}
  %w, %e = moe.route %l bias %b <scoring = sigmoid, top_k = 2, compute_type = f32> : tensor<?x8xf32>, tensor<16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

//===----------------------------------------------------------------------===//
// moe.router
//===----------------------------------------------------------------------===//

// -----

func.func @router_gate_width(%x: tensor<?x64xbf16>, %g: tensor<8x32xbf16>) {
  // expected-error@+1 {{'moe.router' op expected a gate weight of width 64 but got 32}}
  %w, %e = moe.router %x, %g <scoring = softmax, top_k = 2, compute_type = f32> : tensor<?x64xbf16>, tensor<8x32xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

func.func @router_top_k(%x: tensor<?x64xbf16>, %g: tensor<8x64xbf16>) {
  // expected-error@+1 {{'moe.router' op expected top_k <= 8 experts but got 9}}
  %w, %e = moe.router %x, %g <scoring = softmax, top_k = 9, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x9xf32>, tensor<?x9xi32>
  return
}

// -----

func.func @router_result_widths(%x: tensor<?x64xbf16>, %g: tensor<8x64xbf16>) {
  // expected-error@+1 {{'moe.router' op expected [T, 2] weights and experts but got widths 2 and 3}}
  %w, %e = moe.router %x, %g <scoring = softmax, top_k = 2, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xf32>, tensor<?x3xi32>
  return
}

// -----

func.func @router_compute_type(%x: tensor<?x64xbf16>, %g: tensor<8x64xbf16>) {
  // expected-error@+1 {{'moe.router' op expected weights in the compute type 'f32'}}
  %w, %e = moe.router %x, %g <scoring = softmax, top_k = 2, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xbf16>, tensor<?x2xi32>
  return
}

// -----

func.func @router_num_groups(%x: tensor<?x64xbf16>, %g: tensor<8x64xbf16>) {
  // expected-error@+1 {{'moe.router' op expected num_groups 3 to divide the 8 experts}}
  %w, %e = moe.router %x, %g <scoring = sigmoid, top_k = 2, num_groups = 3, topk_groups = 1, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

func.func @router_kept_groups(%x: tensor<?x64xbf16>, %g: tensor<16x64xbf16>) {
  // expected-error@+1 {{'moe.router' op expected the 1 kept groups of 4 experts to hold top_k = 6}}
  %w, %e = moe.router %x, %g <scoring = sigmoid, top_k = 6, num_groups = 4, topk_groups = 1, compute_type = f32> : tensor<?x64xbf16>, tensor<16x64xbf16> -> tensor<?x6xf32>, tensor<?x6xi32>
  return
}

// -----

func.func @router_top2_sum(%x: tensor<?x64xbf16>, %g: tensor<8x64xbf16>) {
  // expected-error@+1 {{'moe.router' op expected at least 2 experts per group for top2_sum}}
  %w, %e = moe.router %x, %g <scoring = sigmoid, top_k = 2, num_groups = 8, topk_groups = 4, group_score = top2_sum, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

func.func @router_bias(%x: tensor<?x64xbf16>, %g: tensor<8x64xbf16>, %b: tensor<16xf32>) {
  // expected-error@+1 {{'moe.router' op expected a correction bias of 8 values but got 16}}
  %w, %e = moe.router %x, %g bias %b <scoring = sigmoid, top_k = 2, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16>, tensor<16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

//===----------------------------------------------------------------------===//
// moe.experts
//===----------------------------------------------------------------------===//

// -----

func.func @experts_stack_sizes(%x: tensor<?x64xbf16>, %w: tensor<?x2xf32>, %e: tensor<?x2xi32>, %g: tensor<8x128x64xbf16>, %u: tensor<8x128x64xbf16>, %d: tensor<4x64x128xbf16>) {
  // expected-error@+1 {{'moe.experts' op expected the same number of experts in every stack but got 8, 8 and 4}}
  %0 = moe.experts silu %x, %w, %e, %g, %u, %d : tensor<?x64xbf16>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x128x64xbf16>, tensor<8x128x64xbf16>, tensor<4x64x128xbf16>
  return
}

// -----

func.func @experts_routing_widths(%x: tensor<?x64xbf16>, %w: tensor<?x2xf32>, %e: tensor<?x3xi32>, %g: tensor<8x128x64xbf16>, %u: tensor<8x128x64xbf16>, %d: tensor<8x64x128xbf16>) {
  // expected-error@+1 {{'moe.experts' op expected weights and experts of the same width}}
  %0 = moe.experts silu %x, %w, %e, %g, %u, %d : tensor<?x64xbf16>, tensor<?x2xf32>, tensor<?x3xi32>, tensor<8x128x64xbf16>, tensor<8x128x64xbf16>, tensor<8x64x128xbf16>
  return
}

// -----

func.func @experts_routing_rows(%x: tensor<4x64xbf16>, %w: tensor<4x2xf32>, %e: tensor<5x2xi32>, %g: tensor<8x128x64xbf16>, %u: tensor<8x128x64xbf16>, %d: tensor<8x64x128xbf16>) {
  // expected-error@+1 {{'moe.experts' op expected one routing row per token}}
  %0 = moe.experts silu %x, %w, %e, %g, %u, %d : tensor<4x64xbf16>, tensor<4x2xf32>, tensor<5x2xi32>, tensor<8x128x64xbf16>, tensor<8x128x64xbf16>, tensor<8x64x128xbf16>
  return
}

// -----

func.func @experts_too_many_selected(%x: tensor<?x64xbf16>, %w: tensor<?x4xf32>, %e: tensor<?x4xi32>, %g: tensor<2x128x64xbf16>, %u: tensor<2x128x64xbf16>, %d: tensor<2x64x128xbf16>) {
  // expected-error@+1 {{'moe.experts' op expected at most 2 selected experts per token but got 4}}
  %0 = moe.experts silu %x, %w, %e, %g, %u, %d : tensor<?x64xbf16>, tensor<?x4xf32>, tensor<?x4xi32>, tensor<2x128x64xbf16>, tensor<2x128x64xbf16>, tensor<2x64x128xbf16>
  return
}

// -----

// verifyMLPShapes through moe.experts (per-expert slices).
func.func @experts_down(%x: tensor<?x64xbf16>, %w: tensor<?x2xf32>, %e: tensor<?x2xi32>, %g: tensor<8x128x64xbf16>, %u: tensor<8x128x64xbf16>, %d: tensor<8x128x64xbf16>) {
  // expected-error@+1 {{'moe.experts' op expected a down weight [64, 128] but got [128, 64]}}
  %0 = moe.experts silu %x, %w, %e, %g, %u, %d : tensor<?x64xbf16>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x128x64xbf16>, tensor<8x128x64xbf16>, tensor<8x128x64xbf16>
  return
}

//===----------------------------------------------------------------------===//
// #moe.rope (RopeAttr::verify)
//===----------------------------------------------------------------------===//

// -----

func.func @rope_theta(%x: tensor<?x64xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{expected rope theta > 0 but got 0.000000e+00}}
  %0 = moe.rope %x, %p head_dim = 32 <kind = default, theta = 0.0, rotary_dim = 32> : tensor<?x64xbf16>, tensor<?xi32>
  return
}

// -----

func.func @rope_odd_rotary_dim(%x: tensor<?x64xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{expected an even rotary_dim > 0 but got 31}}
  %0 = moe.rope %x, %p head_dim = 32 <kind = default, theta = 1.0e4, rotary_dim = 31> : tensor<?x64xbf16>, tensor<?xi32>
  return
}

// -----

func.func @rope_factor(%x: tensor<?x64xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{expected rope factor > 0 but got 0.000000e+00}}
  %0 = moe.rope %x, %p head_dim = 32 <kind = linear, theta = 1.0e4, rotary_dim = 32, factor = 0.0> : tensor<?x64xbf16>, tensor<?xi32>
  return
}

// -----

func.func @rope_original_max_position(%x: tensor<?x64xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{expected original_max_position > 0 for dynamic scaling but got 0}}
  %0 = moe.rope %x, %p head_dim = 32 <kind = dynamic, theta = 1.0e4, rotary_dim = 32, factor = 2.0> : tensor<?x64xbf16>, tensor<?xi32>
  return
}

// -----

func.func @rope_llama3_freq_factors(%x: tensor<?x64xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{expected high_freq_factor > low_freq_factor but got 1.000000e+00 <= 4.000000e+00}}
  %0 = moe.rope %x, %p head_dim = 32 <kind = llama3, theta = 5.0e5, rotary_dim = 32, factor = 8.0, original_max_position = 8192, low_freq_factor = 4.0, high_freq_factor = 1.0> : tensor<?x64xbf16>, tensor<?xi32>
  return
}

// -----

func.func @rope_yarn_betas(%x: tensor<?x64xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{expected beta_fast > beta_slow but got 1.000000e+00 <= 3.200000e+01}}
  %0 = moe.rope %x, %p head_dim = 32 <kind = yarn, theta = 1.0e4, rotary_dim = 32, factor = 40.0, original_max_position = 4096, beta_fast = 1.0, beta_slow = 32.0> : tensor<?x64xbf16>, tensor<?xi32>
  return
}

//===----------------------------------------------------------------------===//
// #moe.routing (RoutingAttr::verify)
//===----------------------------------------------------------------------===//

// -----

func.func @routing_top_k(%x: tensor<?x64xbf16>, %g: tensor<8x64xbf16>) {
  // expected-error@+1 {{expected top_k > 0 but got 0}}
  %w, %e = moe.router %x, %g <scoring = softmax, top_k = 0, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x0xf32>, tensor<?x0xi32>
  return
}

// -----

func.func @routing_scaling_factor(%x: tensor<?x64xbf16>, %g: tensor<8x64xbf16>) {
  // expected-error@+1 {{expected scaling_factor > 0 but got -1.000000e+00}}
  %w, %e = moe.router %x, %g <scoring = softmax, top_k = 2, scaling_factor = -1.0, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

func.func @routing_groups(%x: tensor<?x64xbf16>, %g: tensor<8x64xbf16>) {
  // expected-error@+1 {{expected 0 < topk_groups <= num_groups but got 5 of 4}}
  %w, %e = moe.router %x, %g <scoring = sigmoid, top_k = 2, num_groups = 4, topk_groups = 5, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

func.func @routing_topk_on_logits(%x: tensor<?x64xbf16>, %g: tensor<8x64xbf16>) {
  // expected-error@+1 {{expected softmax scoring with topk_on = logits}}
  %w, %e = moe.router %x, %g <scoring = sigmoid, top_k = 2, topk_on = logits, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

func.func @routing_compute_type(%x: tensor<?x64xbf16>, %g: tensor<8x64xbf16>) {
  // expected-error@+1 {{expected a float compute_type but got 'i32'}}
  %w, %e = moe.router %x, %g <scoring = softmax, top_k = 2, compute_type = i32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

// Standalone attributes are verified where they are written too.
func.func @standalone_rope_attr() attributes {
  // expected-error@+1 {{expected an even rotary_dim > 0 but got 0}}
  test.rope = #moe.rope<kind = default, theta = 1.0e4, rotary_dim = 0>} {
  return
}

// -----

// Not a verifier: the custom parser of boolean parameters.
func.func @rope_interleaved_not_bool(%x: tensor<?x64xbf16>, %p: tensor<?xi32>) {
  // expected-error@+2 {{expected 'true' or 'false'}}
  // expected-error@+1 {{failed to parse MoE_RopeAttr parameter 'interleaved' which is to be a `bool`}}
  %0 = moe.rope %x, %p head_dim = 32 <kind = default, theta = 1.0e4, rotary_dim = 32, interleaved = 1> : tensor<?x64xbf16>, tensor<?xi32>
  return
}

// -----

func.func @router_dynamic_gate(%x: tensor<?x64xbf16>, %g: tensor<?x64xbf16>) {
  // expected-error@+1 {{'moe.router' op expected a static gate weight shape but got 'tensor<?x64xbf16>'}}
  %w, %e = moe.router %x, %g <scoring = softmax, top_k = 2, compute_type = f32> : tensor<?x64xbf16>, tensor<?x64xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

func.func @sigmoid_gate_dynamic_width(%x: tensor<?x64xbf16>, %g: tensor<?x?xbf16>) {
  // expected-error@+1 {{'moe.sigmoid_gate' op expected a [T, 1] gate but got width ?}}
  %0 = moe.sigmoid_gate %x, %g : tensor<?x64xbf16>, tensor<?x?xbf16>
  return
}

// -----

func.func @mla_dynamic_key_rope(%q: tensor<?x48xbf16>, %kv: tensor<?x80xbf16>, %kr: tensor<?x?xbf16>, %p: tensor<?xi32>) {
  // expected-error@+1 {{'moe.mla_attention' op expected a static key_rope width}}
  %0 = moe.mla_attention %q, %kv, %kr, %p heads = 4 scale = 0.25 <kind = default, theta = 1.0e4, rotary_dim = 8, interleaved = true> : tensor<?x48xbf16>, tensor<?x80xbf16>, tensor<?x?xbf16>, tensor<?xi32> -> tensor<?x48xbf16>
  return
}

// -----

//===----------------------------------------------------------------------===//
// Partitioned programs
//===----------------------------------------------------------------------===//

func.func @all_reduce_axis(%x: tensor<?x64xf32>) {
  // expected-error@+1 {{'moe.all_reduce' op expected a mesh axis in [0, 3] but got 7}}
  %r = moe.all_reduce %x over @mesh[7] : tensor<?x64xf32>
  return
}

// -----

func.func @all_gather_width(%x: tensor<?x64xf32>) {
  // expected-error@+1 {{'moe.all_gather' op expected a result width that is a multiple of the input's (64) but got 96}}
  %r = moe.all_gather %x over @mesh[2] : tensor<?x64xf32> -> tensor<?x96xf32>
  return
}

// -----

func.func @dispatch_capacity(%x: tensor<?x64xf32>, %e: tensor<?x2xi32>) {
  // expected-error@+1 {{'moe.dispatch' op expected a buffer of capacity 8 but got 'tensor<8x16x64xf32>'}}
  %b, %c, %s = moe.dispatch %x, %e capacity = 8 factor = 1.0 parts = 1 stride = 1 : tensor<?x64xf32>, tensor<?x2xi32> -> tensor<8x16x64xf32>, tensor<8xi32>, tensor<?x2xi32>
  return
}

// -----

func.func @dispatch_counts(%x: tensor<?x64xf32>, %e: tensor<?x2xi32>) {
  // expected-error@+1 {{'moe.dispatch' op expected one count per expert (8) but got 'tensor<4xi32>'}}
  %b, %c, %s = moe.dispatch %x, %e capacity = 16 factor = 1.0 parts = 1 stride = 1 : tensor<?x64xf32>, tensor<?x2xi32> -> tensor<8x16x64xf32>, tensor<4xi32>, tensor<?x2xi32>
  return
}

// -----

func.func @dispatch_width(%x: tensor<?x32xf32>, %e: tensor<?x2xi32>) {
  // expected-error@+1 {{'moe.dispatch' op expected buffer rows as wide as the input (32) but got 64}}
  %b, %c, %s = moe.dispatch %x, %e capacity = 16 factor = 1.0 parts = 1 stride = 1 : tensor<?x32xf32>, tensor<?x2xi32> -> tensor<8x16x64xf32>, tensor<8xi32>, tensor<?x2xi32>
  return
}

// -----

func.func @dispatch_factor(%x: tensor<?x64xf32>, %e: tensor<?x2xi32>) {
  // expected-error@+1 {{'moe.dispatch' op expected a capacity factor >= 0 (0: dropless)}}
  %b, %c, %s = moe.dispatch %x, %e capacity = 16 factor = -1.0 parts = 1 stride = 1 : tensor<?x64xf32>, tensor<?x2xi32> -> tensor<8x16x64xf32>, tensor<8xi32>, tensor<?x2xi32>
  return
}

// -----

func.func @dispatch_parts(%x: tensor<?x64xf32>, %e: tensor<?x2xi32>) {
  // expected-error@+1 {{'moe.dispatch' op expected row parts and stride >= 1}}
  %b, %c, %s = moe.dispatch %x, %e capacity = 16 factor = 1.0 parts = 0 stride = 1 : tensor<?x64xf32>, tensor<?x2xi32> -> tensor<8x16x64xf32>, tensor<8xi32>, tensor<?x2xi32>
  return
}

// -----

func.func @all_to_all_counts(%b: tensor<8x16x64xf32>, %c: tensor<4xi32>) {
  // expected-error@+1 {{'moe.all_to_all' op expected one count per expert}}
  %rb, %rc = moe.all_to_all %b, %c over @experts[2] : tensor<8x16x64xf32>, tensor<4xi32>
  return
}

// -----

func.func @expert_ffn_local(%b: tensor<8x16x64xf32>, %c: tensor<8xi32>, %w1: tensor<3x32x64xf32>, %w2: tensor<3x64x32xf32>) {
  // expected-error@+1 {{'moe.expert_ffn' op expected the buffer's experts (8) to be a multiple of the local experts (3)}}
  %y = moe.expert_ffn silu %b, %c, %w1, %w1, %w2 : tensor<8x16x64xf32>, tensor<8xi32>, tensor<3x32x64xf32>, tensor<3x32x64xf32>, tensor<3x64x32xf32>
  return
}

// -----

func.func @expert_ffn_width(%b: tensor<8x16x64xf32>, %c: tensor<8xi32>, %w1: tensor<4x32x48xf32>, %w2: tensor<4x48x32xf32>) {
  // expected-error@+1 {{'moe.expert_ffn' op expected gate/up weights [32, 64] but got [32, 48]}}
  %y = moe.expert_ffn silu %b, %c, %w1, %w1, %w2 : tensor<8x16x64xf32>, tensor<8xi32>, tensor<4x32x48xf32>, tensor<4x32x48xf32>, tensor<4x48x32xf32>
  return
}

// -----

func.func @combine_shapes(%y: tensor<8x16x64xf32>, %s: tensor<?x2xi32>, %w: tensor<?x1xf32>) {
  // expected-error@+1 {{'moe.combine' op expected slots and weights of the same shape}}
  %o = moe.combine %y, %s, %w : tensor<8x16x64xf32>, tensor<?x2xi32>, tensor<?x1xf32> -> tensor<?x64xf32>
  return
}

// -----

func.func @combine_width(%y: tensor<8x16x64xf32>, %s: tensor<?x2xi32>, %w: tensor<?x2xf32>) {
  // expected-error@+1 {{'moe.combine' op expected a result as wide as the expert outputs}}
  %o = moe.combine %y, %s, %w : tensor<8x16x64xf32>, tensor<?x2xi32>, tensor<?x2xf32> -> tensor<?x32xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// The training loss: moe.cross_entropy, moe.router_stats, moe.lm_loss
//===----------------------------------------------------------------------===//

func.func @ce_dynamic_vocab(%l: tensor<?x?xf32>, %y: tensor<?xi32>) {
  // expected-error@+1 {{'moe.cross_entropy' op expected a static logits width}}
  %ce = moe.cross_entropy %l, %y vocab = 8 : tensor<?x?xf32>, tensor<?xi32> -> tensor<2xf32>
  return
}

// -----

func.func @ce_vocab_too_wide(%l: tensor<?x8xf32>, %y: tensor<?xi32>) {
  // expected-error@+1 {{'moe.cross_entropy' op expected 1 <= vocab <= 8 (the logits' width) but got 9}}
  %ce = moe.cross_entropy %l, %y vocab = 9 : tensor<?x8xf32>, tensor<?xi32> -> tensor<2xf32>
  return
}

// -----

func.func @ce_labels(%l: tensor<4x8xf32>, %y: tensor<3xi32>) {
  // expected-error@+1 {{'moe.cross_entropy' op expected one label per logits row (4) but got 3}}
  %ce = moe.cross_entropy %l, %y vocab = 8 : tensor<4x8xf32>, tensor<3xi32> -> tensor<2xf32>
  return
}

// -----

func.func @ce_result(%l: tensor<?x8xf32>, %y: tensor<?xi32>) {
  // expected-error@+1 {{'moe.cross_entropy' op expected a tensor<2xf32> result (sum, rows) but got 'tensor<3xf32>'}}
  %ce = moe.cross_entropy %l, %y vocab = 8 : tensor<?x8xf32>, tensor<?xi32> -> tensor<3xf32>
  return
}

// -----

func.func @stats_experts(%g: tensor<?x1xf32>) {
  // expected-error@+1 {{'moe.router_stats' op expected a static number of experts >= 2 but got 'tensor<?x1xf32>'}}
  %s = moe.router_stats %g top_k = 1 : tensor<?x1xf32> -> tensor<3x1xf32>
  return
}

// -----

func.func @stats_top_k(%g: tensor<?x8xf32>) {
  // expected-error@+1 {{'moe.router_stats' op expected 1 <= top_k <= 8 but got 9}}
  %s = moe.router_stats %g top_k = 9 : tensor<?x8xf32> -> tensor<3x8xf32>
  return
}

// -----

func.func @stats_result(%g: tensor<?x8xf32>) {
  // expected-error@+1 {{'moe.router_stats' op expected a tensor<3x8xf32> result but got 'tensor<3x4xf32>'}}
  %s = moe.router_stats %g top_k = 2 : tensor<?x8xf32> -> tensor<3x4xf32>
  return
}

// -----

func.func @stats_sequences(%g: tensor<?x8xf32>) {
  // expected-error@+1 {{'moe.router_stats' op expected a tensor<7x8xf32> result but got 'tensor<3x8xf32>'}}
  %s = moe.router_stats %g top_k = 2 {sequences = 2 : i64} : tensor<?x8xf32> -> tensor<3x8xf32>
  return
}

// -----

func.func @loss_ce(%ce: tensor<3xf32>) {
  // expected-error@+1 {{'moe.lm_loss' op expected the cross-entropy as tensor<2xf32> but got 'tensor<3xf32>'}}
  %l = moe.lm_loss %ce aux_coef = 0.0 z_coef = 0.0 : tensor<3xf32> -> tensor<4xf32>
  return
}

// -----

func.func @loss_stats_differ(%ce: tensor<2xf32>, %a: tensor<3x8xf32>, %b: tensor<3x4xf32>) {
  // expected-error@+1 {{'moe.lm_loss' op expected every layer's router statistics as 'tensor<3x8xf32>' but got 'tensor<3x4xf32>'}}
  %l = moe.lm_loss %ce, %a, %b aux_coef = 0.0 z_coef = 0.0 : tensor<2xf32>, tensor<3x8xf32>, tensor<3x4xf32> -> tensor<4xf32>
  return
}

// -----

func.func @loss_stats_rows(%ce: tensor<2xf32>, %a: tensor<2x8xf32>) {
  // expected-error@+1 {{'moe.lm_loss' op expected router statistics of 3 rows (or 3 + 2 per sequence) but got 'tensor<2x8xf32>'}}
  %l = moe.lm_loss %ce, %a aux_coef = 0.0 z_coef = 0.0 : tensor<2xf32>, tensor<2x8xf32> -> tensor<4xf32>
  return
}

// -----

func.func @loss_coef(%ce: tensor<2xf32>) {
  // expected-error@+1 {{'moe.lm_loss' op expected coefficients >= 0}}
  %l = moe.lm_loss %ce aux_coef = -1.0 z_coef = 0.0 : tensor<2xf32> -> tensor<4xf32>
  return
}

// -----

func.func @loss_result(%ce: tensor<2xf32>) {
  // expected-error@+1 {{'moe.lm_loss' op expected a tensor<4xf32> result (loss, ce, aux, z) but got 'tensor<2xf32>'}}
  %l = moe.lm_loss %ce aux_coef = 0.0 z_coef = 0.0 : tensor<2xf32> -> tensor<2xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// The backward pass's ops
//===----------------------------------------------------------------------===//

func.func @ce_grad_shape(%l: tensor<?x8xf32>, %y: tensor<?xi32>, %ce: tensor<2xf32>) {
  // expected-error@+1 {{'moe.cross_entropy_grad' op expected an f32 result of the logits' shape}}
  %d = moe.cross_entropy_grad %l, %y, %ce vocab = 8 : tensor<?x8xf32>, tensor<?xi32>, tensor<2xf32> -> tensor<?x4xf32>
  return
}

// -----

func.func @ce_grad_ce(%l: tensor<?x8xf32>, %y: tensor<?xi32>, %ce: tensor<3xf32>) {
  // expected-error@+1 {{'moe.cross_entropy_grad' op expected the cross-entropy as tensor<2xf32>}}
  %d = moe.cross_entropy_grad %l, %y, %ce vocab = 8 : tensor<?x8xf32>, tensor<?xi32>, tensor<3xf32> -> tensor<?x8xf32>
  return
}

// -----

func.func @linear_grad_operands(%dy: tensor<?x8xf32>, %x: tensor<?x4xf32>, %w: tensor<6x4xf32>) {
  // expected-error@+1 {{'moe.linear_grad' op expected dy [T, out], x [T, in] and the weight [out, in]}}
  %dx, %dw = moe.linear_grad %dy, %x, %w : tensor<?x8xf32>, tensor<?x4xf32>, tensor<6x4xf32> -> tensor<?x4xf32>, tensor<6x4xf32>
  return
}

// -----

func.func @linear_grad_results(%dy: tensor<?x6xf32>, %x: tensor<?x4xf32>, %w: tensor<6x4xf32>) {
  // expected-error@+1 {{'moe.linear_grad' op expected the gradients in the shapes of the input and the weight}}
  %dx, %dw = moe.linear_grad %dy, %x, %w : tensor<?x6xf32>, tensor<?x4xf32>, tensor<6x4xf32> -> tensor<?x4xf32>, tensor<4x6xf32>
  return
}

// -----

func.func @rms_norm_grad(%dy: tensor<?x8xf32>, %x: tensor<?x8xf32>, %w: tensor<8xf32>) {
  // expected-error@+1 {{'moe.rms_norm_grad' op expected dy and dx of the input's type and dw of the weight's shape}}
  %dx, %dw = moe.rms_norm_grad %dy, %x, %w eps = 1.0e-05 : tensor<?x8xf32>, tensor<?x8xf32>, tensor<8xf32> -> tensor<?x8xf32>, tensor<4xf32>
  return
}

// -----

func.func @rms_norm_grad_row_stats(%dy: tensor<?x8xf32>, %x: tensor<?x8xf32>, %w: tensor<8xf32>, %s: tensor<?x3xf32>) {
  // expected-error@+1 {{'moe.rms_norm_grad' op expected row_stats of [T, 2] f32 but got 'tensor<?x3xf32>'}}
  %dx, %dw = moe.rms_norm_grad %dy, %x, %w row_stats(%s : tensor<?x3xf32>) eps = 1.0e-05 {row_width = 16 : i64} : tensor<?x8xf32>, tensor<?x8xf32>, tensor<8xf32> -> tensor<?x8xf32>, tensor<8xf32>
  return
}

// -----

func.func @rms_norm_grad_row_width(%dy: tensor<?x8xf32>, %x: tensor<?x8xf32>, %w: tensor<8xf32>, %s: tensor<?x2xf32>) {
  // expected-error@+1 {{'moe.rms_norm_grad' op with row_stats, expected row_width: a multiple of the input width}}
  %dx, %dw = moe.rms_norm_grad %dy, %x, %w row_stats(%s : tensor<?x2xf32>) eps = 1.0e-05 {row_width = 12 : i64} : tensor<?x8xf32>, tensor<?x8xf32>, tensor<8xf32> -> tensor<?x8xf32>, tensor<8xf32>
  return
}

// -----

func.func @rms_norm_grad_stats_result(%dy: tensor<?x8xf32>, %x: tensor<?x8xf32>, %w: tensor<8xf32>) {
  // expected-error@+1 {{'moe.rms_norm_grad_stats' op expected a result of [T, 2] f32 but got 'tensor<?x1xf32>'}}
  %s = moe.rms_norm_grad_stats %dy, %x, %w : tensor<?x8xf32>, tensor<?x8xf32>, tensor<8xf32> -> tensor<?x1xf32>
  return
}

// -----

func.func @attention_grad_types(%do: tensor<?x8xf32>, %q: tensor<?x8xf32>, %k: tensor<?x4xf32>) {
  // expected-error@+1 {{'moe.attention_grad' op expected the gradients in the types of query, key and value}}
  %dq, %dk, %dv = moe.attention_grad %do, %q, %k, %k heads = 2 kv_heads = 1 scale = 0.5 : tensor<?x8xf32>, tensor<?x8xf32>, tensor<?x4xf32>, tensor<?x4xf32> -> tensor<?x8xf32>, tensor<?x8xf32>, tensor<?x4xf32>
  return
}

// -----

func.func @attention_grad_heads(%do: tensor<?x8xf32>, %q: tensor<?x8xf32>, %k: tensor<?x4xf32>) {
  // expected-error@+1 {{'moe.attention_grad' op expected kv_heads to divide heads}}
  %dq, %dk, %dv = moe.attention_grad %do, %q, %k, %k heads = 2 kv_heads = 3 scale = 0.5 : tensor<?x8xf32>, tensor<?x8xf32>, tensor<?x4xf32>, tensor<?x4xf32> -> tensor<?x8xf32>, tensor<?x4xf32>, tensor<?x4xf32>
  return
}

// -----

func.func @mlp_grad(%dy: tensor<?x4xf32>, %x: tensor<?x4xf32>, %g: tensor<6x4xf32>, %d: tensor<4x6xf32>) {
  // expected-error@+1 {{'moe.mlp_grad' op expected the gradients in the shapes of the input and the weights}}
  %dx, %dg, %du, %dd = moe.mlp_grad silu %dy, %x, %g, %g, %d : tensor<?x4xf32>, tensor<?x4xf32>, tensor<6x4xf32>, tensor<6x4xf32>, tensor<4x6xf32> -> tensor<?x4xf32>, tensor<6x4xf32>, tensor<6x4xf32>, tensor<6x4xf32>
  return
}

// -----

func.func @embedding_grad(%dy: tensor<?x4xf32>, %ids: tensor<?xi32>) {
  // expected-error@+1 {{'moe.embedding_grad' op expected dy [T, H], T ids and a static [V, H] result}}
  %dt = moe.embedding_grad %dy[%ids] : tensor<?x4xf32>, tensor<?xi32> -> tensor<10x8xf32>
  return
}

// -----

func.func @route_grad(%dw: tensor<?x3xf32>, %l: tensor<?x8xf32>, %e: tensor<?x3xi32>) {
  // expected-error@+1 {{'moe.route_grad' op expected dw and the experts [T, top_k] and a result of the logits' shape}}
  %d = moe.route_grad %dw, %l, %e <scoring = softmax, top_k = 2, compute_type = f32> : tensor<?x3xf32>, tensor<?x8xf32>, tensor<?x3xi32> -> tensor<?x8xf32>
  return
}

// -----

func.func @experts_grad(%x: tensor<?x4xf32>, %w: tensor<?x2xf32>, %e: tensor<?x2xi32>, %s: tensor<8x6x4xf32>, %d: tensor<8x4x6xf32>) {
  // expected-error@+1 {{'moe.experts_grad' op expected the gradients in the shapes of the input, the routing weights and the expert stacks}}
  %dx, %dw, %d1, %d3, %d2 = moe.experts_grad silu %x, %x, %w, %e, %s, %s, %d : tensor<?x4xf32>, tensor<?x4xf32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x6x4xf32>, tensor<8x6x4xf32>, tensor<8x4x6xf32> -> tensor<?x4xf32>, tensor<?x2xf32>, tensor<8x6x4xf32>, tensor<8x6x4xf32>, tensor<8x6x4xf32>
  return
}

// -----

func.func @experts_saved(%x: tensor<?x4xf32>, %w: tensor<?x2xf32>, %e: tensor<?x2xi32>, %s: tensor<8x6x4xf32>, %d: tensor<8x4x6xf32>) {
  // expected-error@+1 {{'moe.experts_saved' op expected saved activations [?, 12], [same], [?, 8] (k blocks of the gate/up products and of the outputs per token) but got 'tensor<?x6xf32>'}}
  %y, %g, %u, %o = moe.experts_saved silu %x, %w, %e, %s, %s, %d : tensor<?x4xf32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x6x4xf32>, tensor<8x6x4xf32>, tensor<8x4x6xf32> -> tensor<?x4xf32>, tensor<?x12xf32>, tensor<?x6xf32>, tensor<?x8xf32>
  return
}

// -----

func.func @experts_grad_saved(%x: tensor<?x4xf32>, %w: tensor<?x2xf32>, %e: tensor<?x2xi32>, %s: tensor<8x6x4xf32>, %d: tensor<8x4x6xf32>, %g: tensor<?x12xf32>) {
  // expected-error@+1 {{'moe.experts_grad' op expected no saved activations or three (gate, up, output) but got 2}}
  %dx, %dw, %d1, %d3, %d2 = moe.experts_grad silu %x, %x, %w, %e, %s, %s, %d saved(%g, %g : tensor<?x12xf32>, tensor<?x12xf32>) : tensor<?x4xf32>, tensor<?x4xf32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x6x4xf32>, tensor<8x6x4xf32>, tensor<8x4x6xf32> -> tensor<?x4xf32>, tensor<?x2xf32>, tensor<8x6x4xf32>, tensor<8x6x4xf32>, tensor<8x4x6xf32>
  return
}

// -----

func.func @bias_grad(%dy: tensor<?x4xf32>) {
  // expected-error@+1 {{'moe.bias_grad' op expected a result as long as dy's rows are wide}}
  %db = moe.bias_grad %dy : tensor<?x4xf32> -> tensor<5xf32>
  return
}
