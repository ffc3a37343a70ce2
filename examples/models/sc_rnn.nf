# SC-RNN, the structurally constrained recurrent network (Mikolov et al., 2015, "Learning
# longer memory in recurrent neural networks"), as benchmarked by NeoFlow: next to the fast
# hidden layer h (128 units) runs a slow context layer s (64 units) whose self-connection is
# fixed near the identity,
#   s_t = (1 - alpha) x_t B + alpha s_{t-1}
#   h_t = sigmoid(s_t P + x_t A + h_{t-1} R)
# and the output reads both, y = h_T U + s_T V + c (here a classifier after the last step).
import std.nn

op scrnn_cell<alpha: float = 0.95>(x: T[N, I], h: T[N, H], s: T[N, S], bw: T[I, S], a: T[I, H], p: T[S, H], r: T[H, H]) -> (h_out: T[N, H], s_out: T[N, S]) {
  s_out[n, j] = (1.0 - alpha) * (sum(k) x[n, k] * bw[k, j]) + alpha * s[n, j]
  h_out[n, j] = sigmoid((sum(k) s_out[n, k] * p[k, j]) + (sum(k) x[n, k] * a[k, j]) + (sum(k) h[n, k] * r[k, j]))
}

model sc_rnn(batch = 64, steps = 8, inputs = 784, hidden = 128, context = 64, classes = 10) {
  input  x: f32[batch, steps, inputs]
  input  y: i32[batch]
  param  bw: f32[inputs, context] = glorot_uniform
  param  a: f32[inputs, hidden] = glorot_uniform
  param  p: f32[context, hidden] = glorot_uniform
  param  r: f32[hidden, hidden] = glorot_uniform
  param  wu: f32[hidden, classes] = glorot_uniform
  param  wv: f32[context, classes] = glorot_uniform
  param  bo: f32[classes] = zeros
  h[n in 0..batch, j in 0..hidden] = 0.0
  s[n in 0..batch, j in 0..context] = 0.0
  for t in 0..steps {
    x_t[n, i] = x[n, t, i]
    h, s = scrnn_cell(x_t, h, s, bw, a, p, r)
  }
  logits = linear(h, wu, bo) + linear_nobias(s, wv)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1)
}
