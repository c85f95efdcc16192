// RUN: moe-opt --moe-assign-buffers --moe-lower-to-exec --split-input-file %s | FileCheck %s

// One program: buffers in id order with the workload's rows, weights in the
// order launches first bind them (the head's table before the norm's weight
// it was declared after), a KV cache per attention, the LM head marked, each
// op's constants. A weight bound twice (tied embedding and head) is declared
// once; the model's weights stay on the module, in @forward's order.
// CHECK-LABEL: module attributes
// CHECK-SAME: moe.logical_weights = [{name = "model.norm.weight", type = tensor<64xf32>}, {name = "model.embed_tokens.weight", type = tensor<251x64xf32>}]
// CHECK: exec.program @forward entry "forward" stage 0 {
// CHECK-NEXT: %b0 = exec.buffer i32 rows 16 width 1
// CHECK-NEXT: %b1 = exec.buffer i32 rows 16 width 1
// CHECK-NEXT: %b2 = exec.buffer f32 rows 16 width 64
// CHECK-NEXT: %b3 = exec.buffer f32 rows 16 width 64
// CHECK-NEXT: %b4 = exec.buffer f32 rows 16 width 251
// CHECK-NEXT: %w0 = exec.weight "model.embed_tokens.weight" : tensor<251x64xf32>
// CHECK-NEXT: %w1 = exec.weight "model.norm.weight" : tensor<64xf32>
// CHECK-NEXT: exec.kv_cache key_width 64 value_width 64
// CHECK-NEXT: exec.inputs tokens(%b0) positions(%b1)
// CHECK-NEXT: exec.launch "embedding" ins(%b0) weights(%w0) outs(%b2) {}
// CHECK-NEXT: exec.launch "attention" ins(%b2, %b2, %b2) outs(%b3) {heads = 4 : i64, kv_cache = 0 : i64, kv_heads = 4 : i64, scale = 2.500000e-01 : f64, sliding_window = 0 : i64}
// CHECK-NEXT: exec.launch "rms_norm" ins(%b3) weights(%w1) outs(%b3) {eps = 9.9999999999999995E-7 : f64}
// CHECK-NEXT: exec.launch "linear" ins(%b3) weights(%w0) outs(%b4) {head = true}
// CHECK-NEXT: exec.return logits(%b4)
// CHECK-NEXT: }
// CHECK-NOT: func.func
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) -> tensor<?x251xf32> {
    %norm = moe.weight "model.norm.weight" : tensor<64xf32>
    %table = moe.weight "model.embed_tokens.weight" : tensor<251x64xf32>
    %h = moe.embedding %table[%tokens] : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    %a = moe.attention %h, %h, %h heads = 4 kv_heads = 4 scale = 0.25 : tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x64xf32> -> tensor<?x64xf32>
    %n = moe.rms_norm %a, %norm eps = 1.0e-6 : tensor<?x64xf32>, tensor<64xf32>
    %logits = moe.linear %n, %table : tensor<?x64xf32>, tensor<251x64xf32> -> tensor<?x251xf32>
    return %logits : tensor<?x251xf32>
  }
}

// -----

// A split gives its parts' widths, a route its routing as a dictionary.
// CHECK-LABEL: module attributes
// CHECK: exec.launch "split" ins(%b{{[0-9]+}}) outs(%b{{[0-9]+}}, %b{{[0-9]+}}) {widths = [48, 16]}
// CHECK: exec.launch "route" ins(%b{{[0-9]+}}) outs(%b{{[0-9]+}}, %b{{[0-9]+}}) {routing = {compute_type = "F32", group_score = "top2_sum", normalize = true, num_groups = 1 : i64, scaling_factor = 1.000000e+00 : f64, scoring = "softmax", top_k = 2 : i64, topk_groups = 1 : i64, topk_on = "scores"}}
// CHECK: exec.return{{$}}
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) {
    %table = moe.weight "model.embed_tokens.weight" : tensor<251x64xf32>
    %h = moe.embedding %table[%tokens] : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    %a, %b = moe.split %h : tensor<?x64xf32> -> tensor<?x48xf32>, tensor<?x16xf32>
    %w, %e = moe.route %b <scoring = softmax, top_k = 2, topk_on = scores, normalize = true, scaling_factor = 1.0, num_groups = 1, topk_groups = 1, group_score = top2_sum, compute_type = f32> : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
    return
  }
}
