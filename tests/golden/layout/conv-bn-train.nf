# RUN: nfc opt %s --no-locs -p 'layout{block=8},im2col,training-functions' --eval | filecheck %s
# Convolution, batch norm, ReLU, pooling, a second convolution and a classifier: the
# weights are stored blocked, and the train step updates the blocked parameters with
# momentum buffers of the same blocked shape (the optimizer updates the packed form).
import std.nn

model convbn(batch = 2) {
  input  x: f32[batch, 3, 8, 8]
  input  y: i32[batch]
  param  k1: f32[8, 3, 3, 3] = he_normal
  param  g1: f32[8] = ones
  param  b1: f32[8] = zeros
  param  k2: f32[16, 8, 3, 3] = he_normal
  param  w: f32[16, 4] = glorot_uniform
  z, m1, v1 = batch_norm_train(conv2d<padding = 1>(x, k1), g1, b1)
  a = relu_4d(z)
  p = max_pool2d<size = 2, stride = 2>(a)
  h = relu_4d(conv2d<padding = 1>(p, k2))
  g = global_avg_pool(h)
  logits[n, m] = sum(c) g[n, c] * w[c, m]
  loss = softmax_cross_entropy(logits, y)
  minimize loss with sgd(lr = 0.1, momentum = 0.9)
}
# CHECK-LABEL: nf.func @forward
# CHECK-SAME:  %k1: tensor<1x3x3x3x8xf32> {{{.*}}nf.layout = {kind = "blocked", shape = [8, 3, 3, 3], dims = [0], block = 8}}
# CHECK-SAME:  %g1: tensor<1x8xf32>
# CHECK-SAME:  %k2: tensor<2x1x3x3x8x8xf32> {{{.*}}nf.layout = {kind = "blocked", shape = [16, 8, 3, 3], dims = [1, 0], block = 8}}
# CHECK-SAME:  %w: tensor<2x8x4xf32>
# CHECK-LABEL: nf.func @train_step
# CHECK-SAME:  %k2: tensor<2x1x3x3x8x8xf32>
# CHECK-SAME:  %k2_mom: tensor<2x1x3x3x8x8xf32>
