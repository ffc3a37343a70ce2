# A small residual network: stem -> basic block (identity shortcut) -> downsampling block
# (stride 2, 1x1 projection shortcut) -> global average pool -> classifier. Batch norm uses
# batch statistics while training (updating running averages) and those averages otherwise.
import std.nn

op bn<momentum: float = 0.1>(x: T[N, C, H, W], g: T[C], b: T[C], rm: T[C], rv: T[C])
    -> (y: T[N, C, H, W], new_rm: T[C], new_rv: T[C]) {
  y, m, v = batch_norm_train(x, g, b)
  new_rm[c] = (1.0 - momentum) * rm[c] + momentum * m[c]
  new_rv[c] = (1.0 - momentum) * rv[c] + momentum * v[c]
}

model resnet_block(batch = 8, classes = 10) {
  input  x: f32[batch, 3, 16, 16]
  input  y: i32[batch]
  param  k0: f32[8, 3, 3, 3] = he_normal
  param  k1: f32[8, 8, 3, 3] = he_normal
  param  k2: f32[8, 8, 3, 3] = he_normal
  param  k3: f32[16, 8, 3, 3] = he_normal
  param  k4: f32[16, 16, 3, 3] = he_normal
  param  kp: f32[16, 8, 1, 1] = he_normal
  param  g0: f32[8] = ones
  param  b0: f32[8] = zeros
  param  g1: f32[8] = ones
  param  b1: f32[8] = zeros
  param  g2: f32[8] = ones
  param  b2: f32[8] = zeros
  param  g3: f32[16] = ones
  param  b3: f32[16] = zeros
  param  g4: f32[16] = ones
  param  b4: f32[16] = zeros
  param  gp: f32[16] = ones
  param  bp: f32[16] = zeros
  state  m0: f32[8] = zeros
  state  v0: f32[8] = ones
  state  m1: f32[8] = zeros
  state  v1: f32[8] = ones
  state  m2: f32[8] = zeros
  state  v2: f32[8] = ones
  state  m3: f32[16] = zeros
  state  v3: f32[16] = ones
  state  m4: f32[16] = zeros
  state  v4: f32[16] = ones
  state  mp: f32[16] = zeros
  state  vp: f32[16] = ones
  param  wo: f32[16, classes] = glorot_uniform
  param  bo: f32[classes] = zeros
  z0 = conv2d<padding = 1>(x, k0)                                    # stem: [batch, 8, 16, 16]
  if training {
    a0, nm0, nv0 = bn(z0, g0, b0, m0, v0)
    h0 = relu_4d(a0)
    a1, nm1, nv1 = bn(conv2d<padding = 1>(h0, k1), g1, b1, m1, v1)  # basic block
    a2, nm2, nv2 = bn(conv2d<padding = 1>(relu_4d(a1), k2), g2, b2, m2, v2)
    h1 = relu_4d(a2 + h0)
    a3, nm3, nv3 = bn(conv2d<stride = 2, padding = 1>(h1, k3), g3, b3, m3, v3)  # downsample
    a4, nm4, nv4 = bn(conv2d<padding = 1>(relu_4d(a3), k4), g4, b4, m4, v4)
    ap, nmp, nvp = bn(conv2d<stride = 2>(h1, kp), gp, bp, mp, vp)
    h2 = relu_4d(a4 + ap)
    update m0 = nm0
    update v0 = nv0
    update m1 = nm1
    update v1 = nv1
    update m2 = nm2
    update v2 = nv2
    update m3 = nm3
    update v3 = nv3
    update m4 = nm4
    update v4 = nv4
    update mp = nmp
    update vp = nvp
  } else {
    h0 = relu_4d(batch_norm_eval(z0, g0, b0, m0, v0))
    a1 = batch_norm_eval(conv2d<padding = 1>(h0, k1), g1, b1, m1, v1)
    a2 = batch_norm_eval(conv2d<padding = 1>(relu_4d(a1), k2), g2, b2, m2, v2)
    h1 = relu_4d(a2 + h0)
    a3 = batch_norm_eval(conv2d<stride = 2, padding = 1>(h1, k3), g3, b3, m3, v3)
    a4 = batch_norm_eval(conv2d<padding = 1>(relu_4d(a3), k4), g4, b4, m4, v4)
    ap = batch_norm_eval(conv2d<stride = 2>(h1, kp), gp, bp, mp, vp)
    h2 = relu_4d(a4 + ap)
  }
  logits = linear(global_avg_pool(h2), wo, bo)                       # h2: [batch, 16, 8, 8]
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.05, momentum = 0.9)
}
