// RUN: moe-opt --moe-verify-exec-collectives --split-input-file --verify-diagnostics %s | FileCheck %s

// moe-verify-exec-collectives: the exec programs of every rank, a training
// plan's train program (micro_batches / dp times) and optimizer program as
// one update. Hand-written per-rank programs (moe.ranks) stand for what a
// wrong pass could write.

// Two ZeRO-1 replicas: the sums added, the weight updated by rows and
// gathered; the same schedule on both ranks: proven.
// CHECK: module attributes {moe.exec_collectives_verified
module attributes {moe.sharding = {dp = 2 : i64, pp = 1 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64}} {
  exec.program @stage0 entry "train" stage 0 {
    %t = exec.buffer i32 rows 8 width 1
    %sum = exec.buffer f32 rows 4 width 4 {state = "grad_sum:w"}
    exec.inputs tokens(%t) positions(%t)
    exec.return
  }
  exec.program @stage0_optimizer entry "optimizer" stage 0 attributes {micro_batches = 4 : i64} {
    %w = exec.weight "w" : tensor<4x4xf32>
    %step = exec.buffer i32 rows 1 width 1
    %sum = exec.buffer f32 rows 4 width 4 {state = "grad_sum:w"}
    %m = exec.buffer f32 rows 2 width 4 {logical_rows = 4 : i64, state = "exp_avg:w"}
    exec.inputs step(%step)
    exec.collective "all_reduce" over @mesh["dp"] ins(%sum) outs(%sum) {}
    exec.collective "all_gather" over @mesh["dp"] weights(%w) {shard_rows = 2 : i64}
    exec.return
  }
}

// -----

// ZeRO-2: rank 1's train program skips the reduce_scatter of a gradient
// into its shard (a pass that dropped it where the gradient was "empty"):
// rank 0 waits in it on the first micro-batch, and rank 1 in the
// optimizer's all_reduce of the sums of squares.
// expected-error@+1 {{collectives of a training update (train, then optimizer) do not match: 2 of 2 ranks would wait forever (deadlock):}}
module attributes {moe.sharding = {dp = 2 : i64, pp = 1 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64}} {
  exec.program @rank0 entry "train" stage 0 attributes {moe.ranks = array<i64: 0>} {
    %g = exec.buffer f32 rows 4 width 4
    %sum = exec.buffer f32 rows 2 width 4 {logical_rows = 4 : i64, state = "grad_sum:w"}
    exec.collective "reduce_scatter" over @mesh["dp"] ins(%g, %sum) outs(%sum) {shard_rows = 2 : i64}
    exec.return
  }
  exec.program @rank1 entry "train" stage 0 attributes {moe.ranks = array<i64: 1>} {
    %g = exec.buffer f32 rows 4 width 4
    %sum = exec.buffer f32 rows 2 width 4 {logical_rows = 4 : i64, state = "grad_sum:w"}
    exec.return
  }
  exec.program @stage0_optimizer entry "optimizer" stage 0 attributes {micro_batches = 2 : i64} {
    %sq = exec.buffer f32 rows 1 width 1
    %sqe = exec.buffer f32 rows 1 width 1
    exec.collective "all_reduce" over @mesh["dp"] ins(%sq, %sqe) outs(%sq, %sqe) {}
    exec.return
  }
}

// -----

// With two micro-batches per replica the train program runs twice per
// update: rank 1 reduce-scatters a different gradient shape (wrong counts).
module attributes {moe.sharding = {dp = 2 : i64, pp = 1 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64}} {
  exec.program @rank0 entry "train" stage 0 attributes {moe.ranks = array<i64: 0>} {
    %g = exec.buffer f32 rows 4 width 4
    %sum = exec.buffer f32 rows 2 width 4 {logical_rows = 4 : i64, state = "grad_sum:w"}
    // expected-error@+1 {{ranks 0 and 1 meet in reduce_scatter with different shapes: reduce_scatter over @mesh["dp"] (ins(f32 4x4, f32 2x4 of 4) outs(f32 2x4 of 4)) {shard_rows = 2 : i64} in @rank0}}
    exec.collective "reduce_scatter" over @mesh["dp"] ins(%g, %sum) outs(%sum) {shard_rows = 2 : i64}
    exec.return
  }
  exec.program @rank1 entry "train" stage 0 attributes {moe.ranks = array<i64: 1>} {
    %g = exec.buffer f32 rows 6 width 4
    %sum = exec.buffer f32 rows 3 width 4 {logical_rows = 6 : i64, state = "grad_sum:w"}
    exec.collective "reduce_scatter" over @mesh["dp"] ins(%g, %sum) outs(%sum) {shard_rows = 3 : i64}
    exec.return
  }
  exec.program @stage0_optimizer entry "optimizer" stage 0 attributes {micro_batches = 4 : i64} {
    exec.return
  }
}

