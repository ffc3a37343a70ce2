# LeNet-5 on 1x28x28 images: conv5x5(pad 2) - pool - conv5x5 - pool - 120 - 84 - 10.
import std.nn

model lenet5(batch = 64, classes = 10) {
  input  x: f32[batch, 1, 28, 28]
  input  y: i32[batch]
  param  k1: f32[6, 1, 5, 5] = he_normal
  param  c1: f32[6] = zeros
  param  k2: f32[16, 6, 5, 5] = he_normal
  param  c2: f32[16] = zeros
  param  w3: f32[400, 120] = he_normal
  param  b3: f32[120] = zeros
  param  w4: f32[120, 84] = he_normal
  param  b4: f32[84] = zeros
  param  w5: f32[84, classes] = glorot_uniform
  param  b5: f32[classes] = zeros
  a1 = relu_4d(bias_add_nchw(conv2d<padding = 2>(x, k1), c1))       # 6 x 28 x 28
  p1 = max_pool2d<size = 2, stride = 2>(a1)                         # 6 x 14 x 14
  a2 = relu_4d(bias_add_nchw(conv2d(p1, k2), c2))                   # 16 x 10 x 10
  p2 = max_pool2d<size = 2, stride = 2>(a2)                         # 16 x 5 x 5
  h3 = relu(linear(flatten(p2), w3, b3))
  h4 = relu(linear(h3, w4, b4))
  logits = linear(h4, w5, b5)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.01, momentum = 0.9)
}
