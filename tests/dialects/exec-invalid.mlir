// RUN: moe-opt --split-input-file --verify-diagnostics %s

// One case per verifier message of lib/Exec/IR/ExecDialect.cpp.

// expected-error @below {{'exec.program' op needs an entry name}}
exec.program @p entry "" stage 0 {
  exec.return
}

// -----

// expected-error @below {{'exec.program' op stage must be >= 0}}
exec.program @p entry "forward" stage -1 {
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  // expected-error @below {{'func.call' op cannot appear in an exec.program (lower it to exec ops first)}}
  func.call @f() : () -> ()
  exec.return
}

// -----

// expected-error @below {{'exec.program' op has more than one exec.inputs}}
exec.program @p entry "forward" stage 0 {
  %b = exec.buffer i32 rows 8 width 1
  exec.inputs tokens(%b) positions(%b)
  exec.inputs tokens(%b) positions(%b)
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  // expected-error @below {{'exec.buffer' op element type must be f32 or i32, got 'bf16'}}
  %b = exec.buffer bf16 rows 8 width 1
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  // expected-error @below {{'exec.buffer' op rows and width must be positive, got 0 x 4}}
  %b = exec.buffer f32 rows 0 width 4
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  // expected-error @below {{'exec.weight' op needs the checkpoint tensor's name}}
  %w = exec.weight "" : tensor<4xf32>
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  // expected-error @below {{'exec.weight' op 'w' needs a static tensor type, got 'tensor<?x4xf32>'}}
  %w = exec.weight "w" : tensor<?x4xf32>
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  // expected-error @below {{'exec.weight' op 'w': dtype 'f64' is not a checkpoint dtype (f32, bf16, f16, i32)}}
  %w = exec.weight "w" : tensor<4xf64>
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  // expected-error @below {{'exec.weight' op 'w': experts must be positive}}
  %w = exec.weight "w" : tensor<4x4xf32> experts 0
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  // expected-error @below {{'exec.launch' op needs a kernel id}}
  exec.launch "" {}
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  // expected-error @below {{'exec.launch' op constant 'm' is not an integer, float, string, bool, array or dictionary}}
  exec.launch "k" {m = @mesh}
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  %b = exec.buffer f32 rows 8 width 4
  // expected-error @below {{'exec.collective' op unknown collective 'broadcast' (expected all_reduce, all_gather, all_to_all, reduce_scatter, send or recv)}}
  exec.collective "broadcast" ins(%b) outs(%b) {}
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  %b = exec.buffer f32 rows 8 width 4
  // expected-error @below {{'exec.collective' op 'all_reduce' needs its group: over @mesh["axis"]}}
  exec.collective "all_reduce" ins(%b) outs(%b) {}
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  %b = exec.buffer f32 rows 8 width 4
  // expected-error @below {{'exec.collective' op 'send' names a stage, not a group}}
  exec.collective "send" over @mesh["pp"] ins(%b) {stage = 1}
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  %b = exec.buffer f32 rows 8 width 4
  // expected-error @below {{'exec.collective' op 'recv' needs the peer stage (constant 'stage')}}
  exec.collective "recv" outs(%b) {}
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  %b = exec.buffer f32 rows 8 width 4
  // expected-error @below {{'exec.collective' op constant 'x' is not an integer, float, string, bool, array or dictionary}}
  exec.collective "all_gather" over @mesh["tp"] ins(%b) outs(%b) {x = f32}
  exec.return
}

// -----

func.func @f() {
  // expected-error @below {{'exec.launch' op expects parent op 'exec.program'}}
  exec.launch "k" {}
  return
}

// -----

