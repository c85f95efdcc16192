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

// A split value made whole through annotations is not a resharding this
// pass makes: moe-partition marks parts to gather with moe.gather (below).
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

// -----

// The LM head's vocabulary parts: an all_gather over the group's axis, then
// a split that drops the padding (2 x 128 columns for a vocabulary of 251).
// CHECK-LABEL: func.func @stage0
// CHECK: %[[ALL:.+]] = moe.all_gather %arg0 over @mesh[2] : tensor<?x128xf32> -> tensor<?x256xf32>
// CHECK-NEXT: %[[PART:.+]], %{{.+}} = moe.split %[[ALL]] : tensor<?x256xf32> -> tensor<?x251xf32>, tensor<?x5xf32>
// CHECK-NEXT: return %[[PART]]
// CHECK-NOT: unrealized_conversion_cast
module {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @stage0(%part: tensor<?x128xf32>) -> tensor<?x251xf32> attributes {moe.stage = 0 : i64} {
    %whole = builtin.unrealized_conversion_cast %part : tensor<?x128xf32> to tensor<?x251xf32> {moe.gather = {mesh = @mesh, axis = 2 : i64}}
    return %whole : tensor<?x251xf32>
  }
}

// -----

// Parts that fill the whole exactly: no split.
// CHECK-LABEL: func.func @stage0
// CHECK: %[[ALL:.+]] = moe.all_gather %arg0 over @mesh[2] : tensor<?x64xf32> -> tensor<?x256xf32>
// CHECK-NEXT: return %[[ALL]]
module {
  mesh.mesh @mesh(shape = 1x1x4)
  func.func @stage0(%part: tensor<?x64xf32>) -> tensor<?x256xf32> attributes {moe.stage = 0 : i64} {
    %whole = builtin.unrealized_conversion_cast %part : tensor<?x64xf32> to tensor<?x256xf32> {moe.gather = {mesh = @mesh, axis = 2 : i64}}
    return %whole : tensor<?x256xf32>
  }
}

// -----

module {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @stage0(%part: tensor<?x128xf32>) -> tensor<?x251xf32> attributes {moe.stage = 0 : i64} {
    // expected-error @below {{'builtin.unrealized_conversion_cast' op moe-insert-collectives: moe.gather must be {mesh = @symbol, axis = integer}}}
    %whole = builtin.unrealized_conversion_cast %part : tensor<?x128xf32> to tensor<?x251xf32> {moe.gather = {axis = 2 : i64}}
    return %whole : tensor<?x251xf32>
  }
}

// -----

module {
  mesh.mesh @mesh(shape = 1x2)
  func.func @stage0(%part: tensor<?x128xf32>) -> tensor<?x251xf32> attributes {moe.stage = 0 : i64} {
    // expected-error @below {{moe-insert-collectives: moe.gather names no static axis 2 of @mesh}}
    %whole = builtin.unrealized_conversion_cast %part : tensor<?x128xf32> to tensor<?x251xf32> {moe.gather = {mesh = @mesh, axis = 2 : i64}}
    return %whole : tensor<?x251xf32>
  }
}

// -----

module {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @stage0(%part: tensor<?x100xf32>) -> tensor<?x251xf32> attributes {moe.stage = 0 : i64} {
    // expected-error @below {{moe-insert-collectives: moe.gather of 2 parts of 100 columns cannot make 251}}
    %whole = builtin.unrealized_conversion_cast %part : tensor<?x100xf32> to tensor<?x251xf32> {moe.gather = {mesh = @mesh, axis = 2 : i64}}
    return %whole : tensor<?x251xf32>
  }
}

// -----

module {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @stage0(%part: tensor<128xf32>) -> tensor<251xf32> attributes {moe.stage = 0 : i64} {
    // expected-error @below {{moe-insert-collectives: moe.gather expects one [rows, columns] part and its whole}}
    %whole = builtin.unrealized_conversion_cast %part : tensor<128xf32> to tensor<251xf32> {moe.gather = {mesh = @mesh, axis = 2 : i64}}
    return %whole : tensor<251xf32>
  }
}

