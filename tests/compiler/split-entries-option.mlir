// RUN: moe-opt %s -verify-diagnostics --moe-split-entries="decode-max-batch-tokens=32"

// expected-error @below {{moe-split-entries: expected decode-max-batch-tokens <= max_batch_tokens (16) but got 32}}
module attributes {moe.workload = {max_batch_tokens = 16 : i64, max_seq_len = 64 : i64, max_sequences = 4 : i64}} {
}
