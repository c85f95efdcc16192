// RUN: moe-opt --moe-partition --split-input-file -verify-diagnostics %s

// Diagnostics of moe-partition about what the earlier passes must have left
// on the module (the ones about the program: tests/compiler/partition.test).

// expected-error @below {{expected moe.sharding (moe-plan-sharding), moe.workload (moe-specialize-workload) and moe.vocab_size before partitioning}}
module attributes {moe.vocab_size = 8 : i64} {
  func.func @forward(%tokens: tensor<?xi32>) -> tensor<?xi32> {
    return %tokens : tensor<?xi32>
  }
}

// -----

// expected-error @below {{expected moe.sharding.stage_begin with 2 entries}}
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 2 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  func.func @forward(%tokens: tensor<?xi32>) -> tensor<?xi32> {
    return %tokens : tensor<?xi32>
  }
}

// -----

// expected-error @below {{etp (2) must divide tp (1) for partitioned execution: expert tensor parallelism across data-parallel replicas is not supported yet}}
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 2 : i64, pp = 1 : i64, tp = 1 : i64, ep = 2 : i64, etp = 2 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  func.func @forward(%tokens: tensor<?xi32>) -> tensor<?xi32> {
    return %tokens : tensor<?xi32>
  }
}

// -----

// Routed experts under expert parallelism are moe-lower-routing's to lower.
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 1 : i64, ep = 2 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  func.func @forward(%x: tensor<?x4xf32>, %w: tensor<?x2xf32>, %e: tensor<?x2xi32>, %g: tensor<2x3x4xf32>, %u: tensor<2x3x4xf32>, %d: tensor<2x4x3xf32>) -> tensor<?x4xf32> {
    // expected-error @below {{'moe.experts' op needs moe-lower-routing first: routed experts under expert or tensor parallelism run as dispatch / expert_ffn / combine}}
    %y = moe.experts silu %x, %w, %e, %g, %u, %d : tensor<?x4xf32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x4x3xf32>
    return %y : tensor<?x4xf32>
  }
}
