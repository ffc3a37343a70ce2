# MI-LSTM (Wu et al., 2016, "On multiplicative integration with recurrent neural networks"), as
# benchmarked by NeoFlow: the LSTM's gate pre-activations f(Wx + Uh + b) become
# f((Wx ⊙ Uh) + b), a Hadamard product of the two projections. Unrolled over `steps` inputs
# of 784 features (a 28x28 image per step), hidden 1024, batch 64; the last hidden state
# feeds a classifier. Gates in the order i, f, g, o.
import std.nn

op mi_lstm_cell(x: T[N, I], h: T[N, H], c: T[N, H], w: T[I, 4 * H], u: T[H, 4 * H], b: T[4 * H]) -> (h_out: T[N, H], c_out: T[N, H]) {
  z[n, g] = (sum(k) x[n, k] * w[k, g]) * (sum(k) h[n, k] * u[k, g]) + b[g]
  c_out[n, j] = sigmoid(z[n, H + j]) * c[n, j] + sigmoid(z[n, j]) * tanh(z[n, 2 * H + j])
  h_out[n, j] = sigmoid(z[n, 3 * H + j]) * tanh(c_out[n, j])
}

model mi_lstm(batch = 64, steps = 8, inputs = 784, hidden = 1024, classes = 10) {
  input  x: f32[batch, steps, inputs]
  input  y: i32[batch]
  param  w: f32[inputs, 4 * hidden] = glorot_uniform
  param  u: f32[hidden, 4 * hidden] = glorot_uniform
  param  b: f32[4 * hidden] = ones    # not zeros: h0 = 0 and b = 0 keep h at 0 (x enters times hU)
  param  wo: f32[hidden, classes] = glorot_uniform
  param  bo: f32[classes] = zeros
  h[n in 0..batch, j in 0..hidden] = 0.0
  c[n in 0..batch, j in 0..hidden] = 0.0
  for t in 0..steps {
    x_t[n, i] = x[n, t, i]
    h, c = mi_lstm_cell(x_t, h, c, w, u, b)
  }
  logits = linear(h, wo, bo)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1)
}
