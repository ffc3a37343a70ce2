# CapsuleNet (Sabour et al., 2017, "Dynamic routing between capsules") on 28x28 digits:
#   conv 9x9, 1 -> 256 channels, ReLU                                 [batch, 256, 20, 20]
#   primary capsules: a capsule convolution 9x9 / 2 producing 32 capsule types of 8-vectors
#   on a 6x6 grid, written as one comprehension                     [batch, 32, 6, 6, 8]
#   squash; digit capsules: every primary capsule i predicts each class capsule j,
#   u_hat[i, j] = W[i, j] u[i] (16x8 matrices)                        [batch, 1152, 10, 16]
#   three rounds of dynamic routing: coupling = softmax over classes of the routing logits,
#   s = coupling-weighted sum of predictions, v = squash(s), logits += agreement u_hat . v
#   capsule lengths and the margin loss (no reconstruction decoder).
import std.nn

# conv2d of x straight into capsules: output capsule type p, grid cell (i, j), component d
op primary_capsules<stride: int = 2>(x: T[N, C, H, W], k: T[P, D, C, KH, KW], b: T[P, D]) -> T[N, P, (H - KH) // stride + 1, (W - KW) // stride + 1, D] {
  y[n, p, i, j, d] = (sum(c, r, s) x[n, c, i * stride + r, j * stride + s] * k[p, d, c, r, s]) + b[p, d]
}

# one round of routing by agreement: routing logits blog -> (class capsules v, new logits)
op route(blog: T[N, I, J], uhat: T[N, I, J, E]) -> (v: T[N, J, E], new_logits: T[N, I, J]) {
  mx[n, i] = max(j) blog[n, i, j]
  ex[n, i, j] = exp(blog[n, i, j] - mx[n, i])
  coupling[n, i, j] = ex[n, i, j] / (sum(k) ex[n, i, k])
  s[n, j, e] = sum(i) coupling[n, i, j] * uhat[n, i, j, e]
  v = squash(s)
  new_logits[n, i, j] = blog[n, i, j] + (sum(e) uhat[n, i, j, e] * v[n, j, e])
}

model capsnet(batch = 16, image = 28, kernel = 9, channels = 256, types = 32, pdim = 8, ddim = 16, classes = 10, rounds = 3) {
  grid = (image - 2 * kernel + 1) // 2 + 1       # side of the primary capsule grid
  caps = types * grid * grid                     # number of primary capsules (1152)
  input  x: f32[batch, 1, image, image]
  input  y: i32[batch]
  param  k1: f32[channels, 1, kernel, kernel] = he_normal
  param  b1: f32[channels] = zeros
  param  kp: f32[types, pdim, channels, kernel, kernel] = normal(0.0, 0.01)
  param  bp: f32[types, pdim] = zeros
  param  wd: f32[caps, classes, ddim, pdim] = normal(0.0, 0.05)
  h = relu_4d(bias_add_nchw(conv2d(x, k1), b1))
  u = squash(reshape<[batch, caps, pdim]>(primary_capsules(h, kp, bp)))
  uhat[n, i, j, e] = sum(d) wd[i, j, e, d] * u[n, i, d]
  blog[n in 0..batch, i in 0..caps, j in 0..classes] = 0.0
  for r in 0..rounds {
    v, blog = route(blog, uhat)                 # the last round's new logits go unused
  }
  lengths = capsule_length(v)
  loss = margin_loss(lengths, y)
  output lengths
  minimize loss with sgd(lr = 0.01, momentum = 0.9)
}
