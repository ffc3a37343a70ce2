# An Elman RNN unrolled over 4 steps, classifying the last hidden state.
import std.nn

model rnn4(batch = 3, features = 2, hidden = 4, classes = 3) {
  input  xs: f64[4, batch, features]
  input  y: i32[batch]
  param  wx: f64[features, hidden] = normal(0.0, 0.5)
  param  wh: f64[hidden, hidden] = normal(0.0, 0.5)
  param  bh: f64[hidden] = zeros
  param  wo: f64[hidden, classes] = normal(0.0, 0.5)
  x0[n, i] = xs[0, n, i]
  h = tanh(linear(x0, wx, bh))
  for t in 1..4 {
    xt[n, i] = xs[t, n, i]
    h = tanh(linear(xt, wx, bh) + matmul(h, wh))
  }
  logits = matmul(h, wo)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with adam(lr = 0.01)
}
