// RUN: moe-opt --moe-assign-buffers --split-input-file %s | FileCheck %s

// A value's buffer is reused once its last use has passed; add, rms_norm and
// rope write over a dying operand of the same type.
// CHECK-LABEL: module
// CHECK: func.func @forward({{.*}}) {{.*}}attributes {moe.arg_buffers = array<i64: 0, 1>, moe.buffer_rows = array<i64: -1, -1, -1, -1, -1, -1>, moe.buffer_types = [i32, i32, f32, f32, f32, f32], moe.buffer_widths = array<i64: 1, 1, 64, 64, 32, 251>}
module {
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) -> tensor<?x251xf32> {
    %table = moe.weight "model.embed_tokens.weight" : tensor<251x64xf32>
    // CHECK: moe.embedding {{.*}} {moe.buffers = array<i64: 2>}
    %h = moe.embedding %table[%tokens] : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    %nw = moe.weight "model.layers.0.input_layernorm.weight" : tensor<64xf32>
    // CHECK: moe.rms_norm {{.*}} {moe.buffers = array<i64: 3>}
    %n = moe.rms_norm %h, %nw eps = 1.0e-6 : tensor<?x64xf32>, tensor<64xf32>
    %wk = moe.weight "model.layers.0.self_attn.k_proj.weight" : tensor<32x64xf32>
    // CHECK: moe.linear {{.*}} {moe.buffers = array<i64: 4>}
    %k = moe.linear %n, %wk : tensor<?x64xf32>, tensor<32x64xf32> -> tensor<?x32xf32>
    // The rope result takes over %k's buffer: %k dies here.
    // CHECK: moe.rope {{.*}} {moe.buffers = array<i64: 4>}
    %kr = moe.rope %k, %positions head_dim = 16 <kind = default, theta = 1.0e4, rotary_dim = 16> : tensor<?x32xf32>, tensor<?xi32>
    %wo = moe.weight "model.layers.0.self_attn.o_proj.weight" : tensor<64x32xf32>
    // %n is dead after the k projection: its buffer 3 is free again.
    // CHECK: moe.linear {{.*}} {moe.buffers = array<i64: 3>}
    %o = moe.linear %kr, %wo : tensor<?x32xf32>, tensor<64x32xf32> -> tensor<?x64xf32>
    // CHECK: moe.add {{.*}} {moe.buffers = array<i64: 2>}
    %h1 = moe.add %h, %o : tensor<?x64xf32>
    %head = moe.weight "lm_head.weight" : tensor<251x64xf32>
    // CHECK: moe.linear {{.*}} {moe.buffers = array<i64: 5>}
    %logits = moe.linear %h1, %head : tensor<?x64xf32>, tensor<251x64xf32> -> tensor<?x251xf32>
    return %logits : tensor<?x251xf32>
  }
}

// -----

// Attention ops get KV-cache ids in order.
// CHECK-LABEL: module
// CHECK: moe.attention {{.*}}moe.kv_cache = 0 : i64
// CHECK: moe.attention {{.*}}moe.kv_cache = 1 : i64
module {
  func.func @forward(%tokens: tensor<?xi32>, %positions: tensor<?xi32>) -> tensor<?x64xf32> {
    %table = moe.weight "model.embed_tokens.weight" : tensor<251x64xf32>
    %q = moe.embedding %table[%tokens] : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    %a = moe.attention %q, %q, %q heads = 4 kv_heads = 4 scale = 0.25 : tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x64xf32> -> tensor<?x64xf32>
    %b = moe.attention %a, %a, %a heads = 4 kv_heads = 4 scale = 0.25 : tensor<?x64xf32>, tensor<?x64xf32>, tensor<?x64xf32> -> tensor<?x64xf32>
    return %b : tensor<?x64xf32>
  }
}

// -----

// Static values (a dispatch buffer [E, C, H], its counts [E]) get buffers of
// E x C rows and one row; every program of a partitioned module gets its own
// buffers.
// CHECK-LABEL: module
// CHECK: func.func @stage0({{.*}}) attributes {moe.arg_buffers = array<i64: 0, 1>, moe.buffer_rows = array<i64: -1, -1, 32, 1, -1>, moe.buffer_types = [f32, i32, f32, i32, i32], moe.buffer_widths = array<i64: 64, 2, 64, 4, 2>, moe.stage = 0 : i64}
// CHECK: func.func @stage1({{.*}}) attributes {moe.arg_buffers = array<i64: 0>, moe.buffer_rows = array<i64: -1, -1>, moe.buffer_types = [f32, f32]
module {
  func.func @stage0(%x: tensor<?x64xf32>, %e: tensor<?x2xi32>) attributes {moe.stage = 0 : i64} {
    %b, %c, %s = moe.dispatch %x, %e capacity = 8 factor = 1.0 parts = 1 stride = 1 : tensor<?x64xf32>, tensor<?x2xi32> -> tensor<4x8x64xf32>, tensor<4xi32>, tensor<?x2xi32>
    return
  }
  func.func @stage1(%x: tensor<?x64xf32>) attributes {moe.stage = 1 : i64} {
    %y = moe.add %x, %x : tensor<?x64xf32>
    %z = moe.add %y, %x : tensor<?x64xf32>
    return
  }
}
