// RUN: moe-opt --moe-specialize-workload="max-batch-tokens=128 max-seq-len=256 max-sequences=4" %s | FileCheck %s
// RUN: not moe-opt --moe-specialize-workload="max-seq-len=512" %s 2>&1 | FileCheck %s --check-prefix=TOO-LONG
// RUN: not moe-opt --moe-specialize-workload="max-batch-tokens=0" %s 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not moe-opt --moe-specialize-workload="max-batch-tokens=2000000" %s 2>&1 | FileCheck %s --check-prefix=LIMIT
// RUN: not moe-opt --moe-specialize-workload="max-seq-len=128 max-sequences=70000" %s 2>&1 | FileCheck %s --check-prefix=LIMIT-SEQUENCES

// CHECK: module attributes {moe.max_position_embeddings = 256 : i64, moe.workload = {max_batch_tokens = 128 : i64, max_seq_len = 256 : i64, max_sequences = 4 : i64}}
// TOO-LONG: error: expected max-seq-len <= 256 (the model's max_position_embeddings) but got 512
// ZERO: error: expected max-batch-tokens, max-seq-len and max-sequences > 0 but got 0, 2048 and 8
// The plan format's limits (moe/PlanSchema.h, the ones moert checks):
// LIMIT: error: expected max-batch-tokens <= 1048576 (the plan format's limit) but got 2000000
// LIMIT-SEQUENCES: error: expected max-sequences <= 65536 (the plan format's limit) but got 70000
module attributes {moe.max_position_embeddings = 256 : i64} {
}
