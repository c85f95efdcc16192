// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-split-entries | FileCheck %s
// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-split-entries="decode-max-batch-tokens=2" | FileCheck %s --check-prefix=TWO

// moe-split-entries: one copy of the model per entry, each with its own
// workload (decode: max_sequences tokens a step, at most max_batch_tokens),
// the module's other attributes and every op (symbols resolve inside each
// copy).
// CHECK-LABEL: module attributes {moe.model_type = "m"
// CHECK: module @prefill attributes {moe.entry = "prefill", moe.model_type = "m", moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 4 : i64}}
// CHECK: mesh.mesh @mesh(shape = 1x1x1)
// CHECK: func.func @forward
// CHECK: module @decode attributes {moe.entry = "decode", moe.model_type = "m", moe.workload = {max_batch_tokens = 4 : i64, max_seq_len = 64 : i64, max_sequences = 4 : i64}}
// CHECK: mesh.mesh @mesh(shape = 1x1x1)
// CHECK: func.func @forward
// TWO: module @decode attributes {{{.*}}max_batch_tokens = 2 : i64
module attributes {moe.model_type = "m", moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 4 : i64}} {
  mesh.mesh @mesh(shape = 1x1x1)
  func.func @forward() {
    return
  }
}

// -----

// More sequences than a step holds: the decode entry's steps hold as many
// as the prefill entry's.
// CHECK: module @decode attributes {{{.*}}max_batch_tokens = 2 : i64, max_seq_len = 64 : i64, max_sequences = 8 : i64}
module attributes {moe.workload = {max_batch_tokens = 2 : i64, max_seq_len = 64 : i64, max_sequences = 8 : i64}} {
}

// -----

// expected-error @below {{moe-split-entries: expected moe.workload with max_batch_tokens and max_sequences (run moe-specialize-workload first)}}
module {
}

// -----

// expected-error @below {{moe-split-entries: the module is split already}}
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 4 : i64}} {
  module @prefill {
  }
}
