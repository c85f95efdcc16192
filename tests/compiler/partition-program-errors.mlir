// RUN: moe-opt --moe-partition --split-input-file -verify-diagnostics %s

// Diagnostics of moe-partition about the program it partitions, one input
// each (those about what earlier passes leave on the module:
// partition-errors.mlir). tp = 2 unless a case says otherwise.

// The stages must be contiguous: an op of layer 1 (stage 1) before one of
// layer 0 (stage 0).
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 2 : i64, tp = 1 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0, 1>, vocab_padded = 8 : i64}} {
  mesh.mesh @mesh(shape = 2x1x1)
  func.func @forward(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
    %w1 = moe.weight "l1" layer 1 : tensor<8x8xf32>
    %w0 = moe.weight "l0" layer 0 : tensor<8x8xf32>
    %a = moe.linear %x, %w1 : tensor<?x8xf32>, tensor<8x8xf32> -> tensor<?x8xf32>
    // expected-error @below {{'moe.linear' op belongs to pipeline stage 0 but follows an op of stage 1: the program does not cut into contiguous stages}}
    %b = moe.linear %a, %w0 : tensor<?x8xf32>, tensor<8x8xf32> -> tensor<?x8xf32>
    return %b : tensor<?x8xf32>
  }
}

// -----

// An expert_ffn's expert weights must be weights (moe.expert_weight).
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%b: tensor<8x16x64xf32>, %c: tensor<8xi32>, %g: tensor<8x32x64xf32>, %u: tensor<8x32x64xf32>, %d: tensor<8x64x32xf32>) -> tensor<8x16x64xf32> {
    // expected-error @below {{'moe.expert_ffn' op expected a weight operand}}
    %y = moe.expert_ffn silu %b, %c, %g, %u, %d : tensor<8x16x64xf32>, tensor<8xi32>, tensor<8x32x64xf32>, tensor<8x32x64xf32>, tensor<8x64x32xf32>
    return %y : tensor<8x16x64xf32>
  }
}

// -----

// An annotation on an activation is not one moe-partition reads: its users
// find no value.
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
    %s = mesh.shard %x to <@mesh, [[], [2]]> : tensor<?x8xf32>
    // expected-error @below {{'moe.add' op operand is not available on this stage}}
    %y = moe.add %s, %s : tensor<?x8xf32>
    return %y : tensor<?x8xf32>
  }
}

// -----

// A column-parallel output (split over tp) where a whole value is needed
// (its weight has 8 rows, as many as the vocabulary: its role, column,
// decides the split).
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
    %w = moe.weight "q" as column : tensor<8x8xf32>
    %ws = mesh.shard %w to <@mesh, [[2]]> : tensor<8x8xf32>
    %q = moe.linear %x, %ws : tensor<?x8xf32>, tensor<8x8xf32> -> tensor<?x8xf32>
    %g = moe.weight "g" : tensor<4x8xf32>
    %u = moe.weight "u" : tensor<4x8xf32>
    %d = moe.weight "d" : tensor<8x4xf32>
    // expected-error @below {{'moe.mlp' op needs a whole (replicated) operand but it is split over tensor parallelism; not supported yet}}
    %y = moe.mlp silu %q, %g, %u, %d : tensor<?x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<8x4xf32>
    return %y : tensor<?x8xf32>
  }
}

// -----

// A row-parallel layer reads a split input.
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
    %w = moe.weight "o" as row : tensor<8x8xf32>
    %ws = mesh.shard %w to <@mesh, [[], [2]]> : tensor<8x8xf32>
    // expected-error @below {{'moe.linear' op row-parallel weight needs a tensor-parallel split input}}
    %y = moe.linear %x, %ws : tensor<?x8xf32>, tensor<8x8xf32> -> tensor<?x8xf32>
    return %y : tensor<?x8xf32>
  }
}

// -----

