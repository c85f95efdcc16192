// RUN: moe-opt --moe-lower-routing="capacity-factor=1.25" --split-input-file %s | FileCheck %s --check-prefix=CAP
// RUN: moe-opt --moe-lower-routing --split-input-file %s | FileCheck %s --check-prefix=DROPLESS
// RUN: not moe-opt --moe-lower-routing="capacity-factor=-1" %s 2>&1 | FileCheck %s --check-prefix=NEGATIVE
// NEGATIVE: error: expected capacity-factor >= 0 (0: dropless) but got -1
// The capacity is a function of the workload.
// RUN: echo 'module {}' | not moe-opt --moe-lower-routing 2>&1 | FileCheck %s --check-prefix=WORKLOAD
// WORKLOAD: error: expected moe.workload (moe-specialize-workload) before lowering routing: the capacity is a function of max_batch_tokens

// With a capacity factor every moe.experts becomes dispatch / expert_ffn /
// combine, C = min(T, ceil(1.25 * 16 * 2 / 8)) = 5 slots per expert; one row
// part (moe-partition gives each TP rank its own).
// CAP-LABEL: func.func @forward
// CAP:         %[[B:.+]], %[[C:.+]], %[[S:.+]] = moe.dispatch %arg0, %arg2 capacity = 5 factor = 1.250000e+00 parts = 1 stride = 1 : tensor<?x64xf32>, tensor<?x2xi32> -> tensor<8x5x64xf32>, tensor<8xi32>, tensor<?x2xi32>
// CAP-NEXT:    %[[O:.+]] = moe.expert_ffn silu %[[B]], %[[C]], %arg3, %arg4, %arg5
// CAP-NEXT:    %[[Y:.+]] = moe.combine %[[O]], %[[S]], %arg1
// CAP-NEXT:    return %[[Y]]
// Dropless and no expert or tensor parallelism: the experts stay fused.
// DROPLESS-LABEL: func.func @forward
// DROPLESS:       moe.experts silu
// DROPLESS-NOT:   moe.dispatch
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  func.func @forward(%x: tensor<?x64xf32>, %w: tensor<?x2xf32>, %e: tensor<?x2xi32>, %g: tensor<8x48x64xf32>, %u: tensor<8x48x64xf32>, %d: tensor<8x64x48xf32>) -> tensor<?x64xf32> {
    %y = moe.experts silu %x, %w, %e, %g, %u, %d : tensor<?x64xf32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x48x64xf32>, tensor<8x48x64xf32>, tensor<8x64x48xf32>
    return %y : tensor<?x64xf32>
  }
}

// -----

// Expert parallelism needs the blocks even dropless: C = T = 16.
// CAP-LABEL: func.func @ep
// CAP:         moe.dispatch {{.*}} capacity = 5
// DROPLESS-LABEL: func.func @ep
// DROPLESS:       moe.dispatch %arg0, %arg2 capacity = 16 factor = 0.000000e+00 parts = 1 stride = 1
// DROPLESS-NEXT:  moe.expert_ffn
// DROPLESS-NEXT:  moe.combine
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 1 : i64, ep = 2 : i64, etp = 1 : i64}} {
  func.func @ep(%x: tensor<?x64xf32>, %w: tensor<?x2xf32>, %e: tensor<?x2xi32>, %g: tensor<8x48x64xf32>, %u: tensor<8x48x64xf32>, %d: tensor<8x64x48xf32>) -> tensor<?x64xf32> {
    %y = moe.experts silu %x, %w, %e, %g, %u, %d : tensor<?x64xf32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x48x64xf32>, tensor<8x48x64xf32>, tensor<8x64x48xf32>
    return %y : tensor<?x64xf32>
  }
}


// -----

// A training program under expert parallelism: moe.experts_saved and its
// moe.experts_grad become the lowered forward and its transpose over the
// same blocks (the saved intermediates are not needed: expert_ffn_grad
// recomputes the gate and up products from the blocks it is given).
// DROPLESS-LABEL: func.func @train
// DROPLESS:       %[[B:.+]], %[[C:.+]], %[[S:.+]] = moe.dispatch %arg0, %arg2 capacity = 16
// DROPLESS-NEXT:  %[[O:.+]] = moe.expert_ffn silu %[[B]], %[[C]], %arg3, %arg4, %arg5
// DROPLESS-NEXT:  %[[Y:.+]] = moe.combine %[[O]], %[[S]], %arg1
// DROPLESS-NEXT:  %[[DO:.+]], %[[DW:.+]] = moe.combine_grad %arg6, %[[O]], %[[S]], %arg1 : tensor<?x64xf32>, tensor<8x16x64xf32>, tensor<?x2xi32>, tensor<?x2xf32> -> tensor<8x16x64xf32>, tensor<?x2xf32>
// DROPLESS-NEXT:  %[[DB:.+]], %[[DG:.+]], %[[DU:.+]], %[[DD:.+]] = moe.expert_ffn_grad silu %[[DO]], %[[B]], %[[C]], %arg3, %arg4, %arg5
// DROPLESS-NEXT:  %[[DX:.+]] = moe.dispatch_grad %[[DB]], %[[S]] : tensor<8x16x64xf32>, tensor<?x2xi32> -> tensor<?x64xf32>
// DROPLESS-NEXT:  return %[[Y]], %[[DX]], %[[DW]], %[[DG]], %[[DU]], %[[DD]]
// With a capacity the blocks have C = 5 slots, the gradients' as well.
// CAP-LABEL: func.func @train
// CAP:         moe.dispatch {{.*}} capacity = 5
// CAP:         moe.expert_ffn_grad silu {{.*}} : tensor<8x5x64xf32>
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}, moe.sharding = {dp = 2 : i64, pp = 1 : i64, tp = 1 : i64, ep = 2 : i64, etp = 1 : i64}} {
  func.func @train(%x: tensor<?x64xf32>, %w: tensor<?x2xf32>, %e: tensor<?x2xi32>, %g: tensor<8x48x64xf32>, %u: tensor<8x48x64xf32>, %d: tensor<8x64x48xf32>, %dy: tensor<?x64xf32>) -> (tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x2xf32>, tensor<8x48x64xf32>, tensor<8x48x64xf32>, tensor<8x64x48xf32>) {
    %y, %sg, %su, %so = moe.experts_saved silu %x, %w, %e, %g, %u, %d : tensor<?x64xf32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x48x64xf32>, tensor<8x48x64xf32>, tensor<8x64x48xf32> -> tensor<?x64xf32>, tensor<?x96xf32>, tensor<?x96xf32>, tensor<?x128xf32>
    %dx, %dw, %d1, %d3, %d2 = moe.experts_grad silu %dy, %x, %w, %e, %g, %u, %d saved(%sg, %su, %so : tensor<?x96xf32>, tensor<?x96xf32>, tensor<?x128xf32>) : tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<8x48x64xf32>, tensor<8x48x64xf32>, tensor<8x64x48xf32> -> tensor<?x64xf32>, tensor<?x2xf32>, tensor<8x48x64xf32>, tensor<8x48x64xf32>, tensor<8x64x48xf32>
    return %y, %dx, %dw, %d1, %d3, %d2 : tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x2xf32>, tensor<8x48x64xf32>, tensor<8x48x64xf32>, tensor<8x64x48xf32>
  }
}
