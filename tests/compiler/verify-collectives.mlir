// RUN: moe-opt --moe-verify-collectives --split-input-file --verify-diagnostics %s | FileCheck %s

// Two TP ranks that run the same collectives in the same order: proven.
// CHECK: module attributes {moe.collectives_verified
module attributes {moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 2 : i64, etp = 1 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  mesh.mesh @experts(shape = 1x1x2x1)
  func.func @stage0(%x: tensor<?x64xf32>, %b: tensor<8x16x64xf32>, %c: tensor<8xi32>) -> tensor<?x64xf32> attributes {moe.stage = 0 : i64} {
    %r = moe.all_reduce %x over @mesh[2] : tensor<?x64xf32>
    %rb, %rc = moe.all_to_all %b, %c over @experts[2] : tensor<8x16x64xf32>, tensor<8xi32>
    return %r : tensor<?x64xf32>
  }
}

// -----

// Rank 1 of the TP group issues the all_to_all first: each waits for the
// other forever.
// expected-error@+1 {{collectives do not match: 2 of 2 ranks would wait forever (deadlock):}}
module attributes {moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 2 : i64, etp = 1 : i64}} {
  func.func @rank0(%x: tensor<?x64xf32>, %b: tensor<8x16x64xf32>, %c: tensor<8xi32>) attributes {moe.ranks = array<i64: 0>} {
    %r = moe.all_reduce %x over @mesh[2] : tensor<?x64xf32>
    %rb, %rc = moe.all_to_all %b, %c over @experts[2] : tensor<8x16x64xf32>, tensor<8xi32>
    return
  }
  func.func @rank1(%x: tensor<?x64xf32>, %b: tensor<8x16x64xf32>, %c: tensor<8xi32>) attributes {moe.ranks = array<i64: 1>} {
    %rb, %rc = moe.all_to_all %b, %c over @experts[2] : tensor<8x16x64xf32>, tensor<8xi32>
    %r = moe.all_reduce %x over @mesh[2] : tensor<?x64xf32>
    return
  }
}

// -----

// A rank whose routing gave it no tokens must still take part: here rank 1
// skips the all_to_all and rank 0 waits in it.
// expected-error@+1 {{1 of 2 ranks would wait forever (deadlock):}}
module attributes {moe.sharding = {dp = 2 : i64, pp = 1 : i64, tp = 1 : i64, ep = 2 : i64, etp = 1 : i64}} {
  func.func @rank0(%b: tensor<8x16x64xf32>, %c: tensor<8xi32>) attributes {moe.ranks = array<i64: 0>} {
    %rb, %rc = moe.all_to_all %b, %c over @experts[2] : tensor<8x16x64xf32>, tensor<8xi32>
    return
  }
  func.func @rank1(%b: tensor<8x16x64xf32>, %c: tensor<8xi32>) attributes {moe.ranks = array<i64: 1>} {
    return
  }
}

// -----

// The members meet in the same collective with different shapes.
module attributes {moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64}} {
  func.func @rank0(%x: tensor<?x64xf32>) attributes {moe.ranks = array<i64: 0>} {
    // expected-error@+1 {{ranks 0 and 1 meet in all_reduce with different shapes}}
    %r = moe.all_reduce %x over @mesh[2] : tensor<?x64xf32>
    return
  }
  func.func @rank1(%x: tensor<?x32xf32>) attributes {moe.ranks = array<i64: 1>} {
    %r = moe.all_reduce %x over @mesh[2] : tensor<?x32xf32>
    return
  }
}

// -----

// Pipeline stages: stage 0 sends two values, stage 1 receives them in the
// other order of shapes.
module attributes {moe.sharding = {dp = 1 : i64, pp = 2 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64}} {
  func.func @stage0(%x: tensor<?x64xf32>, %y: tensor<?x32xf32>) attributes {moe.stage = 0 : i64} {
    // expected-error@+1 {{rank 0: send to stage 1 (tensor<?x64xf32>) at}}
    moe.send %x to 1 : tensor<?x64xf32>
    moe.send %y to 1 : tensor<?x32xf32>
    return
  }
  func.func @stage1() attributes {moe.stage = 1 : i64} {
    %y = moe.recv from 0 : tensor<?x32xf32>
    %x = moe.recv from 0 : tensor<?x64xf32>
    return
  }
}