module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
    %wq = moe.weight "q" as column : tensor<8x8xf32>
    %wqs = mesh.shard %wq to <@mesh, [[2]]> : tensor<8x8xf32>
    %q = moe.linear %x, %wqs : tensor<?x8xf32>, tensor<8x8xf32> -> tensor<?x8xf32>
    %w = moe.weight "o" as row : tensor<8x8xf32>
    %ws = mesh.shard %w to <@mesh, [[], [2]]> : tensor<8x8xf32>
    %b = moe.weight "o.bias" : tensor<8xf32>
    // expected-error @below {{'moe.linear' op a bias on a row-parallel layer is not supported yet}}
    %y = moe.linear %q, %ws, %b : tensor<?x8xf32>, tensor<8x8xf32>, tensor<8xf32> -> tensor<?x8xf32>
    return %y : tensor<?x8xf32>
  }
}

// -----

// Norm groups of 16 over a 48-wide value split into 24 per rank.
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%x: tensor<?x8xf32>) -> tensor<?x48xf32> {
    %wq = moe.weight "q" as column : tensor<48x8xf32>
    %wqs = mesh.shard %wq to <@mesh, [[2]]> : tensor<48x8xf32>
    %q = moe.linear %x, %wqs : tensor<?x8xf32>, tensor<48x8xf32> -> tensor<?x48xf32>
    %n = moe.weight "n" : tensor<16xf32>
    // expected-error @below {{'moe.rms_norm' op norm groups do not divide the tensor-parallel width}}
    %y = moe.rms_norm %q, %n eps = 1.0e-6 : tensor<?x48xf32>, tensor<16xf32>
    return %y : tensor<?x48xf32>
  }
}

// -----

// A partial sum (a row-parallel output) into RoPE.
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%x: tensor<?x8xf32>, %p: tensor<?xi32>) -> tensor<?x8xf32> {
    %wq = moe.weight "q" as column : tensor<8x8xf32>
    %wqs = mesh.shard %wq to <@mesh, [[2]]> : tensor<8x8xf32>
    %q = moe.linear %x, %wqs : tensor<?x8xf32>, tensor<8x8xf32> -> tensor<?x8xf32>
    %w = moe.weight "o" as row : tensor<8x8xf32>
    %ws = mesh.shard %w to <@mesh, [[], [2]]> : tensor<8x8xf32>
    %o = moe.linear %q, %ws : tensor<?x8xf32>, tensor<8x8xf32> -> tensor<?x8xf32>
    // expected-error @below {{'moe.rope' op rotates a partial sum}}
    %r = moe.rope %o, %p head_dim = 4 <kind = default, theta = 1.0e4, rotary_dim = 4> : tensor<?x8xf32>, tensor<?xi32>
    return %r : tensor<?x8xf32>
  }
}

// -----

// Three heads do not split over tp = 2.
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%q: tensor<?x12xf32>, %k: tensor<?x12xf32>, %v: tensor<?x12xf32>) -> tensor<?x12xf32> {
    // expected-error @below {{'moe.attention' op heads and KV heads must split over tp}}
    %a = moe.attention %q, %k, %v heads = 3 kv_heads = 3 scale = 0.5 : tensor<?x12xf32>, tensor<?x12xf32>, tensor<?x12xf32> -> tensor<?x12xf32>
    return %a : tensor<?x12xf32>
  }
}

// -----

// Whole query, key and value (not column-parallel outputs) under TP.
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%q: tensor<?x16xf32>, %k: tensor<?x8xf32>, %v: tensor<?x8xf32>) -> tensor<?x16xf32> {
    // expected-error @below {{'moe.attention' op expected head-split query, key and value under TP}}
    %a = moe.attention %q, %k, %v heads = 4 kv_heads = 2 scale = 0.5 : tensor<?x16xf32>, tensor<?x8xf32>, tensor<?x8xf32> -> tensor<?x16xf32>
    return %a : tensor<?x16xf32>
  }
}

// -----

