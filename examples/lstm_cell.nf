# An LSTM unrolled over 4 time steps (compile-time `for`), classifying from the last hidden
# state. std.nn's lstm_cell concatenates [x_t, h] with a conditional expression.
import std.nn

model lstm(batch = 8, steps = 4, features = 8, hidden = 16, classes = 4) {
  input  x: f32[batch, steps, features]
  input  y: i32[batch]
  param  w: f32[features + hidden, 4 * hidden] = glorot_uniform
  param  b: f32[4 * hidden] = zeros
  param  wo: f32[hidden, classes] = glorot_uniform
  param  bo: f32[classes] = zeros
  state  h0: f32[batch, hidden] = zeros                               # initial state
  state  c0: f32[batch, hidden] = zeros
  h = h0
  c = c0
  for t in 0..steps {
    xt[n, i] = x[n, t, i]
    h, c = lstm_cell(xt, h, c, w, b)
  }
  logits = linear(h, wo, bo)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1, momentum = 0.9)
}