// -----

// A send whose receiver never comes.
// expected-error@+1 {{1 of 2 ranks would wait forever (deadlock):}}
module attributes {moe.sharding = {dp = 1 : i64, pp = 2 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64}} {
  func.func @stage0(%x: tensor<?x64xf32>) attributes {moe.stage = 0 : i64} {
    moe.send %x to 1 : tensor<?x64xf32>
    return
  }
  func.func @stage1() attributes {moe.stage = 1 : i64} {
    return
  }
}

// -----

// moe-partition's marks are collectives still to be placed: the schedule
// without them is not proven.
module attributes {moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @stage0(%x: tensor<?x64xf32>) -> tensor<?x64xf32> attributes {moe.stage = 0 : i64} {
    // expected-error @below {{a collective is not placed yet (run moe-insert-collectives first)}}
    %p = mesh.shard %x to <@mesh, [[]], partial = sum[2]> : tensor<?x64xf32>
    %w = mesh.shard %p to <@mesh, [[]]> annotate_for_users : tensor<?x64xf32>
    return %w : tensor<?x64xf32>
  }
}

// -----

module attributes {moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 1 : i64, ep = 2 : i64, etp = 1 : i64}} {
  mesh.mesh @experts(shape = 1x1x2x1)
  func.func @stage0(%buf: tensor<4x8x16xf32>, %counts: tensor<4xi32>) -> tensor<4x8x16xf32> attributes {moe.stage = 0 : i64} {
    %g = moe.expert_weight "e.{e}.g" etp_dim 0 : tensor<2x32x16xf32>
    %u = moe.expert_weight "e.{e}.u" etp_dim 0 : tensor<2x32x16xf32>
    %d = moe.expert_weight "e.{e}.d" etp_dim 1 : tensor<2x16x32xf32>
    // expected-error @below {{a collective is not placed yet (run moe-insert-collectives first)}}
    %y = moe.expert_ffn silu %buf, %counts, %g, %u, %d {moe.exchange = {mesh = @experts, axis = 2 : i64}} : tensor<4x8x16xf32>, tensor<4xi32>, tensor<2x32x16xf32>, tensor<2x32x16xf32>, tensor<2x16x32xf32>
    return %y : tensor<4x8x16xf32>
  }
}

// -----

module attributes {moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @stage0(%x: tensor<?x64xf32>) -> tensor<?x128xf32> attributes {moe.stage = 0 : i64} {
    // expected-error @below {{a collective is not placed yet (run moe-insert-collectives first)}}
    %w = builtin.unrealized_conversion_cast %x : tensor<?x64xf32> to tensor<?x128xf32> {moe.gather = {mesh = @mesh, axis = 2 : i64}}
    return %w : tensor<?x128xf32>
  }
}

// -----

// Stage transfers still in the signatures.
module attributes {moe.sharding = {dp = 1 : i64, pp = 2 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64}} {
  // expected-error @below {{a collective is not placed yet (run moe-insert-collectives first)}}
  func.func @stage0(%x: tensor<?x64xf32>) -> (tensor<?x64xf32> {moe.send_to = 1 : i64}) attributes {moe.stage = 0 : i64} {
    return %x : tensor<?x64xf32>
  }
  func.func @stage1(%x: tensor<?x64xf32> {moe.recv_from = 0 : i64}) attributes {moe.stage = 1 : i64} {
    return
  }
}

// -----

// expected-error @below {{expected moe.sharding (the world's degrees)}}
module {
  func.func @stage0(%x: tensor<?x64xf32>) attributes {moe.stage = 0 : i64} {
    return
  }
}

// -----

module attributes {moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64}} {
  // expected-error @below {{moe.ranks names rank 3 outside the world of 1}}
  func.func @stage0(%x: tensor<?x64xf32>) attributes {moe.ranks = array<i64: 3>} {
    return
  }
}
