// RUN: moe-opt --moe-lower-to-exec --split-input-file -verify-diagnostics %s

// Diagnostics of moe-lower-to-exec, one input each.

// expected-error @below {{moe-lower-to-exec: expected a module with moe.workload (run moe-specialize-workload)}}
module {
}

// -----

// expected-error @below {{moe-lower-to-exec: expected @forward or @stage0.. programs}}
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-lower-to-exec: @forward has no assigned buffers (run moe-assign-buffers)}}
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) {
    return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  func.func @stage0(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) attributes {moe.stage = 0 : i64} {
    return
  }
  // expected-error @below {{moe-lower-to-exec: expected the stages in order}}
  func.func @stage2(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) attributes {moe.stage = 2 : i64} {
    return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) attributes {moe.arg_buffers = array<i64: 0, 1>, moe.buffer_rows = array<i64: -1, -1>, moe.buffer_types = [i32, i32], moe.buffer_widths = array<i64: 1, 1>} {
    // expected-error @below {{moe-lower-to-exec: @forward: weight 'model.norm.weight' is bound by no op}}
    %norm = moe.weight "model.norm.weight" : tensor<64xf32>
    return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) attributes {moe.arg_buffers = array<i64: 0, 1>, moe.buffer_rows = array<i64: -1, -1>, moe.buffer_types = [i32, i32], moe.buffer_widths = array<i64: 1, 1>} {
    %table = moe.weight "model.embed_tokens.weight" : tensor<251x64xf32>
    // expected-error @below {{moe-lower-to-exec: buffer 2 is not declared}}
    %h = moe.embedding %table[%tokens] {moe.buffers = array<i64: 2>} : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) attributes {moe.arg_buffers = array<i64: 0, 1>, moe.buffer_rows = array<i64: -1, -1, -1, -1>, moe.buffer_types = [i32, i32, f32, f32], moe.buffer_widths = array<i64: 1, 1, 64, 64>} {
    %table = moe.weight "model.embed_tokens.weight" : tensor<251x64xf32>
    %h = moe.embedding %table[%tokens] {moe.buffers = array<i64: 2>} : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    // expected-error @below {{moe-lower-to-exec: expected KV cache 0 here, got 1}}
    %a = moe.attention %h, %h, %h heads = 4 kv_heads = 4 scale = 0.25 {moe.buffers = array<i64: 3>, moe.kv_cache = 1 : i64} : tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x64xf32> -> tensor<?x64xf32>
    return
  }
}

// -----

// A partial sum still marked for moe-insert-collectives: lowering it would
// drop its all_reduce.
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) attributes {moe.arg_buffers = array<i64: 0, 1>, moe.buffer_rows = array<i64: -1, -1, -1>, moe.buffer_types = [i32, i32, f32], moe.buffer_widths = array<i64: 1, 1, 64>} {
    %table = moe.weight "model.embed_tokens.weight" : tensor<251x64xf32>
    %h = moe.embedding %table[%tokens] {moe.buffers = array<i64: 2>} : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    // expected-error @below {{moe-lower-to-exec: a resharding that no collective implements (run moe-insert-collectives)}}
    %p = mesh.shard %h to <@mesh, [[]], partial = sum[2]> : tensor<?x64xf32>
    return
  }
}

// -----

// An op still carrying moe-partition's exchange mark (the check reads only
// the mark, so the first op of a program shows it).
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  mesh.mesh @experts(shape = 1x1x2x1)
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) attributes {moe.arg_buffers = array<i64: 0, 1>, moe.buffer_rows = array<i64: -1, -1, -1>, moe.buffer_types = [i32, i32, f32], moe.buffer_widths = array<i64: 1, 1, 64>} {
    %table = moe.weight "model.embed_tokens.weight" : tensor<251x64xf32>
    // expected-error @below {{moe-lower-to-exec: an expert exchange that no collective implements (run moe-insert-collectives)}}
    %h = moe.embedding %table[%tokens] {moe.buffers = array<i64: 2>, moe.exchange = {mesh = @experts, axis = 2 : i64}} : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    return
  }
}

// -----

// A gather of parts still marked (moe.gather).
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) attributes {moe.arg_buffers = array<i64: 0, 1>, moe.buffer_rows = array<i64: -1, -1, -1>, moe.buffer_types = [i32, i32, f32], moe.buffer_widths = array<i64: 1, 1, 64>} {
    %table = moe.weight "model.embed_tokens.weight" : tensor<251x64xf32>
    %h = moe.embedding %table[%tokens] {moe.buffers = array<i64: 2>} : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    // expected-error @below {{moe-lower-to-exec: a gather of parts that no collective implements (run moe-insert-collectives)}}
    %w = builtin.unrealized_conversion_cast %h : tensor<?x64xf32> to tensor<?x128xf32> {moe.gather = {mesh = @mesh, axis = 2 : i64}}
    return
  }
}

