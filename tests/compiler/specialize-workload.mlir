// RUN: moe-opt --moe-specialize-workload="max-batch-tokens=128 max-seq-len=256 max-sequences=4" %s | FileCheck %s
// RUN: not moe-opt --moe-specialize-workload="max-seq-len=512" %s 2>&1 | FileCheck %s --check-prefix=TOO-LONG
// RUN: not moe-opt --moe-specialize-workload="max-batch-tokens=0" %s 2>&1 | FileCheck %s --check-prefix=ZERO

// CHECK: module attributes {moe.max_position_embeddings = 256 : i64, moe.workload = {max_batch_tokens = 128 : i64, max_seq_len = 256 : i64, max_sequences = 4 : i64}}
// TOO-LONG: error: expected max-seq-len <= 256 (the model's max_position_embeddings) but got 512
// ZERO: error: expected max-batch-tokens, max-seq-len and max-sequences > 0 but got 0, 2048 and 8
module attributes {moe.max_position_embeddings = 256 : i64} {
}
