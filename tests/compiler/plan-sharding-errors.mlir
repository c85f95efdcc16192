// RUN: sed 's|@FIXTURES@|%fixtures|' %s | moe-opt --moe-plan-sharding="tp=2" --split-input-file -verify-diagnostics
// RUN: sed 's|@FIXTURES@|%fixtures|' %s | not moe-opt --moe-plan-sharding="pp=2 stage-begin=0,0" --split-input-file 2>&1 | FileCheck %s --check-prefix=STAGES
// STAGES: error: expected stage-begin to list 2 increasing first layers starting at 0

// Diagnostics of moe-plan-sharding (the degree checks themselves:
// tests/compiler/plan-sharding.mlir and the planner's units).

// expected-error @below {{expected moe.source (the config.json the module was imported from)}}
module {
}

// -----

// expected-error @below {{no-such-config.json}}
module attributes {moe.source = "@FIXTURES@/models/no-such-config.json"} {
}

// -----

module attributes {moe.source = "@FIXTURES@/models/mixtral/config.json"} {
  func.func @forward(%tokens: tensor<?xi32>) -> tensor<?x64xf32> {
    // expected-error @below {{'moe.weight' op weight 'model.layers.0.self_attn.nope.weight' is not a tensor of the model's checkpoint}}
    %w = moe.weight "model.layers.0.self_attn.nope.weight" : tensor<251x64xf32>
    %h = moe.embedding %w[%tokens] : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    return %h : tensor<?x64xf32>
  }
}
