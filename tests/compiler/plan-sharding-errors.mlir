// RUN: sed 's|@FIXTURES@|%fixtures|' %s | moe-opt --moe-plan-sharding="tp=2" --split-input-file -verify-diagnostics
// RUN: sed 's|@FIXTURES@|%fixtures|' %s | not moe-opt --moe-plan-sharding="pp=2 stage-begin=0,0" --split-input-file 2>&1 | FileCheck %s --check-prefix=STAGES
// STAGES: error: expected stage-begin to list 2 increasing first layers starting at 0

// Diagnostics of moe-plan-sharding (the degree checks themselves:
// tests/compiler/plan-sharding.mlir and the planner's units).

// expected-error @below {{expected moe.config or moe.source (the config.json the module was imported from)}}
module {
}

// -----

// expected-error @below {{no-such-config.json}}
module attributes {moe.source = "@FIXTURES@/models/no-such-config.json"} {
}

// -----

// The model's sizes are the ops' (moe::modelSizes): layers of different
// shapes are not planned.
// expected-error @below {{mixtral/config.json: not supported yet: the ops state num_heads 4 and 2 (layers of different shapes)}}
module attributes {moe.source = "@FIXTURES@/models/mixtral/config.json"} {
  func.func @forward(%q: tensor<?x64xf32>, %k: tensor<?x32xf32>, %q2: tensor<?x32xf32>) -> tensor<?x32xf32> {
    %a = moe.attention %q, %k, %k heads = 4 kv_heads = 2 scale = 0.25 : tensor<?x64xf32>, tensor<?x32xf32>, tensor<?x32xf32> -> tensor<?x64xf32>
    %b = moe.attention %q2, %k, %k heads = 2 kv_heads = 2 scale = 0.25 : tensor<?x32xf32>, tensor<?x32xf32>, tensor<?x32xf32> -> tensor<?x32xf32>
    return %b : tensor<?x32xf32>
  }
}

// -----

// expected-error @below {{expected func.func @forward or, after moe-partition, moe.logical_weights}}
module attributes {moe.source = "@FIXTURES@/models/mixtral/config.json"} {
}

// -----

// A module the first RUN line accepts; the second's stage-begin does not fit it.
module attributes {moe.source = "@FIXTURES@/models/mixtral/config.json"} {
  func.func @forward(%x: tensor<?x64xf32>) -> tensor<?x64xf32> {
    %w = moe.weight "model.norm.weight" : tensor<64xf32>
    %n = moe.rms_norm %x, %w eps = 1.0e-05 : tensor<?x64xf32>, tensor<64xf32>
    return %n : tensor<?x64xf32>
  }
}
