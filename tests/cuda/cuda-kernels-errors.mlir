// RUN: moe-opt --moe-cuda-kernels --split-input-file -verify-diagnostics %s

// Diagnostics of moe-cuda-kernels, one input each: it lowers exec programs.

// expected-error @below {{moe-cuda-kernels: expected a module with moe.workload and exec programs (run the whole pipeline)}}
module {
  func.func @forward(%tokens: tensor<?xi32>) -> tensor<?xi32> {
    return %tokens : tensor<?xi32>
  }
}

// -----

// expected-error @below {{moe-cuda-kernels: expected exec.program ops (run moe-lower-to-exec)}}
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
}

// -----

// A kernel id the CUDA target has no lowering for.
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-cuda-kernels: step 0: no CUDA lowering for 'softmax'}}
  exec.program @forward entry "forward" stage 0 {
    %b0 = exec.buffer i32 rows 16 width 1
    %b1 = exec.buffer i32 rows 16 width 1
    %b2 = exec.buffer f32 rows 16 width 8
    exec.inputs tokens(%b0) positions(%b1)
    exec.launch "softmax" ins(%b2) outs(%b2) {}
    exec.return
  }
}

// -----

// Lowered twice.
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-cuda-kernels: @forward has its kernels already}}
  exec.program @forward entry "forward" stage 0 {
    %b0 = exec.buffer i32 rows 16 width 1
    %b1 = exec.buffer i32 rows 16 width 1
    exec.inputs tokens(%b0) positions(%b1)
    exec.kernels "cuda" names [] scratch []  attributes {rope_tables = [], source = ""}
    exec.return
  }
}

// -----

// What a lowering reads is checked before it reads it: the operand counts
// of its kernel id, its constants (present, of the right kind), the KV cache
// it names, its activation, its weights' ranks and element types.
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-cuda-kernels: step 0 ('add'): has 1 inputs, its lowering reads 2}}
  exec.program @forward entry "forward" stage 0 {
    %b0 = exec.buffer i32 rows 16 width 1
    %b1 = exec.buffer i32 rows 16 width 1
    %b2 = exec.buffer f32 rows 16 width 8
    exec.inputs tokens(%b0) positions(%b1)
    exec.launch "add" ins(%b2) outs(%b2) {}
    exec.return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-cuda-kernels: step 0 ('rms_norm'): constant 'eps' is missing (expected a number)}}
  exec.program @forward entry "forward" stage 0 {
    %w0 = exec.weight "n" : tensor<8xf32>
    %b0 = exec.buffer i32 rows 16 width 1
    %b1 = exec.buffer i32 rows 16 width 1
    %b2 = exec.buffer f32 rows 16 width 8
    exec.inputs tokens(%b0) positions(%b1)
    exec.launch "rms_norm" ins(%b2) weights(%w0) outs(%b2) {}
    exec.return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-cuda-kernels: step 0 ('attention'): constant 'heads' must be an integer}}
  exec.program @forward entry "forward" stage 0 {
    %b0 = exec.buffer i32 rows 16 width 1
    %b1 = exec.buffer i32 rows 16 width 1
    %b2 = exec.buffer f32 rows 16 width 8
    exec.kv_cache key_width 8 value_width 8
    exec.inputs tokens(%b0) positions(%b1)
    exec.launch "attention" ins(%b2, %b2, %b2) outs(%b2) {heads = "two", kv_heads = 1 : i64, kv_cache = 0 : i64, scale = 0.5 : f64}
    exec.return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-cuda-kernels: step 0 ('attention'): kv_cache 1 is not one of the program's 1}}
  exec.program @forward entry "forward" stage 0 {
    %b0 = exec.buffer i32 rows 16 width 1
    %b1 = exec.buffer i32 rows 16 width 1
    %b2 = exec.buffer f32 rows 16 width 8
    exec.kv_cache key_width 8 value_width 8
    exec.inputs tokens(%b0) positions(%b1)
    exec.launch "attention" ins(%b2, %b2, %b2) outs(%b2) {heads = 2 : i64, kv_heads = 1 : i64, kv_cache = 1 : i64, scale = 0.5 : f64}
    exec.return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-cuda-kernels: step 0 ('mlp'): activation 'swish' has no CUDA kernel}}
  exec.program @forward entry "forward" stage 0 {
    %w0 = exec.weight "g" : tensor<16x8xf32>
    %w1 = exec.weight "u" : tensor<16x8xf32>
    %w2 = exec.weight "d" : tensor<8x16xf32>
    %b0 = exec.buffer i32 rows 16 width 1
    %b1 = exec.buffer i32 rows 16 width 1
    %b2 = exec.buffer f32 rows 16 width 8
    exec.inputs tokens(%b0) positions(%b1)
    exec.launch "mlp" ins(%b2) weights(%w0, %w1, %w2) outs(%b2) {activation = "swish"}
    exec.return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-cuda-kernels: step 0 ('linear'): weight 0 has 1 dimensions, expected 2}}
  exec.program @forward entry "forward" stage 0 {
    %w0 = exec.weight "w" : tensor<64xf32>
    %b0 = exec.buffer i32 rows 16 width 1
    %b1 = exec.buffer i32 rows 16 width 1
    %b2 = exec.buffer f32 rows 16 width 8
    exec.inputs tokens(%b0) positions(%b1)
    exec.launch "linear" ins(%b2) weights(%w0) outs(%b2) {}
    exec.return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-cuda-kernels: step 0 ('split'): 1 widths for 2 outputs}}
  exec.program @forward entry "forward" stage 0 {
    %b0 = exec.buffer i32 rows 16 width 1
    %b1 = exec.buffer i32 rows 16 width 1
    %b2 = exec.buffer f32 rows 16 width 8
    %b3 = exec.buffer f32 rows 16 width 4
    exec.inputs tokens(%b0) positions(%b1)
    exec.launch "split" ins(%b2) outs(%b3, %b3) {widths = [4]}
    exec.return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-cuda-kernels: weight 'w': its element type has no CUDA kernels (F32, BF16 or F16)}}
  exec.program @forward entry "forward" stage 0 {
    %w0 = exec.weight "w" : tensor<8x8xi32>
    %b0 = exec.buffer i32 rows 16 width 1
    %b1 = exec.buffer i32 rows 16 width 1
    exec.inputs tokens(%b0) positions(%b1)
    exec.return
  }
}

