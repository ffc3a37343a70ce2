# MLP for the 8x8 digits data set (64 inputs, 10 classes, hidden 128 and 64).
import std.nn

model mlp_digits(batch = 64) {
  input  x: f32[batch, 64]
  input  y: i32[batch]
  param  w1: f32[64, 128] = he_normal
  param  b1: f32[128] = zeros
  param  w2: f32[128, 64] = he_normal
  param  b2: f32[64] = zeros
  param  w3: f32[64, 10] = glorot_uniform
  param  b3: f32[10] = zeros
  h1 = relu(linear(x, w1, b1))
  h2 = relu(linear(h1, w2, b2))
  logits = linear(h2, w3, b3)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.05, momentum = 0.9)
}
