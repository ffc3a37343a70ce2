# A small convolutional model in f64 for the data-parallel tests (digits, 1x8x8 images).
import std.nn

model conv64(batch = 16) {
  input  x: f64[batch, 1, 8, 8]
  input  y: i32[batch]
  param  k1: f64[4, 1, 3, 3] = he_normal
  param  c1: f64[4] = zeros
  param  w2: f64[144, 10] = glorot_uniform
  param  b2: f64[10] = zeros
  a1 = relu_4d(bias_add_nchw(conv2d(x, k1), c1))
  logits = linear(flatten(a1), w2, b2)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with adam(lr = 0.01)
}
