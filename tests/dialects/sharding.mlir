// RUN: moe-opt %s | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | moe-opt | FileCheck %s

// Sharding of moe values is written with upstream MLIR 19's `mesh` dialect
// (docs/sharding.md): a `mesh.mesh` names the device mesh and `mesh.shard`
// gives, per tensor dimension, the mesh axes that dimension is split over.
// Here @mesh is 2 x 4: axis 0 is data parallel, axis 1 tensor / expert
// parallel.

// CHECK: mesh.mesh @mesh(shape = 2x4)
mesh.mesh @mesh(shape = 2x4)

// Attention with column-parallel q/k/v projections (weight [out, in] split
// on dim 0 over axis 1) and a row-parallel output projection (split on
// dim 1), whose result is a partial sum over axis 1.
// CHECK-LABEL: func.func @attention_tensor_parallel
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<?x64xbf16>, %[[P:[^:]+]]: tensor<?xi32>)
// CHECK:         %[[NW:.+]] = moe.weight "model.layers.0.input_layernorm.weight" : tensor<64xbf16>
// CHECK:         %[[NW_S:.+]] = mesh.shard %[[NW]] to <@mesh, {{\[\[}}]]> : tensor<64xbf16>
// CHECK:         %[[N:.+]] = moe.rms_norm %[[X]], %[[NW_S]] eps = 1.000000e-05 : tensor<?x64xbf16>, tensor<64xbf16>
// CHECK:         %[[N_S:.+]] = mesh.shard %[[N]] to <@mesh, {{\[\[}}]]> annotate_for_users : tensor<?x64xbf16>
// CHECK:         %[[QW:.+]] = moe.weight "model.layers.0.self_attn.q_proj.weight" : tensor<64x64xbf16>
// CHECK:         %[[QW_S:.+]] = mesh.shard %[[QW]] to <@mesh, {{\[\[}}1]]> : tensor<64x64xbf16>
// CHECK:         %[[KW:.+]] = moe.weight "model.layers.0.self_attn.k_proj.weight" : tensor<32x64xbf16>
// CHECK:         %[[KW_S:.+]] = mesh.shard %[[KW]] to <@mesh, {{\[\[}}1]]> : tensor<32x64xbf16>
// CHECK:         %[[VW:.+]] = moe.weight "model.layers.0.self_attn.v_proj.weight" : tensor<32x64xbf16>
// CHECK:         %[[VW_S:.+]] = mesh.shard %[[VW]] to <@mesh, {{\[\[}}1]]> : tensor<32x64xbf16>
// CHECK:         %[[Q:.+]] = moe.linear %[[N_S]], %[[QW_S]] : tensor<?x64xbf16>, tensor<64x64xbf16> -> tensor<?x64xbf16>
// CHECK:         %[[Q_S:.+]] = mesh.shard %[[Q]] to <@mesh, {{\[\[}}], [1]]> : tensor<?x64xbf16>
// CHECK:         %[[K:.+]] = moe.linear %[[N_S]], %[[KW_S]] : tensor<?x64xbf16>, tensor<32x64xbf16> -> tensor<?x32xbf16>
// CHECK:         %[[V:.+]] = moe.linear %[[N_S]], %[[VW_S]] : tensor<?x64xbf16>, tensor<32x64xbf16> -> tensor<?x32xbf16>
// CHECK:         %[[QR:.+]] = moe.rope %[[Q_S]], %[[P]] head_dim = 16 <kind = default, theta = 1.000000e+04, rotary_dim = 16> : tensor<?x64xbf16>, tensor<?xi32>
// CHECK:         %[[KR:.+]] = moe.rope %[[K]], %[[P]] head_dim = 16 <kind = default, theta = 1.000000e+04, rotary_dim = 16> : tensor<?x32xbf16>, tensor<?xi32>
// CHECK:         %[[A:.+]] = moe.attention %[[QR]], %[[KR]], %[[V]] heads = 4 kv_heads = 2 scale = 2.500000e-01 : tensor<?x64xbf16>, tensor<?x32xbf16>, tensor<?x32xbf16> -> tensor<?x64xbf16>
// CHECK:         %[[OW:.+]] = moe.weight "model.layers.0.self_attn.o_proj.weight" : tensor<64x64xbf16>
// CHECK:         %[[OW_S:.+]] = mesh.shard %[[OW]] to <@mesh, {{\[\[}}], [1]]> : tensor<64x64xbf16>
// CHECK:         %[[A_S:.+]] = mesh.shard %[[A]] to <@mesh, {{\[\[}}], [1]]> annotate_for_users : tensor<?x64xbf16>
// CHECK:         %[[O:.+]] = moe.linear %[[A_S]], %[[OW_S]] : tensor<?x64xbf16>, tensor<64x64xbf16> -> tensor<?x64xbf16>
// CHECK:         %[[O_S:.+]] = mesh.shard %[[O]] to <@mesh, {{\[\[}}]], partial = sum[1]> : tensor<?x64xbf16>
// CHECK:         %[[R:.+]] = moe.add %[[X]], %[[O_S]] : tensor<?x64xbf16>
// CHECK:         return %[[R]]
func.func @attention_tensor_parallel(%x: tensor<?x64xbf16>, %positions: tensor<?xi32>) -> tensor<?x64xbf16> {
  // Replicated: every rank holds the whole norm weight and normalised input.
  %norm_w = moe.weight "model.layers.0.input_layernorm.weight" : tensor<64xbf16>
  %norm_w_s = mesh.shard %norm_w to <@mesh, [[]]> : tensor<64xbf16>
  %norm = moe.rms_norm %x, %norm_w_s eps = 1.0e-05 : tensor<?x64xbf16>, tensor<64xbf16>
  %norm_s = mesh.shard %norm to <@mesh, [[]]> annotate_for_users : tensor<?x64xbf16>
  // Column parallel: [out, in] weights split on dim 0 over axis 1.
  %q_w = moe.weight "model.layers.0.self_attn.q_proj.weight" : tensor<64x64xbf16>
  %q_w_s = mesh.shard %q_w to <@mesh, [[1]]> : tensor<64x64xbf16>
  %k_w = moe.weight "model.layers.0.self_attn.k_proj.weight" : tensor<32x64xbf16>
  %k_w_s = mesh.shard %k_w to <@mesh, [[1]]> : tensor<32x64xbf16>
  %v_w = moe.weight "model.layers.0.self_attn.v_proj.weight" : tensor<32x64xbf16>
  %v_w_s = mesh.shard %v_w to <@mesh, [[1]]> : tensor<32x64xbf16>
  %q = moe.linear %norm_s, %q_w_s : tensor<?x64xbf16>, tensor<64x64xbf16> -> tensor<?x64xbf16>
  // Heads split over axis 1: the activation's dim 1.
  %q_s = mesh.shard %q to <@mesh, [[], [1]]> : tensor<?x64xbf16>
  %k = moe.linear %norm_s, %k_w_s : tensor<?x64xbf16>, tensor<32x64xbf16> -> tensor<?x32xbf16>
  %v = moe.linear %norm_s, %v_w_s : tensor<?x64xbf16>, tensor<32x64xbf16> -> tensor<?x32xbf16>
  %q_rot = moe.rope %q_s, %positions head_dim = 16 <kind = default, theta = 1.0e4, rotary_dim = 16> : tensor<?x64xbf16>, tensor<?xi32>
  %k_rot = moe.rope %k, %positions head_dim = 16 <kind = default, theta = 1.0e4, rotary_dim = 16> : tensor<?x32xbf16>, tensor<?xi32>
  %attn = moe.attention %q_rot, %k_rot, %v heads = 4 kv_heads = 2 scale = 0.25 : tensor<?x64xbf16>, tensor<?x32xbf16>, tensor<?x32xbf16> -> tensor<?x64xbf16>
  // Row parallel: [out, in] weight split on dim 1 over axis 1; its input is
  // split the same way for its users, its result is a partial sum.
  %o_w = moe.weight "model.layers.0.self_attn.o_proj.weight" : tensor<64x64xbf16>
  %o_w_s = mesh.shard %o_w to <@mesh, [[], [1]]> : tensor<64x64xbf16>
  %attn_s = mesh.shard %attn to <@mesh, [[], [1]]> annotate_for_users : tensor<?x64xbf16>
  %o = moe.linear %attn_s, %o_w_s : tensor<?x64xbf16>, tensor<64x64xbf16> -> tensor<?x64xbf16>
  %o_s = mesh.shard %o to <@mesh, [[]], partial = sum[1]> : tensor<?x64xbf16>
  %h = moe.add %x, %o_s : tensor<?x64xbf16>
  return %h : tensor<?x64xbf16>
}

