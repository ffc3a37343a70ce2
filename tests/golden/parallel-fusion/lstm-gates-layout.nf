# RUN: nfc opt %s --no-locs -p 'im2col,inline,canonicalize,cse,dce,parallel-fusion{layout=true},training-functions' --eval | filecheck %s
# An LSTM cell whose four gates have their own weights: with layout=true the four input
# weights and the four recurrent weights become two parameters (read at every step without a
# concatenation), and the train step updates them with one optimizer state each.
import std.nn

op cell4(x: T[N, I], h: T[N, H], c: T[N, H],
         wi: T[I, H], wf: T[I, H], wg: T[I, H], wo: T[I, H],
         ui: T[H, H], uf: T[H, H], ug: T[H, H], uo: T[H, H]) -> (h_out: T[N, H], c_out: T[N, H]) {
  ig[n, j] = sigmoid((sum(k) x[n, k] * wi[k, j]) + (sum(k) h[n, k] * ui[k, j]))
  fg[n, j] = sigmoid((sum(k) x[n, k] * wf[k, j]) + (sum(k) h[n, k] * uf[k, j]))
  gg[n, j] = tanh((sum(k) x[n, k] * wg[k, j]) + (sum(k) h[n, k] * ug[k, j]))
  og[n, j] = sigmoid((sum(k) x[n, k] * wo[k, j]) + (sum(k) h[n, k] * uo[k, j]))
  c_out[n, j] = fg[n, j] * c[n, j] + ig[n, j] * gg[n, j]
  h_out[n, j] = og[n, j] * tanh(c_out[n, j])
}

model lstm4(batch = 2, steps = 2, inputs = 3, hidden = 4) {
  input  x: f32[batch, steps, inputs]
  input  y: i32[batch]
  param  wi: f32[inputs, hidden] = glorot_uniform
  param  wf: f32[inputs, hidden] = glorot_uniform
  param  wg: f32[inputs, hidden] = glorot_uniform
  param  wo: f32[inputs, hidden] = glorot_uniform
  param  ui: f32[hidden, hidden] = glorot_uniform
  param  uf: f32[hidden, hidden] = glorot_uniform
  param  ug: f32[hidden, hidden] = glorot_uniform
  param  uo: f32[hidden, hidden] = glorot_uniform
  h[n in 0..batch, j in 0..hidden] = 0.5
  c[n in 0..batch, j in 0..hidden] = 0.0
  for t in 0..steps {
    x_t[n, i] = x[n, t, i]
    h, c = cell4(x_t, h, c, wi, wf, wg, wo, ui, uf, ug, uo)
  }
  loss = softmax_cross_entropy(h, y)
  minimize loss with adam(lr = 0.01)
}
# CHECK-LABEL: nf.func @forward
# CHECK-SAME:  %wi_wf_wg_wo: tensor<3x16xf32> {nf.role = "param", nf.init = "zeros", nf.trainable = true, nf.layout = {parts = ["wi", "wf", "wg", "wo"], axis = 1, offsets = [0, 4, 8, 12], inits = ["glorot_uniform", "glorot_uniform", "glorot_uniform", "glorot_uniform"]}}
# CHECK-SAME:  %ui_uf_ug_uo: tensor<4x16xf32> {{.*}}nf.layout = {parts = ["ui", "uf", "ug", "uo"], axis = 1, offsets = [0, 4, 8, 12]
# CHECK-NOT:   select(d1 <
# CHECK:       sum [k: 3] (%{{[a-z0-9_]+}}[n, k] * %wi_wf_wg_wo[k, j])
# CHECK-LABEL: nf.func @train_step
# CHECK-SAME:  %wi_wf_wg_wo_m: tensor<3x16xf32> {nf.role = "opt_state"
# CHECK-SAME:  %ui_uf_ug_uo_v: tensor<4x16xf32> {nf.role = "opt_state"
