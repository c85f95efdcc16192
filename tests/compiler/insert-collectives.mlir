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