// MLA's heads split over tp too.
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%q: tensor<?x36xf32>, %kv: tensor<?x60xf32>, %kr: tensor<?x8xf32>, %p: tensor<?xi32>) -> tensor<?x48xf32> {
    // expected-error @below {{'moe.mla_attention' op heads must split over tp}}
    %a = moe.mla_attention %q, %kv, %kr, %p heads = 3 scale = 0.25 <kind = default, theta = 1.0e4, rotary_dim = 8, interleaved = true> : tensor<?x36xf32>, tensor<?x60xf32>, tensor<?x8xf32>, tensor<?xi32> -> tensor<?x48xf32>
    return %a : tensor<?x48xf32>
  }
}

// -----

module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%q: tensor<?x48xf32>, %kv: tensor<?x80xf32>, %kr: tensor<?x8xf32>, %p: tensor<?xi32>) -> tensor<?x64xf32> {
    // expected-error @below {{'moe.mla_attention' op expected head-split query and kv and a whole key_rope under TP}}
    %a = moe.mla_attention %q, %kv, %kr, %p heads = 4 scale = 0.25 <kind = default, theta = 1.0e4, rotary_dim = 8, interleaved = true> : tensor<?x48xf32>, tensor<?x80xf32>, tensor<?x8xf32>, tensor<?xi32> -> tensor<?x64xf32>
    return %a : tensor<?x64xf32>
  }
}

// -----

// The gate of a shared expert multiplies a whole or partial value, not a
// split one.
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%x: tensor<?x8xf32>, %g: tensor<?x1xf32>) -> tensor<?x8xf32> {
    %wq = moe.weight "q" as column : tensor<8x8xf32>
    %wqs = mesh.shard %wq to <@mesh, [[2]]> : tensor<8x8xf32>
    %q = moe.linear %x, %wqs : tensor<?x8xf32>, tensor<8x8xf32> -> tensor<?x8xf32>
    // expected-error @below {{'moe.sigmoid_gate' op gates a tensor-parallel split value}}
    %y = moe.sigmoid_gate %q, %g : tensor<?x8xf32>, tensor<?x1xf32>
    return %y : tensor<?x8xf32>
  }
}

// -----

// Fused ops come after partitioning (moe-fuse-add-norm): no rule for them.
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%a: tensor<?x8xf32>) -> tensor<?x8xf32> {
    %w = moe.weight "n" : tensor<8xf32>
    // expected-error @below {{'moe.add_norm' op cannot be partitioned (no rule for this op)}}
    %s, %n = moe.add_norm %a, %a, %w eps = 1.0e-05 : tensor<?x8xf32>, tensor<8xf32>
    return %n : tensor<?x8xf32>
  }
}

// -----

// expected-error @below {{expected a single-block func.func @forward}}
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @stage0(%a: tensor<?x8xf32>) -> tensor<?x8xf32> {
    return %a : tensor<?x8xf32>
  }
}

// -----

// The vocabulary split follows the weight's role (embedding, lm_head), not
// its size: a head whose rows are not the vocabulary is refused.
module attributes {moe.vocab_size = 8 : i64, moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 16 : i64, max_sequences = 1 : i64}, moe.sharding = {dp = 1 : i64, pp = 1 : i64, tp = 2 : i64, ep = 1 : i64, etp = 1 : i64, stage_begin = array<i64: 0>, vocab_padded = 8 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%x: tensor<?x8xf32>) -> tensor<?x6xf32> {
    %w = moe.weight "lm_head.weight" as lm_head : tensor<6x8xf32>
    %ws = mesh.shard %w to <@mesh, [[2]]> : tensor<6x8xf32>
    // expected-error @below {{'moe.linear' op weight 'lm_head.weight' is the lm_head but has 6 rows for a vocabulary of 8}}
    %y = moe.linear %x, %ws : tensor<?x8xf32>, tensor<6x8xf32> -> tensor<?x6xf32>
    return %y : tensor<?x6xf32>
  }
}