exec.program @p entry "forward" stage 0 {
  %b = exec.buffer f32 rows 8 width 4
  // expected-error @below {{'exec.launch' op 'add': a lowered launch needs its rows}}
  exec.launch "add" ins(%b) outs(%b) {} kernels {
    exec.dispatch "k" grid([1, 1, 0], [0, 1, 1], [0, 1, 1]) block 32 params [] {shared_bytes = 0}
  }
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  %b = exec.buffer f32 rows 8 width 4
  exec.launch "add" ins(%b) outs(%b) rows "T" {} kernels {
    // expected-error @below {{'exec.kernels' op cannot appear in a launch's kernels (exec.dispatch or exec.gemm)}}
    exec.kernels "cuda" names [] scratch [] attributes {rope_tables = [], source = ""}
  }
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  %b = exec.buffer f32 rows 8 width 4
  exec.launch "add" ins(%b) outs(%b) rows "T" {} kernels {
    // expected-error @below {{'exec.dispatch' op 'k': each grid dimension is [a, d, c] (ceil(a * N / d) + c) with a, c >= 0 and d >= 1}}
    exec.dispatch "k" grid([1, 0, 0], [0, 1, 1], [0, 1, 1]) block 32 params [] {shared_bytes = 0}
  }
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  %b = exec.buffer f32 rows 8 width 4
  exec.launch "add" ins(%b) outs(%b) rows "T" {} kernels {
    // expected-error @below {{'exec.dispatch' op 'k': block must be in [1, 1024], got 2048}}
    exec.dispatch "k" grid([1, 1, 0], [0, 1, 1], [0, 1, 1]) block 2048 params [] {shared_bytes = 0}
  }
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  %b = exec.buffer f32 rows 8 width 4
  exec.launch "add" ins(%b) outs(%b) rows "T" {} kernels {
    // expected-error @below {{'exec.dispatch' op 'k': shared_bytes must be >= 0}}
    exec.dispatch "k" grid([1, 1, 0], [0, 1, 1], [0, 1, 1]) block 32 params [] {shared_bytes = -4}
  }
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  %b = exec.buffer f32 rows 8 width 4
  exec.launch "linear" ins(%b) outs(%b) rows "T" {} kernels {
    // expected-error @below {{'exec.gemm' op n, k and batch must be positive}}
    exec.gemm("buf:0", "weight:0") -> "buf:0" m "T" n 0 k 4 {b_dtype = "F32", batch = 1, lda = 4, ldb = 4, ldc = 4, transpose_b = true}
  }
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  %b = exec.buffer f32 rows 8 width 4
  exec.launch "linear" ins(%b) outs(%b) rows "T" {} kernels {
    // expected-error @below {{'exec.gemm' op lda must be >= k and ldc >= n}}
    exec.gemm("buf:0", "weight:0") -> "buf:0" m "T" n 4 k 4 {b_dtype = "F32", batch = 1, lda = 2, ldb = 4, ldc = 4, transpose_b = true}
  }
  exec.return
}

// -----

exec.program @p entry "train" stage 0 {
  %b = exec.buffer f32 rows 8 width 4
  exec.launch "linear_grad" ins(%b) outs(%b) rows "T" {} kernels {
    // expected-error @below {{'exec.gemm' op ldb must be >= k (transpose_b) or n}}
    exec.gemm("buf:0", "buf:0") -> "buf:0" m "4" n 6 k 8 {b_dtype = "F32", batch = 1, lda = 4, ldb = 4, ldc = 6, transpose_a = true, transpose_b = false, k_rows = "T"}
  }
  exec.return
}

// -----

exec.program @p entry "train" stage 0 {
  %b = exec.buffer f32 rows 8 width 4
  exec.launch "linear_grad" ins(%b) outs(%b) rows "T" {} kernels {
    // expected-error @below {{'exec.gemm' op k_rows must be "T" or "R"}}
    exec.gemm("buf:0", "buf:0") -> "buf:0" m "4" n 4 k 8 {b_dtype = "F32", batch = 1, lda = 4, ldb = 4, ldc = 4, transpose_a = true, transpose_b = false, k_rows = "8"}
  }
  exec.return
}

// -----

