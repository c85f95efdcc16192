// RUN: moe-opt --moe-insert-collectives --split-input-file -verify-diagnostics %s | FileCheck %s

// moe-partition marks a partial sum that a user needs whole with a pair of
// annotations; each pair becomes an all_reduce over the partial axes, at the
// user's annotation. A weight's own annotation (one mesh.shard) is left alone.
// CHECK-LABEL: func.func @stage0
// CHECK: %[[W:.+]] = moe.weight "o"
// CHECK-NEXT: %[[WS:.+]] = mesh.shard %[[W]] to <@mesh, {{\[\[}}], [2]]> : tensor<64x32xf32>
// CHECK-NEXT: %[[P:.+]] = moe.linear %{{.+}}, %[[WS]]
// CHECK-NEXT: %[[R:.+]] = moe.all_reduce %[[P]] over @mesh[2] : tensor<?x64xf32>
// CHECK-NEXT: %[[A:.+]] = moe.add %[[R]], %[[R]]
// CHECK-NEXT: %[[TWO:.+]] = moe.all_reduce %[[A]] over @mesh[1] : tensor<?x64xf32>
// CHECK-NEXT: %[[TWO2:.+]] = moe.all_reduce %[[TWO]] over @mesh[2] : tensor<?x64xf32>
// CHECK-NEXT: return %[[TWO2]]
// CHECK-NOT: mesh.shard
module {
  mesh.mesh @mesh(shape = 1x2x2)
  func.func @stage0(%x: tensor<?x32xf32>) -> tensor<?x64xf32> attributes {moe.stage = 0 : i64} {
    %w = moe.weight "o" : tensor<64x32xf32>
    %ws = mesh.shard %w to <@mesh, [[], [2]]> : tensor<64x32xf32>
    %p = moe.linear %x, %ws : tensor<?x32xf32>, tensor<64x32xf32> -> tensor<?x64xf32>
    %pp = mesh.shard %p to <@mesh, [[]], partial = sum[2]> : tensor<?x64xf32>
    %pw = mesh.shard %pp to <@mesh, [[]]> annotate_for_users : tensor<?x64xf32>
    %a = moe.add %pw, %pw : tensor<?x64xf32>
    %ap = mesh.shard %a to <@mesh, [[]], partial = sum[1, 2]> : tensor<?x64xf32>
    %aw = mesh.shard %ap to <@mesh, [[]]> annotate_for_users : tensor<?x64xf32>
    return %aw : tensor<?x64xf32>
  }
}

// -----

// A split value made whole (an all_gather) is not a resharding this pass
// makes: moe-partition joins the LM head's parts itself.
module {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @stage0(%x: tensor<?x64xf32>) -> tensor<?x64xf32> attributes {moe.stage = 0 : i64} {
    %s = mesh.shard %x to <@mesh, [[], [2]]> : tensor<?x64xf32>
    // expected-error @below {{moe-insert-collectives: no collective for resharding #mesh.shard<@mesh, [[], [2]]> to #mesh.shard<@mesh, [[]]> (only a partial sum to a whole value)}}
    %w = mesh.shard %s to <@mesh, [[]]> annotate_for_users : tensor<?x64xf32>
    return %w : tensor<?x64xf32>
  }
}

// -----

module {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @stage0(%x: tensor<?x64xf32>) -> tensor<?x64xf32> attributes {moe.stage = 0 : i64} {
    %s = mesh.shard %x to <@mesh, [[]], partial = max[2]> : tensor<?x64xf32>
    // expected-error @below {{moe-insert-collectives: a partial max is not supported yet (only sums)}}
    %w = mesh.shard %s to <@mesh, [[]]> annotate_for_users : tensor<?x64xf32>
    return %w : tensor<?x64xf32>
  }
}

// -----

// An expert_ffn whose blocks are exchanged over the experts' ep axis: the
// blocks and counts go out before it, the outputs come back after it with
// the received counts, and the mark is gone.
// CHECK-LABEL: func.func @stage0
// CHECK: %[[B:.+]], %[[C:.+]] = moe.all_to_all %arg0, %arg1 over @experts[2] : tensor<4x8x16xf32>, tensor<4xi32>
// CHECK-NEXT: %[[Y:.+]] = moe.expert_ffn silu %[[B]], %[[C]], %{{.+}}, %{{.+}}, %{{.+}} :
// CHECK-NOT: moe.exchange
// CHECK-NEXT: %[[BACK:.+]], %{{.+}} = moe.all_to_all %[[Y]], %[[C]] over @experts[2]
// CHECK-NEXT: return %[[BACK]]
module {
  mesh.mesh @experts(shape = 1x1x2x1)
  func.func @stage0(%buf: tensor<4x8x16xf32>, %counts: tensor<4xi32>) -> tensor<4x8x16xf32> attributes {moe.stage = 0 : i64} {
    %g = moe.expert_weight "e.{e}.g" etp_dim 0 : tensor<2x32x16xf32>
    %u = moe.expert_weight "e.{e}.u" etp_dim 0 : tensor<2x32x16xf32>
    %d = moe.expert_weight "e.{e}.d" etp_dim 1 : tensor<2x16x32xf32>
    %y = moe.expert_ffn silu %buf, %counts, %g, %u, %d {moe.exchange = {mesh = @experts, axis = 2 : i64}} : tensor<4x8x16xf32>, tensor<4xi32>, tensor<2x32x16xf32>, tensor<2x32x16xf32>, tensor<2x16x32xf32>
    return %y : tensor<4x8x16xf32>
  }
}

// -----

module {
  mesh.mesh @experts(shape = 1x1x2x1)
  func.func @stage0(%buf: tensor<4x8x16xf32>, %counts: tensor<4xi32>) -> tensor<4x8x16xf32> attributes {moe.stage = 0 : i64} {
    %g = moe.expert_weight "e.{e}.g" etp_dim 0 : tensor<2x32x16xf32>
    %u = moe.expert_weight "e.{e}.u" etp_dim 0 : tensor<2x32x16xf32>
    %d = moe.expert_weight "e.{e}.d" etp_dim 1 : tensor<2x16x32xf32>
    // expected-error @below {{'moe.expert_ffn' op moe-insert-collectives: moe.exchange must be {mesh = @symbol, axis = integer}}}
    %y = moe.expert_ffn silu %buf, %counts, %g, %u, %d {moe.exchange = {mesh = @experts}} : tensor<4x8x16xf32>, tensor<4xi32>, tensor<2x32x16xf32>, tensor<2x32x16xf32>, tensor<2x16x32xf32>
    return %y : tensor<4x8x16xf32>
  }
}
