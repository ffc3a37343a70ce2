# One ShuffleNet (v1) unit with a tiny stem and head: grouped 1x1 conv -> BN -> ReLU ->
# channel shuffle -> depthwise 3x3 -> BN -> grouped 1x1 conv -> BN -> residual add -> ReLU.
import std.nn

model shufflenet_unit(batch = 8, groups = 2, channels = 16, classes = 10) {
  input  x: f32[batch, 3, 16, 16]
  input  y: i32[batch]
  param  k0: f32[channels, 3, 3, 3] = he_normal
  param  k1: f32[channels // 2, channels // groups, 1, 1] = he_normal
  param  k2: f32[channels // 2, 1, 3, 3] = he_normal
  param  k3: f32[channels, channels // 2 // groups, 1, 1] = he_normal
  param  g1: f32[channels // 2] = ones
  param  s1: f32[channels // 2] = zeros
  param  g2: f32[channels // 2] = ones
  param  s2: f32[channels // 2] = zeros
  param  g3: f32[channels] = ones
  param  s3: f32[channels] = zeros
  state  m1: f32[channels // 2] = zeros
  state  v1: f32[channels // 2] = ones
  state  m2: f32[channels // 2] = zeros
  state  v2: f32[channels // 2] = ones
  state  m3: f32[channels] = zeros
  state  v3: f32[channels] = ones
  param  wo: f32[channels, classes] = glorot_uniform
  param  bo: f32[classes] = zeros
  h = relu_4d(conv2d<stride = 2, padding = 1>(x, k0))                 # [batch, 16, 8, 8]
  z1 = conv2d<groups = groups>(h, k1)
  if training {
    a1, bm1, bv1 = batch_norm_train(z1, g1, s1)
    z2 = depthwise_conv2d<padding = 1>(channel_shuffle<groups = groups>(relu_4d(a1)), k2)
    a2, bm2, bv2 = batch_norm_train(z2, g2, s2)
    z3 = conv2d<groups = groups>(a2, k3)
    a3, bm3, bv3 = batch_norm_train(z3, g3, s3)
    update m1 = 0.9 * m1 + 0.1 * bm1
    update v1 = 0.9 * v1 + 0.1 * bv1
    update m2 = 0.9 * m2 + 0.1 * bm2
    update v2 = 0.9 * v2 + 0.1 * bv2
    update m3 = 0.9 * m3 + 0.1 * bm3
    update v3 = 0.9 * v3 + 0.1 * bv3
  } else {
    a1 = batch_norm_eval(z1, g1, s1, m1, v1)
    z2 = depthwise_conv2d<padding = 1>(channel_shuffle<groups = groups>(relu_4d(a1)), k2)
    a2 = batch_norm_eval(z2, g2, s2, m2, v2)
    z3 = conv2d<groups = groups>(a2, k3)
    a3 = batch_norm_eval(z3, g3, s3, m3, v3)
  }
  out = relu_4d(a3 + h)                                               # residual
  logits = linear(global_avg_pool(out), wo, bo)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.05, momentum = 0.9)
}
