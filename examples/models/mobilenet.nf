# MobileNet (Howard et al., 2017) depthwise-separable blocks for small images: a conv3x3/2
# stem, then blocks of depthwise 3x3 conv -> BN -> ReLU -> pointwise 1x1 conv -> BN -> ReLU
# (the second block strided), global average pool, classifier. Batch norm with running
# statistics (PyTorch's rule, layers.nf).
import std.nn
import layers

op separable<train: bool, stride: int = 1>(x: T[N, C, H, W], kd: T[C, 1, 3, 3], gd: T[C], bd: T[C], md: T[C], vd: T[C], kp: T[O, C, 1, 1], gp: T[O], bp: T[O], mp: T[O], vp: T[O]) -> (y: T[N, O, (H - 1) // stride + 1, (W - 1) // stride + 1], nmd: T[C], nvd: T[C], nmp: T[O], nvp: T[O]) {
  zd, nmd, nvd = bn<train = train>(depthwise_conv2d<stride = stride, padding = 1>(x, kd), gd, bd, md, vd)
  y, nmp, nvp = conv_bn_relu<train = train>(relu_4d(zd), kp, gp, bp, mp, vp)
}

model mobilenet(batch = 16, image = 32, width = 32, classes = 10) {
  input  x: f32[batch, 3, image, image]
  input  y: i32[batch]
  param  k0: f32[width, 3, 3, 3] = he_normal
  param  g0: f32[width] = ones
  param  b0: f32[width] = zeros
  state  m0: f32[width] = zeros
  state  v0: f32[width] = ones
  # block 1: depthwise on width channels, pointwise width -> 2 * width
  param  d1_k: f32[width, 1, 3, 3] = he_normal
  param  d1_g: f32[width] = ones
  param  d1_b: f32[width] = zeros
  state  d1_m: f32[width] = zeros
  state  d1_v: f32[width] = ones
  param  p1_k: f32[2 * width, width, 1, 1] = he_normal
  param  p1_g: f32[2 * width] = ones
  param  p1_b: f32[2 * width] = zeros
  state  p1_m: f32[2 * width] = zeros
  state  p1_v: f32[2 * width] = ones
  # block 2: stride 2, pointwise 2 * width -> 4 * width
  param  d2_k: f32[2 * width, 1, 3, 3] = he_normal
  param  d2_g: f32[2 * width] = ones
  param  d2_b: f32[2 * width] = zeros
  state  d2_m: f32[2 * width] = zeros
  state  d2_v: f32[2 * width] = ones
  param  p2_k: f32[4 * width, 2 * width, 1, 1] = he_normal
  param  p2_g: f32[4 * width] = ones
  param  p2_b: f32[4 * width] = zeros
  state  p2_m: f32[4 * width] = zeros
  state  p2_v: f32[4 * width] = ones
  param  fc_w: f32[4 * width, classes] = glorot_uniform
  param  fc_b: f32[classes] = zeros
  h, nm0, nv0 = conv_bn_relu<train = training, stride = 2, padding = 1>(x, k0, g0, b0, m0, v0)
  h, nd1m, nd1v, np1m, np1v = separable<train = training>(h, d1_k, d1_g, d1_b, d1_m, d1_v, p1_k, p1_g, p1_b, p1_m, p1_v)
  h, nd2m, nd2v, np2m, np2v = separable<train = training, stride = 2>(h, d2_k, d2_g, d2_b, d2_m, d2_v, p2_k, p2_g, p2_b, p2_m, p2_v)
  logits = linear(global_avg_pool(h), fc_w, fc_b)
  if training {
    update m0 = nm0
    update v0 = nv0
    update d1_m = nd1m
    update d1_v = nd1v
    update p1_m = np1m
    update p1_v = np1v
    update d2_m = nd2m
    update d2_v = nd2v
    update p2_m = np2m
    update p2_v = np2v
  }
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.05, momentum = 0.9)
}
