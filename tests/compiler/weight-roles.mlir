// RUN: sed 's|@FIXTURES@|%fixtures|' %s | moe-opt --moe-plan-sharding="tp=2 ep=2 etp=2 dp=2" | FileCheck %s

// moe-plan-sharding splits each weight as its role says (WeightOpInterface),
// whatever its name: here the roles of q_proj and o_proj are swapped, the
// final norm is given no role (replicated) and the w2 stack no etp_dim
// (dim 0 of each expert, its output rows).
// CHECK-LABEL: func.func @forward
// CHECK:       %[[Q:.+]] = moe.weight "model.layers.0.self_attn.q_proj.weight" as row layer 0
// CHECK-NEXT:  mesh.shard %[[Q]] to <@mesh, {{\[\[}}], [2]]> : tensor<64x64xf32>
// CHECK:       %[[O:.+]] = moe.weight "model.layers.0.self_attn.o_proj.weight" as column layer 0
// CHECK-NEXT:  mesh.shard %[[O]] to <@mesh, {{\[\[}}2]]> : tensor<64x64xf32>
// CHECK:       %[[N:.+]] = moe.weight "model.norm.weight" :
// CHECK-NEXT:  mesh.shard %[[N]] to <@mesh, {{\[\[}}]]> : tensor<64xf32>
// CHECK:       %[[W2:.+]] = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w2.weight" layer 0
// CHECK-NEXT:  mesh.shard %[[W2]] to <@experts, {{\[\[}}2], [3], []]> : tensor<8x64x48xf32>
// CHECK:       %[[E:.+]] = moe.weight "model.embed_tokens.weight" as embedding
// CHECK-NEXT:  mesh.shard %[[E]] to <@mesh, {{\[\[}}2]]> : tensor<251x64xf32>
module attributes {moe.source = "@FIXTURES@/models/mixtral/config.json"} {
  func.func @forward() -> (tensor<64x64xf32>, tensor<64x64xf32>, tensor<64xf32>, tensor<8x64x48xf32>, tensor<251x64xf32>) {
    %q = moe.weight "model.layers.0.self_attn.q_proj.weight" as row layer 0 : tensor<64x64xf32>
    %o = moe.weight "model.layers.0.self_attn.o_proj.weight" as column layer 0 : tensor<64x64xf32>
    %n = moe.weight "model.norm.weight" : tensor<64xf32>
    %w2 = moe.expert_weight "model.layers.0.block_sparse_moe.experts.{e}.w2.weight" layer 0 : tensor<8x64x48xf32>
    %e = moe.weight "model.embed_tokens.weight" as embedding : tensor<251x64xf32>
    return %q, %o, %n, %w2, %e : tensor<64x64xf32>, tensor<64x64xf32>, tensor<64xf32>, tensor<8x64x48xf32>, tensor<251x64xf32>
  }
}
