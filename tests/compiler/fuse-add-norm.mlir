// RUN: moe-opt --moe-fuse-add-norm --split-input-file %s | FileCheck %s

// A residual add read first by an rms_norm becomes one moe.add_norm in the
// norm's place (after the norm's weight); the sum goes on to later readers.
// CHECK-LABEL: func.func @rms
// CHECK-SAME:    (%[[A:[^:]+]]: tensor<?x64xf32>, %[[B:[^:]+]]: tensor<?x64xf32>, %[[W:[^:]+]]: tensor<64xf32>)
// CHECK-NOT:     moe.add %
// CHECK-NOT:     moe.rms_norm
// CHECK:         %[[S:.+]], %[[N:.+]] = moe.add_norm %[[A]], %[[B]], %[[W]] eps = 1.000000e-05 : tensor<?x64xf32>, tensor<64xf32>
// CHECK:         %[[R:.+]] = moe.add %[[S]], %[[N]]
// CHECK:         return %[[R]]
func.func @rms(%a: tensor<?x64xf32>, %b: tensor<?x64xf32>, %w: tensor<64xf32>) -> tensor<?x64xf32> {
  %s = moe.add %a, %b : tensor<?x64xf32>
  %n = moe.rms_norm %s, %w eps = 1.0e-05 : tensor<?x64xf32>, tensor<64xf32>
  %r = moe.add %s, %n : tensor<?x64xf32>
  return %r : tensor<?x64xf32>
}

// -----

// A layer_norm with its bias; a weight defined between the add and the norm
// is defined before the fused op, which takes the norm's place.
// CHECK-LABEL: func.func @layer
// CHECK:         %[[W:.+]] = moe.weight "model.norm.weight"
// CHECK:         %[[S:.+]], %[[N:.+]] = moe.add_norm %{{.+}}, %{{.+}}, layer %[[W]], %{{.+}} eps = 9.9999999999999995E-7 : tensor<?x64xf32>, tensor<64xf32>, tensor<64xf32>
// CHECK:         return %[[N]], %[[S]]
func.func @layer(%a: tensor<?x64xf32>, %b: tensor<?x64xf32>, %bias: tensor<64xf32>) -> (tensor<?x64xf32>, tensor<?x64xf32>) {
  %s = moe.add %a, %b : tensor<?x64xf32>
  %w = moe.weight "model.norm.weight" : tensor<64xf32>
  %n = moe.layer_norm %s, %w, %bias eps = 1.0e-06 : tensor<?x64xf32>, tensor<64xf32>, tensor<64xf32>
  return %n, %s : tensor<?x64xf32>, tensor<?x64xf32>
}

// -----

// Qwen3's per-head norm (a weight smaller than the row) fuses too.
// CHECK-LABEL: func.func @grouped
// CHECK:         moe.add_norm %{{.+}}, %{{.+}}, %{{.+}} eps = 9.9999999999999995E-7 : tensor<?x128xf32>, tensor<32xf32>
func.func @grouped(%a: tensor<?x128xf32>, %b: tensor<?x128xf32>, %w: tensor<32xf32>) -> tensor<?x128xf32> {
  %s = moe.add %a, %b : tensor<?x128xf32>
  %n = moe.rms_norm %s, %w eps = 1.0e-06 : tensor<?x128xf32>, tensor<32xf32>
  return %n : tensor<?x128xf32>
}

// -----

// An add whose sum something else reads before the norm stays as it is (the
// fused op would move the add after that reader); so does an add no norm
// reads, and a norm of something other than an add.
// CHECK-LABEL: func.func @read_before_norm
// CHECK:         %[[S:.+]] = moe.add
// CHECK:         moe.linear %[[S]]
// CHECK:         moe.rms_norm %[[S]]
// CHECK-NOT:     moe.add_norm
func.func @read_before_norm(%a: tensor<?x64xf32>, %b: tensor<?x64xf32>, %w: tensor<64xf32>, %m: tensor<64x64xf32>) -> (tensor<?x64xf32>, tensor<?x64xf32>) {
  %s = moe.add %a, %b : tensor<?x64xf32>
  %l = moe.linear %s, %m : tensor<?x64xf32>, tensor<64x64xf32> -> tensor<?x64xf32>
  %n = moe.rms_norm %s, %w eps = 1.0e-05 : tensor<?x64xf32>, tensor<64xf32>
  return %l, %n : tensor<?x64xf32>, tensor<?x64xf32>
}

// -----

// CHECK-LABEL: func.func @no_norm
// CHECK:         moe.add
// CHECK:         moe.rms_norm %arg0
// CHECK-NOT:     moe.add_norm
func.func @no_norm(%a: tensor<?x64xf32>, %b: tensor<?x64xf32>, %w: tensor<64xf32>) -> (tensor<?x64xf32>, tensor<?x64xf32>) {
  %s = moe.add %a, %b : tensor<?x64xf32>
  %n = moe.rms_norm %a, %w eps = 1.0e-05 : tensor<?x64xf32>, tensor<64xf32>
  return %s, %n : tensor<?x64xf32>, tensor<?x64xf32>
}
