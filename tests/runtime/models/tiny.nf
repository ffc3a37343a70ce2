# A linear softmax classifier on 64 features: the smallest trainable model (fast to compile).
import std.nn

model tiny(batch = 16) {
  input  x: f32[batch, 64]
  input  y: i32[batch]
  param  w: f32[64, 10] = normal(0.0, 0.01)
  param  b: f32[10] = zeros
  logits = linear(x, w, b)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1, momentum = 0.5)
}