// -----

// A stage program whose signature still carries the values of another stage.
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-lower-to-exec: @stage0 takes or gives values of another stage that no send / recv implements (run moe-insert-collectives)}}
  func.func @stage0(%tokens: tensor<?xi32>, %positions: tensor<?xi32>, %x: tensor<?x64xf32>) -> (tensor<?x64xf32> {moe.send_to = 1 : i64}) attributes {moe.stage = 0 : i64, moe.arg_buffers = array<i64: 0, 1>, moe.buffer_rows = array<i64: -1, -1>, moe.buffer_types = [i32, i32], moe.buffer_widths = array<i64: 1, 1>} {
    return %x : tensor<?x64xf32>
  }
}

// -----

// The program takes the tokens and positions (two arguments, two buffers).
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-lower-to-exec: expected the arguments tokens and positions}}
  func.func @forward(%tokens: tensor<?xi32>) attributes {moe.arg_buffers = array<i64: 0>, moe.buffer_rows = array<i64: -1>, moe.buffer_types = [i32], moe.buffer_widths = array<i64: 1>} {
    return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-lower-to-exec: argument buffer 5 is not declared}}
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) attributes {moe.arg_buffers = array<i64: 0, 5>, moe.buffer_rows = array<i64: -1, -1>, moe.buffer_types = [i32, i32], moe.buffer_widths = array<i64: 1, 1>} {
    return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) attributes {moe.arg_buffers = array<i64: 0, 1>, moe.buffer_rows = array<i64: -1, -1, -1, -1>, moe.buffer_types = [i32, i32, f32, f32], moe.buffer_widths = array<i64: 1, 1, 64, 64>} {
    %table = moe.weight "model.embed_tokens.weight" : tensor<251x64xf32>
    %h = moe.embedding %table[%tokens] {moe.buffers = array<i64: 2>} : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    // expected-error @below {{moe-lower-to-exec: a KV cache on an op that is not attention}}
    %a = moe.add %h, %h {moe.buffers = array<i64: 3>, moe.kv_cache = 0 : i64} : tensor<?x64xf32>
    return
  }
}

// -----

// An annotation on an activation leaves its users without a buffer.
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  mesh.mesh @mesh(shape = 1x1x2)
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) attributes {moe.arg_buffers = array<i64: 0, 1>, moe.buffer_rows = array<i64: -1, -1, -1, -1>, moe.buffer_types = [i32, i32, f32, f32], moe.buffer_widths = array<i64: 1, 1, 64, 64>} {
    %table = moe.weight "model.embed_tokens.weight" : tensor<251x64xf32>
    %h = moe.embedding %table[%tokens] {moe.buffers = array<i64: 2>} : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    %s = mesh.shard %h to <@mesh, [[]]> : tensor<?x64xf32>
    // expected-error @below {{moe-lower-to-exec: an operand has no buffer}}
    %a = moe.add %s, %s {moe.buffers = array<i64: 3>} : tensor<?x64xf32>
    return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) attributes {moe.arg_buffers = array<i64: 0, 1>, moe.buffer_rows = array<i64: -1, -1, -1, -1>, moe.buffer_types = [i32, i32, f32, f32], moe.buffer_widths = array<i64: 1, 1, 64, 64>} {
    %table = moe.weight "model.embed_tokens.weight" : tensor<251x64xf32>
    %h = moe.embedding %table[%tokens] {moe.buffers = array<i64: 2>} : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    // expected-error @below {{moe-lower-to-exec: no assigned buffers (run moe-assign-buffers)}}
    %a = moe.add %h, %h : tensor<?x64xf32>
    return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) attributes {moe.arg_buffers = array<i64: 0, 1>, moe.buffer_rows = array<i64: -1, -1, -1, -1>, moe.buffer_types = [i32, i32, f32, f32], moe.buffer_widths = array<i64: 1, 1, 64, 64>} {
    %table = moe.weight "model.embed_tokens.weight" : tensor<251x64xf32>
    %h = moe.embedding %table[%tokens] {moe.buffers = array<i64: 2>} : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    // expected-error @below {{moe-lower-to-exec: expected one buffer per result}}
    %a = moe.add %h, %h {moe.buffers = array<i64: 3, 2>} : tensor<?x64xf32>
    return
  }
}

// -----

module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 2 : i64}} {
  // expected-error @below {{moe-lower-to-exec: expected a single-block program}}
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) attributes {moe.arg_buffers = array<i64: 0, 1>, moe.buffer_rows = array<i64: -1, -1>, moe.buffer_types = [i32, i32], moe.buffer_widths = array<i64: 1, 1>} {
    return
  ^bb1:
    return
  }
}
