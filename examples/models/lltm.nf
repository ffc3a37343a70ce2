# LLTM, the "long-long-term memory" cell of PyTorch's C++/CUDA extension tutorial, as
# benchmarked by NeoFlow:
#   X = [h, x]                       (joined by a conditional expression)
#   [i, o, z] = X W + b;  i, o = sigmoid(i), sigmoid(o);  z = elu(z)
#   c' = c + z ⊙ i,   h' = tanh(c') ⊙ o
# State 128, input 784, batch 64, unrolled over `steps`; a classifier reads the last h.
import std.nn

op lltm_cell(x: T[N, I], h: T[N, H], c: T[N, H], w: T[H + I, 3 * H], b: T[3 * H]) -> (h_out: T[N, H], c_out: T[N, H]) {
  hx[n, k in 0..H + I] = h[n, k] if k < H else x[n, k - H]
  g[n, j] = (sum(k) hx[n, k] * w[k, j]) + b[j]
  cand[n, j in 0..H] = g[n, 2 * H + j] if g[n, 2 * H + j] > 0.0 else exp(g[n, 2 * H + j]) - 1.0
  c_out[n, j] = c[n, j] + cand[n, j] * sigmoid(g[n, j])
  h_out[n, j] = tanh(c_out[n, j]) * sigmoid(g[n, H + j])
}

model lltm(batch = 64, steps = 8, inputs = 784, state_size = 128, classes = 10) {
  input  x: f32[batch, steps, inputs]
  input  y: i32[batch]
  param  w: f32[state_size + inputs, 3 * state_size] = glorot_uniform
  param  b: f32[3 * state_size] = zeros
  param  wo: f32[state_size, classes] = glorot_uniform
  param  bo: f32[classes] = zeros
  h[n in 0..batch, j in 0..state_size] = 0.0
  c[n in 0..batch, j in 0..state_size] = 0.0
  for t in 0..steps {
    x_t[n, i] = x[n, t, i]
    h, c = lltm_cell(x_t, h, c, w, b)
  }
  logits = linear(h, wo, bo)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1)
}
