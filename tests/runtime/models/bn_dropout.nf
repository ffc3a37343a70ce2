# Batch norm with running statistics (state updated in place) and dropout (the rng argument):
# training and evaluation differ, so @eval comes from a second compile with training off.
import std.nn

model bn_dropout(batch = 16) {
  input  x: f32[batch, 64]
  input  y: i32[batch]
  param  w1: f32[64, 32] = he_normal
  param  g: f32[32] = ones
  param  s: f32[32] = zeros
  param  w2: f32[32, 10] = glorot_uniform
  param  b2: f32[10] = zeros
  state  rm: f32[32] = zeros
  state  rv: f32[32] = ones
  random u: f32[batch, 32]
  z = linear_nobias(x, w1)
  if training {
    a, bm, bv = batch_norm1d_train(z, g, s)
    h = dropout<p = 0.25>(relu(a), u)
    update rm = 0.9 * rm + 0.1 * bm
    update rv = 0.9 * rv + 0.1 * bv
  } else {
    h = relu(batch_norm1d_eval(z, g, s, rm, rv))
  }
  logits = linear(h, w2, b2)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with adam(lr = 0.01)
}
