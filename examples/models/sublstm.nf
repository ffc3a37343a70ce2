# subLSTM (Costa et al., 2017, "Cortical microcircuits as gated-recurrent neural networks"):
# every gate is a sigmoid and gating is subtractive,
#   [i, f, z, o] = sigmoid([x, h] W + b)       ([x, h] joined by a conditional expression)
#   c' = f ⊙ c + z - i,   h' = sigmoid(c') - o
# State 128, input 784, batch 64, unrolled over `steps`; a classifier reads the last h.
import std.nn

op sublstm_cell(x: T[N, I], h: T[N, H], c: T[N, H], w: T[I + H, 4 * H], b: T[4 * H]) -> (h_out: T[N, H], c_out: T[N, H]) {
  xh[n, k in 0..I + H] = x[n, k] if k < I else h[n, k - I]
  gate[n, g] = sigmoid((sum(k) xh[n, k] * w[k, g]) + b[g])
  c_out[n, j] = gate[n, H + j] * c[n, j] + gate[n, 2 * H + j] - gate[n, j]
  h_out[n, j] = sigmoid(c_out[n, j]) - gate[n, 3 * H + j]
}

model sublstm(batch = 64, steps = 8, inputs = 784, hidden = 128, classes = 10) {
  input  x: f32[batch, steps, inputs]
  input  y: i32[batch]
  param  w: f32[inputs + hidden, 4 * hidden] = glorot_uniform
  param  b: f32[4 * hidden] = zeros
  param  wo: f32[hidden, classes] = glorot_uniform
  param  bo: f32[classes] = zeros
  h[n in 0..batch, j in 0..hidden] = 0.0
  c[n in 0..batch, j in 0..hidden] = 0.0
  for t in 0..steps {
    x_t[n, i] = x[n, t, i]
    h, c = sublstm_cell(x_t, h, c, w, b)
  }
  logits = linear(h, wo, bo)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1)
}