exec.program @p entry "train" stage 0 {
  %b = exec.buffer f32 rows 8 width 4
  exec.launch "linear_grad" ins(%b) outs(%b) rows "T" {} kernels {
    // expected-error @below {{'exec.gemm' op a batched gemm takes no k_rows (its blocks' rows come from counts)}}
    exec.gemm("buf:0", "buf:0") -> "buf:0" m "4" n 4 k 8 {b_dtype = "F32", batch = 2, lda = 4, ldb = 4, ldc = 4, stride_a = 1, stride_b = 1, stride_c = 1, transpose_a = true, transpose_b = false, k_rows = "T"}
  }
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  %b = exec.buffer f32 rows 8 width 4
  exec.launch "linear" ins(%b) outs(%b) rows "T" {} kernels {
    // expected-error @below {{'exec.gemm' op a batched gemm needs stride_a, stride_b and stride_c}}
    exec.gemm("buf:0", "weight:0") -> "buf:0" m "T" n 4 k 4 {b_dtype = "F32", batch = 2, lda = 4, ldb = 4, ldc = 4, transpose_b = true}
  }
  exec.return
}

// -----

exec.program @train entry "train" stage 0 {
  %g = exec.buffer f32 rows 4 width 4
  %w = exec.weight "w" : tensor<4x4xf32>
  // expected-error @below {{'exec.return' op expected one weight per gradient but got 2 gradients of 1 weights}}
  exec.return gradients(%g, %g) of(%w)
}

// -----

exec.program @p entry "optimizer" stage 0 {
  // expected-error @below {{'exec.buffer' op a state buffer needs a name and f32 values}}
  %b = exec.buffer i32 rows 1 width 4 {state = "exp_avg:w"}
  exec.return
}

// -----

exec.program @p entry "optimizer" stage 0 {
  %b = exec.buffer f32 rows 1 width 4
  // expected-error @below {{'exec.launch' op 'adamw': updates_weights without weights}}
  exec.launch "adamw" ins(%b) outs(%b) {} {updates_weights}
  exec.return
}

// -----

exec.program @p entry "optimizer" stage 0 {
  %t = exec.buffer i32 rows 8 width 1
  // expected-error @below {{'exec.inputs' op an optimizer program's step is its only input}}
  exec.inputs tokens(%t) positions(%t) step(%t)
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  %t = exec.buffer i32 rows 8 width 1
  // expected-error @below {{'exec.inputs' op expected tokens and positions together}}
  exec.inputs tokens(%t)
  exec.return
}

// -----

exec.program @p entry "forward" stage 0 {
  // expected-error @below {{'exec.inputs' op expected tokens and positions, or an optimizer's step}}
  exec.inputs
  exec.return
}

// -----

exec.program @p entry "optimizer" stage 0 {
  // expected-error @below {{'exec.buffer' op logical_rows: only a state buffer is a ZeRO shard}}
  %b = exec.buffer f32 rows 2 width 4 {logical_rows = 4 : i64}
  exec.return
}

// -----

exec.program @p entry "optimizer" stage 0 {
  // expected-error @below {{'exec.buffer' op logical_rows must be positive, got 0}}
  %b = exec.buffer f32 rows 2 width 4 {logical_rows = 0 : i64, state = "exp_avg:w"}
  exec.return
}

// -----

exec.program @p entry "optimizer" stage 0 {
  // expected-error @below {{'exec.buffer' op shard_group: only a ZeRO shard (logical_rows) has one}}
  %b = exec.buffer f32 rows 2 width 4 {shard_group = "edp", state = "exp_avg:w"}
  exec.return
}

// -----

exec.program @p entry "optimizer" stage 0 {
  // expected-error @below {{'exec.buffer' op shard_group 'ep': expected dp or edp}}
  %b = exec.buffer f32 rows 2 width 4 {logical_rows = 4 : i64, shard_group = "ep", state = "exp_avg:w"}
  exec.return
}

// -----

exec.program @p entry "optimizer" stage 0 {
  %w = exec.weight "w" : tensor<4x4xf32>
  // expected-error @below {{'exec.collective' op a collective of a weight is an all_gather of one weight in place, with its 'shard_rows' (ZeRO)}}
  exec.collective "all_reduce" over @mesh["dp"] weights(%w) {shard_rows = 2 : i64}
  exec.return
}

// -----

exec.program @p entry "optimizer" stage 0 {
  %w = exec.weight "w" : tensor<4x4xf32>
  // expected-error @below {{'exec.collective' op a collective of a weight is an all_gather of one weight in place, with its 'shard_rows' (ZeRO)}}
  exec.collective "all_gather" over @mesh["dp"] weights(%w) {}
  exec.return
}