// Expert parallelism: the expert stacks are split on dim 0 (the experts)
// over axis 1; the router is replicated; the tokens are split over the data
// parallel axis 0.
// CHECK-LABEL: func.func @experts_expert_parallel
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<?x64xbf16>)
// CHECK:         %[[X_S:.+]] = mesh.shard %[[X]] to <@mesh, {{\[\[}}0]]> : tensor<?x64xbf16>
// CHECK:         %[[G:.+]] = moe.weight "model.layers.0.block_sparse_moe.gate.weight" : tensor<8x64xbf16>
// CHECK:         %[[G_S:.+]] = mesh.shard %[[G]] to <@mesh, {{\[\[}}]]> : tensor<8x64xbf16>
// CHECK:         %[[W:.+]], %[[E:.+]] = moe.router %[[X_S]], %[[G_S]] <scoring = softmax, top_k = 2, normalize = true, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
// CHECK:         %[[W1:.+]] = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w1.weight" : tensor<8x128x64xbf16>
// CHECK:         %[[W1_S:.+]] = mesh.shard %[[W1]] to <@mesh, {{\[\[}}1]]> : tensor<8x128x64xbf16>
// CHECK:         %[[W3:.+]] = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w3.weight" : tensor<8x128x64xbf16>
// CHECK:         %[[W3_S:.+]] = mesh.shard %[[W3]] to <@mesh, {{\[\[}}1]]> : tensor<8x128x64xbf16>
// CHECK:         %[[W2:.+]] = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w2.weight" : tensor<8x64x128xbf16>
// CHECK:         %[[W2_S:.+]] = mesh.shard %[[W2]] to <@mesh, {{\[\[}}1]]> : tensor<8x64x128xbf16>
// CHECK:         %[[Y:.+]] = moe.experts silu %[[X_S]], %[[W]], %[[E]], %[[W1_S]], %[[W3_S]], %[[W2_S]] : tensor<?x64xbf16>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x128x64xbf16>, tensor<8x128x64xbf16>, tensor<8x64x128xbf16>
// CHECK:         %[[Y_S:.+]] = mesh.shard %[[Y]] to <@mesh, {{\[\[}}0]]> : tensor<?x64xbf16>
// CHECK:         return %[[Y_S]]
func.func @experts_expert_parallel(%x: tensor<?x64xbf16>) -> tensor<?x64xbf16> {
  %x_s = mesh.shard %x to <@mesh, [[0]]> : tensor<?x64xbf16>
  %gate = moe.weight "model.layers.0.block_sparse_moe.gate.weight" : tensor<8x64xbf16>
  %gate_s = mesh.shard %gate to <@mesh, [[]]> : tensor<8x64xbf16>
  %weights, %experts = moe.router %x_s, %gate_s <scoring = softmax, top_k = 2, normalize = true, compute_type = f32> : tensor<?x64xbf16>, tensor<8x64xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>
  %w1 = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w1.weight" : tensor<8x128x64xbf16>
  %w1_s = mesh.shard %w1 to <@mesh, [[1]]> : tensor<8x128x64xbf16>
  %w3 = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w3.weight" : tensor<8x128x64xbf16>
  %w3_s = mesh.shard %w3 to <@mesh, [[1]]> : tensor<8x128x64xbf16>
  %w2 = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w2.weight" : tensor<8x64x128xbf16>
  %w2_s = mesh.shard %w2 to <@mesh, [[1]]> : tensor<8x64x128xbf16>
  %y = moe.experts silu %x_s, %weights, %experts, %w1_s, %w3_s, %w2_s : tensor<?x64xbf16>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x128x64xbf16>, tensor<8x128x64xbf16>, tensor<8x64x128xbf16>
  %y_s = mesh.shard %y to <@mesh, [[0]]> : tensor<?x64xbf16>
  return %y_s : tensor<?x64xbf16>
}