// -----

// Rank 1 skips the all_gather of the weight: rank 0 waits in it forever.
// expected-error@+1 {{collectives of a training update (train, then optimizer) do not match: 1 of 2 ranks would wait forever (deadlock):}}
module attributes {moe.sharding = {dp = 2 : i64, pp = 1 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64}} {
  exec.program @stage0 entry "train" stage 0 {
    exec.return
  }
  exec.program @rank0_optimizer entry "optimizer" stage 0 attributes {micro_batches = 2 : i64, moe.ranks = array<i64: 0>} {
    %w = exec.weight "w" : tensor<4x4xf32>
    %sum = exec.buffer f32 rows 4 width 4 {state = "grad_sum:w"}
    exec.collective "all_reduce" over @mesh["dp"] ins(%sum) outs(%sum) {}
    exec.collective "all_gather" over @mesh["dp"] weights(%w) {shard_rows = 2 : i64}
    exec.return
  }
  exec.program @rank1_optimizer entry "optimizer" stage 0 attributes {micro_batches = 2 : i64, moe.ranks = array<i64: 1>} {
    %w = exec.weight "w" : tensor<4x4xf32>
    %sum = exec.buffer f32 rows 4 width 4 {state = "grad_sum:w"}
    exec.collective "all_reduce" over @mesh["dp"] ins(%sum) outs(%sum) {}
    exec.return
  }
}

// -----

// The message names the rank and the op it waits in, with its program.
// expected-error@+1 {{rank 0 waits in all_gather over @mesh["dp"] (weights('w' tensor<4x4xf32>)) {shard_rows = 2 : i64} in @rank0_optimizer}}
module attributes {moe.sharding = {dp = 2 : i64, pp = 1 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64}} {
  exec.program @stage0 entry "train" stage 0 {
    exec.return
  }
  exec.program @rank0_optimizer entry "optimizer" stage 0 attributes {micro_batches = 2 : i64, moe.ranks = array<i64: 0>} {
    %w = exec.weight "w" : tensor<4x4xf32>
    exec.collective "all_gather" over @mesh["dp"] weights(%w) {shard_rows = 2 : i64}
    exec.return
  }
  exec.program @rank1_optimizer entry "optimizer" stage 0 attributes {micro_batches = 2 : i64, moe.ranks = array<i64: 1>} {
    exec.return
  }
}

// -----

// Swapped order: rank 1 gathers the weight before it adds the sums; each
// waits for the other.
// expected-error@+1 {{2 of 2 ranks would wait forever (deadlock):}}
module attributes {moe.sharding = {dp = 2 : i64, pp = 1 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64}} {
  exec.program @stage0 entry "train" stage 0 {
    exec.return
  }
  exec.program @rank0_optimizer entry "optimizer" stage 0 attributes {micro_batches = 2 : i64, moe.ranks = array<i64: 0>} {
    %w = exec.weight "w" : tensor<4x4xf32>
    %sum = exec.buffer f32 rows 4 width 4 {state = "grad_sum:w"}
    exec.collective "all_reduce" over @mesh["dp"] ins(%sum) outs(%sum) {}
    exec.collective "all_gather" over @mesh["dp"] weights(%w) {shard_rows = 2 : i64}
    exec.return
  }
  exec.program @rank1_optimizer entry "optimizer" stage 0 attributes {micro_batches = 2 : i64, moe.ranks = array<i64: 1>} {
    %w = exec.weight "w" : tensor<4x4xf32>
    %sum = exec.buffer f32 rows 4 width 4 {state = "grad_sum:w"}
    exec.collective "all_gather" over @mesh["dp"] weights(%w) {shard_rows = 2 : i64}
    exec.collective "all_reduce" over @mesh["dp"] ins(%sum) outs(%sum) {}
    exec.return
  }
}

// -----

