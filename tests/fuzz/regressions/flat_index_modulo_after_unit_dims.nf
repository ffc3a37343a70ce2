import std.nn
model fuzz() {
  input  x1: f32[17, 9]
  input  x2: f32[1, 4, 3]
  input  x3: f32[3, 2, 5, 3]
  param  w4: f32[2, 8] = normal(0.0, 1.0)
  param  w5: f32[4, 7] = normal(0.0, 1.0)
  param  w12: f32[3] = normal(0.0, 1.0)
  param  w13: f32[3] = normal(0.0, 1.0)
  t6[i0 in 0..17, i1 in 0..9] = log(abs(((w5[i1 % 2, i1 % 2] / (1.0 + (w5[i0, i0 % 3] if i0 < 4 else 0.0) * (w5[i0, i0 % 3] if i0 < 4 else 0.0))) if x1[8 - i1, i0 // 2] > -1.0 else (w5[(2 * i0 + 1) % 4, i1 - 1] if 1 <= i1 < 8 else 0.0))) + 0.5)
  t7[i0 in 0..4, i1 in 0..7] = sum(k8 in 0..3) (((t6[i1 // 3, i0 // 3] * 2.0) / (1.0 + exp(t6[2 * i0 + k8, 2 * i0 + k8]) * exp(t6[2 * i0 + k8, 2 * i0 + k8]))))
  t9[i0 in 0..2, i1 in 0..8] = prod(k10 in 0..2) ((1.0 + 0.1 * tanh((w5[i1 % 4, k10 // 2] + t7[i1 % 2, 2 * i0 + k10]))))
  t11 = layer_norm(x2, w12, w13)
  t14[i0 in 0..3] = sum(k15 in 0..3) (((w13[1 * i0 + k15 - 1] if 0 <= 1 * i0 + k15 - 1 < 3 else 0.0) * t11[i0 // 4, (i0 + 3) % 4, k15 % 2]))
  t16[i0 in 0..3, i1 in 0..2, i2 in 0..5] = (t14[2] + tanh(t14[i2 // 4]))
  loss = (sum(j0 in 0..2, j1 in 0..8) w4[j0, j1] * w4[j0, j1]) * 0.0125 + (sum(j0 in 0..2, j1 in 0..8) t9[j0, j1] * t9[j0, j1]) * 0.047 + (sum(j0 in 0..3, j1 in 0..2, j2 in 0..5) t16[j0, j1, j2]) * 0.000162
  output w4, t9
  minimize loss with sgd(lr = 0.05, momentum = 0.9)
}
