# A small MLP in f64 for the data-parallel tests (digits, 8x8 images flattened).
import std.nn

model mlp64(batch = 16) {
  input  x: f64[batch, 64]
  input  y: i32[batch]
  param  w1: f64[64, 32] = he_normal
  param  b1: f64[32] = zeros
  param  w2: f64[32, 10] = glorot_uniform
  param  b2: f64[10] = zeros
  h = relu(linear(x, w1, b1))
  logits = linear(h, w2, b2)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1, momentum = 0.9)
}
