// RUN: moec import %fixtures/models/mixtral/config.json | moe-opt --moe-plan-sharding="dp=2 tp=2 ep=4" | FileCheck %s
// RUN: moec import %fixtures/models/mixtral/config.json | not moe-opt --moe-plan-sharding="dp=2 tp=2 ep=3" 2>&1 | FileCheck %s --check-prefix=BAD

// The two meshes of parallel folding over the same 4 ranks, and a mesh.shard
// after every weight.
// CHECK: module attributes {{{.*}}moe.sharding = {dp = 2 : i64, ep = 4 : i64, etp = 1 : i64, pp = 1 : i64, stage_begin = array<i64: 0>, tp = 2 : i64, vocab_pad_to = 64 : i64, vocab_padded = 256 : i64}
// CHECK: mesh.mesh @mesh(shape = 1x2x2)
// CHECK: mesh.mesh @experts(shape = 1x1x4x1)
// Vocabulary-parallel embedding, replicated norm, column- and row-parallel projections.
// CHECK: %[[EMB:.+]] = moe.weight "model.embed_tokens.weight"
// CHECK-NEXT: mesh.shard %[[EMB]] to <@mesh, {{\[\[}}2]]> : tensor<251x64xf32>
// CHECK: %[[LN:.+]] = moe.weight "model.layers.0.input_layernorm.weight"
// CHECK-NEXT: mesh.shard %[[LN]] to <@mesh, {{\[\[}}]]> : tensor<64xf32>
// CHECK: %[[Q:.+]] = moe.weight "model.layers.0.self_attn.q_proj.weight"
// CHECK-NEXT: %[[QS:.+]] = mesh.shard %[[Q]] to <@mesh, {{\[\[}}2]]> : tensor<64x64xf32>
// CHECK-NEXT: %q_proj = moe.linear %{{.+}}, %[[QS]]
// CHECK: %[[O:.+]] = moe.weight "model.layers.0.self_attn.o_proj.weight"
// CHECK-NEXT: mesh.shard %[[O]] to <@mesh, {{\[\[}}], [2]]> : tensor<64x64xf32>
// The router is replicated; expert stacks split over EP (and ETP on the intermediate dim).
// CHECK: %[[G:.+]] = moe.weight "model.layers.0.block_sparse_moe.gate.weight"
// CHECK-NEXT: mesh.shard %[[G]] to <@mesh, {{\[\[}}]]>
// CHECK: %[[W1:.+]] = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w1.weight"
// CHECK-NEXT: mesh.shard %[[W1]] to <@experts, {{\[\[}}2], [3], []]> : tensor<8x48x64xf32>
// CHECK: %[[W2:.+]] = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w2.weight"
// CHECK-NEXT: mesh.shard %[[W2]] to <@experts, {{\[\[}}2], [], [3]]> : tensor<8x64x48xf32>
// CHECK: %[[HEAD:.+]] = moe.weight "lm_head.weight"
// CHECK-NEXT: mesh.shard %[[HEAD]] to <@mesh, {{\[\[}}2]]>

// BAD: error: --ep 3: expected a divisor of num_local_experts (8)
