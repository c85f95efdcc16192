// RUN: moe-opt --moe-annotate-kernels -verify-diagnostics %s

// moe-annotate-kernels needs the whole pipeline's module (its kernel
// lowering reads the plan built from it).

// expected-error @below {{moe-annotate-kernels: expected a module with moe.workload and assigned buffers (run the whole pipeline)}}
module {
  func.func @forward(%tokens: tensor<?xi32>) -> tensor<?xi32> {
    return %tokens : tensor<?xi32>
  }
}
