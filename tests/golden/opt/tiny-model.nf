# RUN: nfc opt %s | filecheck %s
# RUN: nfc opt %s | nfc opt - -p cse,dce | filecheck %s
# RUN: nfc opt %s --set batch=8 --no-locs | filecheck %s --check-prefix=BATCH8
# The frontend's IR for a .nf model, and the same IR piped through `nfc opt -`.
import std.nn

model tiny(batch = 2) {
  input  x: f32[batch, 4]
  param  w: f32[4, 3] = zeros
  param  b: f32[3] = zeros
  y = relu(linear(x, w, b))
  output y
}

# CHECK:       nf.module @tiny attributes {nf.model = "tiny"} {
# CHECK-NEXT:    nf.func @forward(%x: tensor<2x4xf32> {nf.role = "input"}, %w: tensor<4x3xf32> {nf.role = "param"
# CHECK:           %[[MM:[a-z0-9_]+]] = nf.compute [n: 2, m: 3] sum [k: 4] (%x[n, k] * %w[k, m])
# CHECK-NEXT:      %[[B:[a-z0-9_]+]] = nf.compute [n: 2, m: 3] (%[[MM]][n, m] + %b[m])
# CHECK-NEXT:      %[[R:[a-z0-9_]+]] = nf.compute [n: 2, d: 3] (max(%[[B]][n, d], 0.0))
# CHECK-NEXT:      nf.return %[[R]] : tensor<2x3xf32> loc("{{.*}}tiny-model.nf":7:1 to :11)

# BATCH8: nf.func @forward(%x: tensor<8x4xf32>
# BATCH8: nf.return %{{[a-z0-9_]+}} : tensor<8x3xf32>{{$}}
