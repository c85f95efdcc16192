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
