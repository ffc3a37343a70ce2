import std.nn
model fuzz() {
  input  x1: f32[5, 6, 2]
  input  x2: f32[5, 12]
  param  w3: f32[2, 1] = normal(0.0, 1.0)
  param  w4: f32[16] = normal(0.0, 1.0)
  t5[i0 in 0..6, i1 in 0..3, i2 in 0..1] = (f32(i0) * 0.25 if i0 < 2 else log(abs(w4[(2 * i1 + 1) % 16]) + 0.5))
  t6[i0 in 0..6, i1 in 0..3, i2 in 0..1] = max(k7 in 0..6) (((t5[2 - i1, i1, i1 // 4] if w4[3 * i1 + k7] > 0.5 else (t5[(2 * k7 + 1) % 6, i0 // 3, i0] if i0 < 1 else 0.0)) + rsqrt(abs(t5[(2 * i1 + 1) % 6, i0 % 3, i1 // 3]) + 0.5)))
  t8[i0 in 0..6, i1 in 0..3, i2 in 0..1] = ((t6[(i1 + 3) % 6, i1, i1 - 1] if 1 <= i1 < 2 else 0.0) / (abs(w4[i1 % 2]) + 0.5))
  t9 = w4 - w4
  t10[i0 in 0..2, i1 in 0..2, i2 in 0..3, i3 in 0..6] = prod(k11 in 0..6, k12 in 0..3) ((1.0 + 0.1 * tanh((t9[i0 + k12] * 2.0))))
  t13[i0 in 0..2, i1 in 0..4, i2 in 0..3, i3 in 0..6] = (((x2[2 - i2, 1 - i0] / (abs(t9[i3 // 4]) + 0.5)) if i1 < 3 else (w3[i0 // 4, i0 // 2] * (t10[i2 // 4, i1, i3 // 2, i2 // 3] if i1 < 2 else 0.0))) + ((w3[(i1 + 2) % 2, i0 // 2] / (1.0 + w4[i3 % 2] * w4[i3 % 2])) / (abs(((t5[i3, i2 // 3, i0] if i0 < 1 else 0.0) * t10[(i2 + 2) % 2, i1 // 3, i0 + 1, i0 // 4])) + 0.5)))
  loss = (sum(j0 in 0..2, j1 in 0..4, j2 in 0..3, j3 in 0..6) t13[j0, j1, j2, j3] * t13[j0, j1, j2, j3]) * 0.000137
  output t8, t13
  minimize loss with sgd(lr = 0.1)
}
