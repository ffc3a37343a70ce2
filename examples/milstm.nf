# MI-LSTM (Wu et al., 2016: multiplicative integration), one of NeoFlow's benchmarks, written
# as a user op, unrolled over 4 steps. The classifier reads every step's hidden state,
# concatenated along the feature axis by conditional expressions (std.nn concat2d_axis1).
import std.nn

# z = alpha * Wx * Uh + beta1 * Uh + beta2 * Wx + b, then the LSTM gates i, f, g, o
op milstm_cell(x: T[N, I], h: T[N, H], c: T[N, H], w: T[I, 4 * H], u: T[H, 4 * H],
               alpha: T[4 * H], beta1: T[4 * H], beta2: T[4 * H], b: T[4 * H])
    -> (h_out: T[N, H], c_out: T[N, H]) {
  wx = matmul(x, w)
  uh = matmul(h, u)
  z[n, g] = alpha[g] * wx[n, g] * uh[n, g] + beta1[g] * uh[n, g] + beta2[g] * wx[n, g] + b[g]
  c_out[n, j] = sigmoid(z[n, H + j]) * c[n, j] + sigmoid(z[n, j]) * tanh(z[n, 2 * H + j])
  h_out[n, j] = sigmoid(z[n, 3 * H + j]) * tanh(c_out[n, j])
}

model milstm(batch = 8, steps = 4, features = 8, hidden = 16, classes = 4) {
  input  x: f32[batch, steps, features]
  input  y: i32[batch]
  param  w: f32[features, 4 * hidden] = glorot_uniform
  param  u: f32[hidden, 4 * hidden] = glorot_uniform
  param  alpha: f32[4 * hidden] = ones
  param  beta1: f32[4 * hidden] = const(0.5)
  param  beta2: f32[4 * hidden] = const(0.5)
  param  b: f32[4 * hidden] = zeros
  param  wo: f32[steps * hidden, classes] = glorot_uniform
  param  bo: f32[classes] = zeros
  state  h0: f32[batch, hidden] = zeros
  state  c0: f32[batch, hidden] = zeros
  x0[n, i] = x[n, 0, i]
  h, c = milstm_cell(x0, h0, c0, w, u, alpha, beta1, beta2, b)
  hs = h
  for t in 1..steps {
    xt[n, i] = x[n, t, i]
    h, c = milstm_cell(xt, h, c, w, u, alpha, beta1, beta2, b)
    hs = concat2d_axis1(hs, h)                                        # [batch, (t + 1) * hidden]
  }
  logits = linear(hs, wo, bo)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1, momentum = 0.9)
}
