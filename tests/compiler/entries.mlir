// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-join-entries | FileCheck %s

// moe-join-entries gathers the entries' programs: the prefill entry's
// first, then the decode entry's renamed, each with its entry, the decode
// one's workload where it differs, the prefill module's attributes and the
// schedule.
// CHECK-LABEL: module attributes
// CHECK-SAME: moe.schedule = {decode = "decode", prefill = "prefill"}
// CHECK-SAME: moe.workload = {max_batch_tokens = 16 : i64}
// CHECK-NOT: moe.entry
// CHECK: exec.program @stage0 entry "prefill" stage 0
// CHECK: exec.weight "w" : tensor<4x8xf32>
// CHECK: exec.program @stage1 entry "prefill" stage 1
// CHECK: exec.program @stage0_decode entry "decode" stage 0 attributes {max_batch_tokens = 4 : i64}
// CHECK: exec.buffer f32 rows 4 width 8
// CHECK: exec.program @stage1_decode entry "decode" stage 1 attributes {max_batch_tokens = 4 : i64}
// CHECK-NOT: module @
module {
  module @prefill attributes {moe.entry = "prefill", moe.workload = {max_batch_tokens = 16 : i64}} {
    exec.program @stage0 entry "forward" stage 0 {
      %b = exec.buffer f32 rows 16 width 8
      %w = exec.weight "w" : tensor<4x8xf32>
      exec.kv_cache key_width 8 value_width 8
      exec.return
    }
    exec.program @stage1 entry "forward" stage 1 {
      exec.return
    }
  }
  module @decode attributes {moe.entry = "decode", moe.workload = {max_batch_tokens = 4 : i64}} {
    exec.program @stage0 entry "forward" stage 0 {
      %b = exec.buffer f32 rows 4 width 8
      %w = exec.weight "w" : tensor<4x8xf32>
      exec.kv_cache key_width 8 value_width 8
      exec.return
    }
    exec.program @stage1 entry "forward" stage 1 {
      exec.return
    }
  }
}

// -----

// expected-error @below {{moe-join-entries: expected exactly `module @prefill` and `module @decode` (moe-split-entries)}}
module {
  exec.program @forward entry "forward" stage 0 {
    exec.return
  }
}

// -----

module {
  // expected-error @below {{moe-join-entries: expected exec.program ops (run moe-lower-to-exec)}}
  module @prefill {
  }
  module @decode {
  }
}

// -----

module {
  module @prefill {
    exec.program @forward entry "forward" stage 0 {
      exec.return
    }
  }
  // expected-error @below {{moe-join-entries: the decode entry has 0 programs but the prefill entry 1}}
  module @decode {
  }
}

// -----

module {
  module @prefill {
    exec.program @forward entry "forward" stage 0 {
      exec.return
    }
  }
  module @decode {
    // expected-error @below {{moe-join-entries: stage 1 where the prefill entry has stage 0}}
    exec.program @forward entry "forward" stage 1 {
      exec.return
    }
  }
}

// -----

module {
  module @prefill {
    exec.program @forward entry "forward" stage 0 {
      %w = exec.weight "w" : tensor<4x8xf32>
      exec.return
    }
  }
  module @decode {
    // expected-error @below {{moe-join-entries: the decode entry's weights differ from the prefill entry's at stage 0}}
    exec.program @forward entry "forward" stage 0 {
      %w = exec.weight "w" : tensor<2x8xf32>
      exec.return
    }
  }
}

// -----

module {
  module @prefill {
    exec.program @forward entry "forward" stage 0 {
      exec.kv_cache key_width 8 value_width 8
      exec.return
    }
  }
  module @decode {
    // expected-error @below {{moe-join-entries: the decode entry's KV caches differ from the prefill entry's at stage 0}}
    exec.program @forward entry "forward" stage 0 {
      exec.kv_cache key_width 8 value_width 4
      exec.return
    }
  }
}
