// RUN: moe-opt --moe-assign-buffers --split-input-file -verify-diagnostics %s

// Diagnostics of moe-assign-buffers, one input each.

// expected-error @below {{expected func.func @forward or the @stage<s> programs of a partitioned module}}
module {
  func.func private @forward(tensor<?xi32>) -> tensor<?xi32>
}

// -----

module {
  func.func private @count() -> i32
  func.func @forward(%tokens: tensor<?xi32>) -> tensor<?xi32> {
    // expected-error @below {{'func.call' op has a result that is not a ranked tensor}}
    %n = func.call @count() : () -> i32
    return %tokens : tensor<?xi32>
  }
}

// -----

// A program of several blocks (the second unreachable: no branching dialect
// is needed to write one).
module {
  // expected-error @below {{expected a single-block program}}
  func.func @forward(%tokens: tensor<?xi32>) -> tensor<?xi32> {
    return %tokens : tensor<?xi32>
  ^bb1:
    return %tokens : tensor<?xi32>
  }
}
