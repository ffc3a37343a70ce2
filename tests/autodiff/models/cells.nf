# Recurrent cells for the autodiff gradient checks. Each is an op (so the test can
# instantiate it for any shape); rnn4.nf unrolls one into a model.
import std.nn

# Multiplicative-integration LSTM (Wu et al. 2016):
#   z = alpha * Wx * Uh + beta1 * Wx + beta2 * Uh + b, then the usual LSTM gates (i, f, g, o)
op milstm_cell(x: T[N, I], h: T[N, H], c: T[N, H], wx: T[I, 4 * H], uh: T[H, 4 * H], alpha: T[4 * H], beta1: T[4 * H], beta2: T[4 * H], b: T[4 * H]) -> (h_out: T[N, H], c_out: T[N, H]) {
  a = matmul(x, wx)
  u = matmul(h, uh)
  z[n, j] = alpha[j] * a[n, j] * u[n, j] + beta1[j] * a[n, j] + beta2[j] * u[n, j] + b[j]
  c_out[n, j] = sigmoid(z[n, H + j]) * c[n, j] + sigmoid(z[n, j]) * tanh(z[n, 2 * H + j])
  h_out[n, j] = sigmoid(z[n, 3 * H + j]) * tanh(c_out[n, j])
}

# Structurally constrained RNN (Mikolov et al. 2014): a slow context state s next to h.
op scrnn_cell<alpha: float = 0.95>(x: T[N, I], h: T[N, H], s: T[N, S], B: T[I, S], P: T[S, H], A: T[I, H], R: T[H, H]) -> (h_out: T[N, H], s_out: T[N, S]) {
  bx = matmul(x, B)
  s_out[n, k] = (1.0 - alpha) * bx[n, k] + alpha * s[n, k]
  ps = matmul(s_out, P)
  ax = matmul(x, A)
  rh = matmul(h, R)
  h_out[n, j] = sigmoid(ps[n, j] + ax[n, j] + rh[n, j])
}

# subLSTM (Costa et al. 2017): sigmoid gates, subtractive input and output gating.
op sublstm_cell(x: T[N, I], h: T[N, H], c: T[N, H], w: T[I + H, 4 * H], b: T[4 * H]) -> (h_out: T[N, H], c_out: T[N, H]) {
  xh = concat2d_axis1(x, h)
  z = linear(xh, w, b)
  c_out[n, j] = sigmoid(z[n, H + j]) * c[n, j] + sigmoid(z[n, 2 * H + j]) - sigmoid(z[n, j])
  h_out[n, j] = sigmoid(c_out[n, j]) - sigmoid(z[n, 3 * H + j])
}

# LLTM, the cell of PyTorch's C++/CUDA extension tutorial: gates from [h, x], an ELU
# candidate, c' = c + cand * sigmoid(i), h' = tanh(c') * sigmoid(o).
op lltm_cell(x: T[N, I], h: T[N, H], c: T[N, H], w: T[H + I, 3 * H], b: T[3 * H]) -> (h_out: T[N, H], c_out: T[N, H]) {
  hx = concat2d_axis1(h, x)
  g = linear(hx, w, b)
  cand[n, j in 0..H] = g[n, 2 * H + j] if g[n, 2 * H + j] > 0.0 else exp(g[n, 2 * H + j]) - 1.0
  c_out[n, j] = c[n, j] + cand[n, j] * sigmoid(g[n, j])
  h_out[n, j] = tanh(c_out[n, j]) * sigmoid(g[n, H + j])
}
