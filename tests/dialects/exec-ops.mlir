// RUN: moe-opt %s | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | moe-opt | FileCheck %s

// Round trip of every exec op: declarations print as %b<id> / %w<id>, the ids
// the plan gives them.
// CHECK-LABEL: exec.program @stage0 entry "forward" stage 0 {
// CHECK-NEXT: %b0 = exec.buffer i32 rows 8 width 1
// CHECK-NEXT: %b1 = exec.buffer i32 rows 8 width 1
// CHECK-NEXT: %b2 = exec.buffer f32 rows 8 width 64
// CHECK-NEXT: %b3 = exec.buffer f32 rows 8 width 64
// CHECK-NEXT: %w0 = exec.weight "model.embed_tokens.weight" : tensor<251x64xbf16>
// CHECK-NEXT: %w1 = exec.weight "model.layers.0.mlp.experts.{e}.up_proj.weight" : tensor<4x32x64xf32> experts 4
// CHECK-NEXT: exec.kv_cache key_width 64 value_width 32
// CHECK-NEXT: exec.inputs tokens(%b0) positions(%b1)
// CHECK-NEXT: exec.launch "embedding" ins(%b0) weights(%w0) outs(%b2) {vocab_shard = true}
// CHECK-NEXT: exec.collective "all_reduce" over @mesh["tp"] ins(%b2) outs(%b2) {}
// CHECK-NEXT: exec.launch "norm" ins(%b2) outs(%b3) {eps = 9.9999999999999995E-7 : f64, rope = {kind = "default", widths = [1, 2]}}
// CHECK-NEXT: exec.collective "send" ins(%b3) {stage = 1 : i64}
// CHECK-NEXT: exec.return
// CHECK-LABEL: exec.program @stage1 entry "forward" stage 1 {
// CHECK: exec.collective "recv" outs(%b0) rows "T" {stage = 0 : i64}
// CHECK-NEXT: exec.launch "linear" ins(%b0) weights(%w0) outs(%b1) rows "T" {head = true} kernels {
// CHECK-NEXT: exec.dispatch "head_rows" grid([1, 1, 0], [0, 1, 1], [0, 1, 1]) block 128 params ["buf:0", "batch:logit_rows", "scratch:0", "R"] rows "R" {shared_bytes = 0 : i64}
// CHECK-NEXT: exec.gemm("scratch:0", "weight:0") -> "buf:1" m "R" n 97 k 64 rows "R" {b_dtype = "BF16", batch = 1 : i64, lda = 64 : i64, ldb = 64 : i64, ldc = 97 : i64, transpose_b = true}
// CHECK-NEXT: exec.gemm("buf:0", "weight:1") -> "scratch:1" m "512" n 8 k 64 {b_batch_modulo = 2 : i64, b_dtype = "F32", batch = 4 : i64, lda = 64 : i64, ldb = 64 : i64, ldc = 8 : i64, rows_from_counts = "buf:2", stride_a = 8192 : i64, stride_b = 512 : i64, stride_c = 1024 : i64, transpose_b = true}
// CHECK-NEXT: exec.gemm("buf:0", "buf:1") -> "scratch:2" m "64" n 97 k 512 {accumulate = true, b_dtype = "F32", batch = 1 : i64, k_rows = "T", lda = 64 : i64, ldb = 97 : i64, ldc = 97 : i64, transpose_a = true, transpose_b = false}
// CHECK-NEXT: }
// CHECK-NEXT: exec.kernels "cuda" names ["head_rows", "argmax"] scratch [256, 4096] attributes {rope_tables = [], source = "// kernels"} sampling {
// CHECK-NEXT: exec.dispatch "argmax" grid([1, 1, 0], [0, 1, 1], [0, 1, 1]) block 256 params ["buf:1", "batch:argmax", "R"] {shared_bytes = 0 : i64}
// CHECK-NEXT: }
// CHECK-NEXT: exec.return logits(%b1)
exec.program @stage0 entry "forward" stage 0 {
  %t = exec.buffer i32 rows 8 width 1
  %p = exec.buffer i32 rows 8 width 1
  %h = exec.buffer f32 rows 8 width 64
  %n = exec.buffer f32 rows 8 width 64
  %table = exec.weight "model.embed_tokens.weight" : tensor<251x64xbf16>
  %up = exec.weight "model.layers.0.mlp.experts.{e}.up_proj.weight" : tensor<4x32x64xf32> experts 4
  exec.kv_cache key_width 64 value_width 32
  exec.inputs tokens(%t) positions(%p)
  exec.launch "embedding" ins(%t) weights(%table) outs(%h) {vocab_shard = true}
  exec.collective "all_reduce" over @mesh["tp"] ins(%h) outs(%h) {}
  exec.launch "norm" ins(%h) outs(%n) {eps = 1.0e-6 : f64, rope = {kind = "default", widths = [1, 2]}}
  exec.collective "send" ins(%n) {stage = 1}
  exec.return
}
// The kernel level a GPU target lowers launches to (moe-cuda-kernels).
exec.program @stage1 entry "forward" stage 1 {
  %h = exec.buffer f32 rows 8 width 64
  %logits = exec.buffer f32 rows 8 width 97
  %counts = exec.buffer i32 rows 1 width 4
  %head = exec.weight "lm_head.weight" : tensor<97x64xbf16>
  %experts = exec.weight "e.{e}.w" : tensor<2x8x64xf32> experts 2
  exec.collective "recv" outs(%h) rows "T" {stage = 0}
  exec.launch "linear" ins(%h) weights(%head) outs(%logits) rows "T" {head = true} kernels {
    exec.dispatch "head_rows" grid([1, 1, 0], [0, 1, 1], [0, 1, 1]) block 128 params ["buf:0", "batch:logit_rows", "scratch:0", "R"] rows "R" {shared_bytes = 0}
    exec.gemm("scratch:0", "weight:0") -> "buf:1" m "R" n 97 k 64 rows "R" {b_dtype = "BF16", batch = 1, lda = 64, ldb = 64, ldc = 97, transpose_b = true}
    exec.gemm("buf:0", "weight:1") -> "scratch:1" m "512" n 8 k 64 {b_batch_modulo = 2, b_dtype = "F32", batch = 4, lda = 64, ldb = 64, ldc = 8, rows_from_counts = "buf:2", stride_a = 8192, stride_b = 512, stride_c = 1024, transpose_b = true}
    exec.gemm("buf:0", "buf:1") -> "scratch:2" m "64" n 97 k 512 {accumulate = true, b_dtype = "F32", batch = 1, k_rows = "T", lda = 64, ldb = 97, ldc = 97, transpose_a = true, transpose_b = false}
  }
  exec.kernels "cuda" names ["head_rows", "argmax"] scratch [256, 4096] attributes {rope_tables = [], source = "// kernels"} sampling {
    exec.dispatch "argmax" grid([1, 1, 0], [0, 1, 1], [0, 1, 1]) block 256 params ["buf:1", "batch:argmax", "R"] {shared_bytes = 0}
  }
  exec.return logits(%logits)
}