// -----

// Values crossing a stage cut: stage 0's results marked moe.send_to are sent
// before it returns, stage 1's arguments marked moe.recv_from are received
// after its weights, both in order, and leave the signatures.
// CHECK-LABEL: func.func @stage0({{[^)]*}}) -> tensor<?x8xf32> attributes
// CHECK: %[[Y:.+]] = moe.add
// CHECK-NEXT: moe.send %arg2 to 1 : tensor<?x64xf32>
// CHECK-NEXT: moe.send %[[Y]] to 1 : tensor<?x32xf32>
// CHECK-NEXT: return %arg3 : tensor<?x8xf32>
// CHECK-LABEL: func.func @stage1(%arg0: tensor<?xi32>, %arg1: tensor<?xi32>) -> tensor<?x64xf32> attributes
// CHECK-NEXT: %[[W:.+]] = moe.weight "n"
// CHECK-NEXT: %[[X:.+]] = moe.recv from 0 : tensor<?x64xf32>
// CHECK-NEXT: %[[Z:.+]] = moe.recv from 0 : tensor<?x32xf32>
// CHECK-NEXT: moe.rms_norm %[[X]], %[[W]]
// CHECK-NOT: moe.send_to
// CHECK-NOT: moe.recv_from
module {
  func.func @stage0(%tokens: tensor<?xi32>, %positions: tensor<?xi32>, %x: tensor<?x64xf32>, %u: tensor<?x8xf32>, %y0: tensor<?x32xf32>) -> (tensor<?x64xf32> {moe.send_to = 1 : i64}, tensor<?x8xf32>, tensor<?x32xf32> {moe.send_to = 1 : i64}) attributes {moe.stage = 0 : i64} {
    %y = moe.add %y0, %y0 : tensor<?x32xf32>
    return %x, %u, %y : tensor<?x64xf32>, tensor<?x8xf32>, tensor<?x32xf32>
  }
  func.func @stage1(%tokens: tensor<?xi32>, %x: tensor<?x64xf32> {moe.recv_from = 0 : i64}, %positions: tensor<?xi32>, %z: tensor<?x32xf32> {moe.recv_from = 0 : i64}) -> tensor<?x64xf32> attributes {moe.stage = 1 : i64} {
    %w = moe.weight "n" : tensor<64xf32>
    %n = moe.rms_norm %x, %w eps = 1.0e-6 : tensor<?x64xf32>, tensor<64xf32>
    return %n : tensor<?x64xf32>
  }
}

// -----

module {
  // expected-error @below {{'func.func' op moe-insert-collectives: moe.recv_from must be a stage (a non-negative i64)}}
  func.func @stage1(%tokens: tensor<?xi32>, %positions: tensor<?xi32>, %x: tensor<?x64xf32> {moe.recv_from = "zero"}) attributes {moe.stage = 1 : i64} {
    return
  }
}

// -----

module {
  // expected-error @below {{'func.func' op moe-insert-collectives: moe.send_to must be a stage (a non-negative i64)}}
  func.func @stage0(%tokens: tensor<?xi32>, %positions: tensor<?xi32>, %x: tensor<?x64xf32>) -> (tensor<?x64xf32> {moe.send_to = -1 : i64}) attributes {moe.stage = 0 : i64} {
    return %x : tensor<?x64xf32>
  }
}

// -----

module {
  // expected-error @below {{'func.func' op moe-insert-collectives: a stage program is one block ending in func.return}}
  func.func @stage0(%x: tensor<?x64xf32>) -> (tensor<?x64xf32> {moe.send_to = 1 : i64}) attributes {moe.stage = 0 : i64} {
    return %x : tensor<?x64xf32>
  ^bb1:
    return %x : tensor<?x64xf32>
  }
}
