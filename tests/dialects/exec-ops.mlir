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
// CHECK: exec.collective "recv" outs(%b0) {stage = 0 : i64}
// CHECK-NEXT: exec.return logits(%b0)
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
exec.program @stage1 entry "forward" stage 1 {
  %h = exec.buffer f32 rows 8 width 64
  exec.collective "recv" outs(%h) {stage = 0}
  exec.return logits(%h)
}