// -----

// expected-error @below {{moe-cuda-kernels: moe.workload needs a positive max_batch_tokens and max_seq_len}}
module attributes {moe.workload = {max_batch_tokens = 0 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-cuda-kernels: step 0 ('rope'): head_dim 3 does not divide the width 8}}
  exec.program @forward entry "forward" stage 0 {
    %b0 = exec.buffer i32 rows 16 width 1
    %b1 = exec.buffer i32 rows 16 width 1
    %b2 = exec.buffer f32 rows 16 width 8
    exec.inputs tokens(%b0) positions(%b1)
    exec.launch "rope" ins(%b2, %b1) outs(%b2) {head_dim = 3 : i64, rope = {interleaved = false, rotary_dim = 2 : i64}}
    exec.return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-cuda-kernels: step 0 ('attention'): 3 heads do not share 2 KV heads}}
  exec.program @forward entry "forward" stage 0 {
    %b0 = exec.buffer i32 rows 16 width 1
    %b1 = exec.buffer i32 rows 16 width 1
    %b2 = exec.buffer f32 rows 16 width 12
    exec.kv_cache key_width 8 value_width 8
    exec.inputs tokens(%b0) positions(%b1)
    exec.launch "attention" ins(%b2, %b2, %b2) outs(%b2) {heads = 3 : i64, kv_heads = 2 : i64, kv_cache = 0 : i64, scale = 0.5 : f64}
    exec.return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-cuda-kernels: step 0 ('add_norm'): norm 'group_norm' is neither rms_norm nor layer_norm}}
  exec.program @forward entry "forward" stage 0 {
    %w0 = exec.weight "n" : tensor<8xf32>
    %b0 = exec.buffer i32 rows 16 width 1
    %b1 = exec.buffer i32 rows 16 width 1
    %b2 = exec.buffer f32 rows 16 width 8
    exec.inputs tokens(%b0) positions(%b1)
    exec.launch "add_norm" ins(%b2, %b2) weights(%w0) outs(%b2, %b2) {eps = 1.0e-5 : f64, norm = "group_norm"}
    exec.return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-cuda-kernels: step 0 ('expert_ffn'): 10 block rows do not split over 4 expert counts}}
  exec.program @forward entry "forward" stage 0 {
    %w0 = exec.weight "g" : tensor<4x16x8xf32> experts 4
    %w1 = exec.weight "u" : tensor<4x16x8xf32> experts 4
    %w2 = exec.weight "d" : tensor<4x8x16xf32> experts 4
    %b0 = exec.buffer i32 rows 16 width 1
    %b1 = exec.buffer i32 rows 16 width 1
    %b2 = exec.buffer f32 rows 10 width 8
    %b3 = exec.buffer i32 rows 1 width 4
    exec.inputs tokens(%b0) positions(%b1)
    exec.launch "expert_ffn" ins(%b2, %b3) weights(%w0, %w1, %w2) outs(%b2) {activation = "silu"}
    exec.return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-cuda-kernels: step 0 ('concat'): 1 widths for 2 inputs}}
  exec.program @forward entry "forward" stage 0 {
    %b0 = exec.buffer i32 rows 16 width 1
    %b1 = exec.buffer i32 rows 16 width 1
    %b2 = exec.buffer f32 rows 16 width 8
    %b3 = exec.buffer f32 rows 16 width 4
    exec.inputs tokens(%b0) positions(%b1)
    exec.launch "concat" ins(%b3, %b3) outs(%b2) {widths = [4]}
    exec.return
  }
}