// Wrong counts: the members gather with different shard rows.
module attributes {moe.sharding = {dp = 2 : i64, pp = 1 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64}} {
  exec.program @stage0 entry "train" stage 0 {
    exec.return
  }
  exec.program @rank0_optimizer entry "optimizer" stage 0 attributes {micro_batches = 2 : i64, moe.ranks = array<i64: 0>} {
    %w = exec.weight "w" : tensor<4x4xf32>
    // expected-error-re@+1 {{ranks 0 and 1 meet in all_gather with different shapes: all_gather over @mesh["dp"] (weights('w' tensor<4x4xf32>)) {shard_rows = 2 : i64} in @rank0_optimizer at {{.+}} vs all_gather over @mesh["dp"] (weights('w' tensor<4x4xf32>)) {shard_rows = 3 : i64} in @rank1_optimizer}}
    exec.collective "all_gather" over @mesh["dp"] weights(%w) {shard_rows = 2 : i64}
    exec.return
  }
  exec.program @rank1_optimizer entry "optimizer" stage 0 attributes {micro_batches = 2 : i64, moe.ranks = array<i64: 1>} {
    %w = exec.weight "w" : tensor<4x4xf32>
    exec.collective "all_gather" over @mesh["dp"] weights(%w) {shard_rows = 3 : i64}
    exec.return
  }
}

// -----

// Wrong counts: the sums the members add are of different sizes.
module attributes {moe.sharding = {dp = 2 : i64, pp = 1 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64}} {
  exec.program @stage0 entry "train" stage 0 {
    exec.return
  }
  exec.program @rank0_optimizer entry "optimizer" stage 0 attributes {micro_batches = 2 : i64, moe.ranks = array<i64: 0>} {
    %sum = exec.buffer f32 rows 4 width 4 {state = "grad_sum:w"}
    // expected-error@+1 {{ranks 0 and 1 meet in all_reduce with different shapes: all_reduce over @mesh["dp"] (ins(f32 4x4) outs(f32 4x4))}}
    exec.collective "all_reduce" over @mesh["dp"] ins(%sum) outs(%sum) {}
    exec.return
  }
  exec.program @rank1_optimizer entry "optimizer" stage 0 attributes {micro_batches = 2 : i64, moe.ranks = array<i64: 1>} {
    %sum = exec.buffer f32 rows 2 width 4 {state = "grad_sum:w"}
    exec.collective "all_reduce" over @mesh["dp"] ins(%sum) outs(%sum) {}
    exec.return
  }
}

// -----

// The train program runs micro_batches / dp times per update: a train
// program with a collective (here an all_reduce over tp, two TP ranks of
// one replica) that one rank's optimizer follows with an all_reduce the
// other rank's does not have. Rank 1 runs the train program's all_reduce
// twice, then waits in the optimizer's.
// expected-error@+1 {{1 of 2 ranks would wait forever (deadlock):}}
module attributes {moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64}} {
  exec.program @stage0 entry "train" stage 0 {
    %x = exec.buffer f32 rows 8 width 4
    exec.collective "all_reduce" over @mesh["tp"] ins(%x) outs(%x) {}
    exec.return
  }
  exec.program @rank0_optimizer entry "optimizer" stage 0 attributes {micro_batches = 2 : i64, moe.ranks = array<i64: 0>} {
    exec.return
  }
  exec.program @rank1_optimizer entry "optimizer" stage 0 attributes {micro_batches = 2 : i64, moe.ranks = array<i64: 1>} {
    %x = exec.buffer f32 rows 8 width 4
    exec.collective "all_reduce" over @mesh["tp"] ins(%x) outs(%x) {}
    exec.return
  }
}

// -----

// Inference entries are schedules of their own: a pipeline's send meets
// its recv.
// CHECK: module attributes {moe.exec_collectives_verified
module attributes {moe.sharding = {dp = 1 : i64, pp = 2 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64}} {
  exec.program @stage0 entry "forward" stage 0 {
    %x = exec.buffer f32 rows 8 width 4
    exec.collective "send" ins(%x) {stage = 1 : i64}
    exec.return
  }
  exec.program @stage1 entry "forward" stage 1 {
    %x = exec.buffer f32 rows 8 width 4
    exec.collective "recv" outs(%x) {stage = 0 : i64}
    exec.return
  }
}

// -----

module attributes {moe.sharding = {dp = 1 : i64, pp = 2 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64}} {
  exec.program @stage0 entry "forward" stage 0 {
    %x = exec.buffer f32 rows 8 width 4
    // expected-error@+1 {{rank 0: send to stage 1 (ins(f32 8x4)) in @stage0 at}}
    exec.collective "send" ins(%x) {stage = 1 : i64}
    exec.return
  }
  exec.program @stage1 entry "forward" stage 1 {
    %x = exec.buffer f32 rows 8 width 8
    exec.collective "recv" outs(%x) {stage = 0 : i64}
    exec.return
  }
}

// -----

// expected-error@+1 {{rank 1 has no exec.program of entry 'forward'}}
module attributes {moe.sharding = {dp = 2 : i64, pp = 1 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64}} {
  exec.program @rank0 entry "forward" stage 0 attributes {moe.ranks = array<i64: 0>} {
    exec.return
  }
}
