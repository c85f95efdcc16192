// RUN: moe-opt --moe-fuse-router --split-input-file %s | FileCheck %s

// The importer's form (the gate's moe.linear, then moe.route) becomes one
// moe.router with the routing and the correction bias of the route.
// CHECK-LABEL: func.func @fused
// CHECK-SAME:    (%[[X:[^:]+]]: tensor<?x64xf32>, %[[G:[^:]+]]: tensor<16x64xf32>, %[[B:[^:]+]]: tensor<16xf32>)
// CHECK-NOT:     moe.linear
// CHECK-NOT:     moe.route
// CHECK:         %[[W:.+]], %[[E:.+]] = moe.router %[[X]], %[[G]] bias %[[B]] <scoring = sigmoid, top_k = 2, normalize = true, num_groups = 4, topk_groups = 2, compute_type = f32> : tensor<?x64xf32>, tensor<16x64xf32>, tensor<16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
// CHECK:         return %[[W]], %[[E]]
func.func @fused(%x: tensor<?x64xf32>, %g: tensor<16x64xf32>, %b: tensor<16xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  %l = moe.linear %x, %g : tensor<?x64xf32>, tensor<16x64xf32> -> tensor<?x16xf32>
  %w, %e = moe.route %l bias %b <scoring = sigmoid, top_k = 2, normalize = true, num_groups = 4, topk_groups = 2, compute_type = f32> : tensor<?x16xf32>, tensor<16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %e : tensor<?x2xf32>, tensor<?x2xi32>
}

// -----

// Logits that something else reads too stay a linear and a route.
// CHECK-LABEL: func.func @logits_used_twice
// CHECK:         %[[L:.+]] = moe.linear
// CHECK:         moe.route %[[L]]
// CHECK-NOT:     moe.router
func.func @logits_used_twice(%x: tensor<?x64xf32>, %g: tensor<8x64xf32>) -> (tensor<?x2xf32>, tensor<?x8xf32>) {
  %l = moe.linear %x, %g : tensor<?x64xf32>, tensor<8x64xf32> -> tensor<?x8xf32>
  %w, %e = moe.route %l <scoring = softmax, top_k = 2, compute_type = f32> : tensor<?x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %l : tensor<?x2xf32>, tensor<?x8xf32>
}

// -----

// A linear with a bias is not a router's gate: moe.router has none.
// CHECK-LABEL: func.func @linear_with_bias
// CHECK:         moe.linear
// CHECK:         moe.route
// CHECK-NOT:     moe.router
func.func @linear_with_bias(%x: tensor<?x64xf32>, %g: tensor<8x64xf32>, %gb: tensor<8xf32>) -> tensor<?x2xi32> {
  %l = moe.linear %x, %g, %gb : tensor<?x64xf32>, tensor<8x64xf32>, tensor<8xf32> -> tensor<?x8xf32>
  %w, %e = moe.route %l <scoring = softmax, top_k = 2, compute_type = f32> : tensor<?x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %e : tensor<?x2xi32>
}

// -----

// Routing of logits that come from elsewhere (an argument) stays a route.
// CHECK-LABEL: func.func @logits_from_elsewhere
// CHECK:         moe.route %arg0
func.func @logits_from_elsewhere(%l: tensor<?x8xf32>) -> tensor<?x2xi32> {
  %w, %e = moe.route %l <scoring = softmax, top_k = 2, compute_type = f32> : tensor<?x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %e : tensor<?x2xi32>
}
