# RUN: nfc opt %s -p 'training-functions,data-parallel{bucket-kb=1},inline,canonicalize,cse,dce' --no-locs | filecheck %s
# RUN: nfc opt %s -p 'training-functions,data-parallel,inline,canonicalize,cse,dce' --no-locs | filecheck %s --check-prefix=ONE
# RUN: nfc opt %s -p 'training-functions,data-parallel{compress=bf16}' | nfc opt - -p cse | filecheck %s --check-prefix=ROUND
# RUN: not nfc opt %s -p 'training-functions,data-parallel{compress=int8}' 2>&1 | filecheck %s --check-prefix=BAD
# The data-parallel pass: the gradients the optimizer update reads are averaged over the ranks
# by nf.allreduce ops, one per bucket, each right after the backward op of its last gradient.
import std.nn

model mlp(batch = 4) {
  input  x: f32[batch, 8]
  input  y: i32[batch]
  param  w1: f32[8, 32] = he_normal
  param  b1: f32[32] = zeros
  param  w2: f32[32, 10] = glorot_uniform
  param  b2: f32[10] = zeros
  h = relu(linear(x, w1, b1))
  logits = linear(h, w2, b2)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1, momentum = 0.9)
}

# 1 KiB buckets, in the order the backward makes the gradients: b2 and w2 (40 + 1280 bytes),
# then b1 and w1; the update reads only the reduced values
# CHECK:       nf.module @mlp attributes {{{.*}}nf.data_parallel = {buckets = 2, compress = "none", bn = "local"}}
# CHECK-LABEL: nf.func @train_step
# CHECK:       %[[B2:[a-z0-9_]+]], %[[W2:[a-z0-9_]+]] = nf.allreduce %d_b2, %d_w2 {nf.bucket = 0, nf.compress = "none", nf.reduce = "mean", nf.collective = "gradients"} : tensor<10xf32>, tensor<32x10xf32>
# CHECK:       %[[B1:[a-z0-9_]+]], %[[W1:[a-z0-9_]+]] = nf.allreduce %d_b1, %d_w1 {nf.bucket = 1,{{.*}}} : tensor<32xf32>, tensor<8x32xf32>
# CHECK-NEXT:  nf.compute [i0: 8, i1: 32] (%w1_mom[i0, i1] * 0.9 + %[[W1]][i0, i1]) {nf.phase = "update"}
# CHECK:       nf.compute [i0: 10] (%b2_mom[i0] * 0.9 + %[[B2]][i0]) {nf.phase = "update"}
# CHECK-LABEL: nf.func @eval
# CHECK-NOT:   nf.allreduce

# the default 25 MiB bucket holds every gradient
# ONE:         nf.allreduce %d_b2, %d_w2, %d_b1, %d_w1 {nf.bucket = 0,
# ONE-NOT:     nf.allreduce

# printed, parsed back and printed again
# ROUND:       = nf.allreduce %d_b2, %d_w2, %d_b1, %d_w1 {nf.bucket = 0, nf.compress = "bf16", nf.reduce = "mean", nf.collective = "gradients"} : tensor<10xf32>, tensor<32x10xf32>, tensor<32xf32>, tensor<8x32xf32> loc(

# BAD: data-parallel: compress must be one of none, fp16, bf16, not 'int8'
