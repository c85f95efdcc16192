// RUN: moe-opt --moe-lower-routing --split-input-file -verify-diagnostics %s

// Under expert parallelism a gradient of routed experts is lowered with its
// forward (the same input and selection): without one it is refused.
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}, moe.sharding = {dp = 2 : i64, pp = 1 : i64, tp = 1 : i64, ep = 2 : i64, etp = 1 : i64}} {
  func.func @orphan(%x: tensor<?x64xf32>, %w: tensor<?x2xf32>, %e: tensor<?x2xi32>, %g: tensor<8x48x64xf32>, %u: tensor<8x48x64xf32>, %d: tensor<8x64x48xf32>, %dy: tensor<?x64xf32>) -> tensor<?x64xf32> {
    // expected-error @+1 {{moe-lower-routing: no moe.experts of the same input and selection before it}}
    %dx, %dw, %d1, %d3, %d2 = moe.experts_grad silu %dy, %x, %w, %e, %g, %u, %d : tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x48x64xf32>, tensor<8x48x64xf32>, tensor<8x64x48xf32> -> tensor<?x64xf32>, tensor<?x2xf32>, tensor<8x48x64xf32>, tensor<8x48x64xf32>, tensor<8x64x48xf32>
    return %dx : tensor<?x64xf32>
  }
}

// -----

// The backward ops' verifiers.
func.func @bad_combine_grad(%dy: tensor<?x64xf32>, %o: tensor<8x16x64xf32>, %s: tensor<?x2xi32>, %w: tensor<?x3xf32>) {
  // expected-error @+1 {{expected slots, weights and their gradient of the same shape}}
  %do, %dw = moe.combine_grad %dy, %o, %s, %w : tensor<?x64xf32>, tensor<8x16x64xf32>, tensor<?x2xi32>, tensor<?x3xf32> -> tensor<8x16x64xf32>, tensor<?x3xf32>
  return
}

// -----

func.func @bad_expert_ffn_grad(%dy: tensor<8x16x64xf32>, %b: tensor<8x16x64xf32>, %c: tensor<8xi32>, %g: tensor<3x48x64xf32>, %u: tensor<3x48x64xf32>, %d: tensor<3x64x48xf32>) {
  // expected-error @+1 {{expected the buffer's experts (8) to be a multiple of the local experts (3)}}
  %db, %dg, %du, %dd = moe.expert_ffn_grad silu %dy, %b, %c, %g, %u, %d : tensor<8x16x64xf32>, tensor<8x16x64xf32>, tensor<8xi32>, tensor<3x48x64xf32>, tensor<3x48x64xf32>, tensor<3x64x48xf32> -> tensor<8x16x64xf32>, tensor<3x48x64xf32>, tensor<3x48x64xf32>, tensor<3x64x48xf32>
  return
}

// -----

func.func @bad_dispatch_grad(%db: tensor<8x16x64xf32>, %s: tensor<?x2xi32>) {
  // expected-error @+1 {{expected one row per token, as wide as the blocks}}
  %dx = moe.dispatch_grad %db, %s : tensor<8x16x64xf32>, tensor<?x2xi32> -> tensor<?x32xf32>
  return
}