// A differentiated training program: labels in, the loss and each weight's
// gradient out.
// CHECK-LABEL: exec.program @train entry "train" stage 0 {
// CHECK: exec.inputs tokens(%b0) positions(%b1) labels(%b2)
// CHECK: exec.return loss(%b3) gradients(%b4) of(%w0)
exec.program @train entry "train" stage 0 {
  %t = exec.buffer i32 rows 8 width 1
  %p = exec.buffer i32 rows 8 width 1
  %y = exec.buffer i32 rows 8 width 1
  %loss = exec.buffer f32 rows 1 width 4
  %g = exec.buffer f32 rows 64 width 64
  %w = exec.weight "model.norm.weight" : tensor<64x64xf32>
  exec.inputs tokens(%t) positions(%p) labels(%y)
  exec.launch "linear_grad" weights(%w) outs(%g) {}
  exec.return loss(%loss) gradients(%g) of(%w)
}

// An optimizer program: its step in, state buffers shared with the train
// program by name, an update that writes its weight, the stats out.
// CHECK-LABEL: exec.program @opt entry "optimizer" stage 0 attributes {micro_batches = 2 : i64} {
// CHECK: %b2 = exec.buffer f32 rows 64 width 64 {state = "grad_sum:model.norm.weight"}
// CHECK: exec.inputs step(%b0)
// CHECK: exec.launch "adamw" ins(%b0, %b1, %b2, %b3, %b4) weights(%w0) outs(%b3, %b4, %b2) {beta1 = 9.000000e-01 : f64} {updates_weights}
// CHECK: exec.return stats(%b1)
exec.program @opt entry "optimizer" stage 0 attributes {micro_batches = 2 : i64} {
  %w = exec.weight "model.norm.weight" : tensor<64x64xf32>
  %step = exec.buffer i32 rows 1 width 1
  %stats = exec.buffer f32 rows 1 width 4
  %sum = exec.buffer f32 rows 64 width 64 {state = "grad_sum:model.norm.weight"}
  %m = exec.buffer f32 rows 64 width 64 {state = "exp_avg:model.norm.weight"}
  %v = exec.buffer f32 rows 64 width 64 {state = "exp_avg_sq:model.norm.weight"}
  exec.inputs step(%step)
  exec.launch "adamw" ins(%step, %stats, %sum, %m, %v) weights(%w) outs(%m, %v, %sum) {beta1 = 0.9 : f64} {updates_weights}
  exec.return stats(%stats)
}
// ZeRO-1: a state buffer that is a shard of its logical rows, and the
// all_gather of a weight in place.
// CHECK-LABEL: exec.program @stage0_optimizer entry "optimizer" stage 0 {
// CHECK-NEXT: %w0 = exec.weight "w" : tensor<5x4xf32>
// CHECK-NEXT: %b0 = exec.buffer f32 rows 3 width 4 {logical_rows = 5 : i64, state = "exp_avg:w"}
// CHECK: exec.collective "all_gather" over @mesh["dp"] weights(%w0) {shard_rows = 3 : i64}
exec.program @stage0_optimizer entry "optimizer" stage 0 {
  %w = exec.weight "w" : tensor<5x4xf32>
  %m = exec.buffer f32 rows 3 width 4 {state = "exp_avg:w", logical_rows = 5 : i64}
  %step = exec.buffer i32 rows 1 width 1
  exec.inputs step(%step)
  exec.collective "all_gather" over @mesh["dp"] weights(%w) {shard_rows = 3 : i64}
  exec.return
}
