# SqueezeNet (Iandola et al., 2016), v1.1 layout for small images: conv3x3/2 stem, max pool,
# two fire modules, max pool, two wider fire modules, a 1x1 conv to the classes, ReLU, global
# average pool. A fire module squeezes with 1x1 convolutions and expands with parallel 1x1 and
# 3x3 convolutions whose outputs are concatenated along channels (a conditional expression,
# std.nn concat4d_axis1). `squeeze` scales every width; 16 is SqueezeNet v1.1's first fire.
# Dropout before the last conv is left out so that runs are deterministic.
import std.nn

op conv_relu<padding: int = 0>(x: T[N, C, H, W], k: T[O, C, KH, KW], b: T[O]) -> T[N, O, H + 2 * padding - KH + 1, W + 2 * padding - KW + 1] {
  y = relu_4d(bias_add_nchw(conv2d<padding = padding>(x, k), b))
}

op fire(x: T[N, C, H, W], ks: T[S, C, 1, 1], bs: T[S], k1: T[E1, S, 1, 1], b1: T[E1], k3: T[E3, S, 3, 3], b3: T[E3]) -> T[N, E1 + E3, H, W] {
  s = conv_relu(x, ks, bs)
  y = concat4d_axis1(conv_relu(s, k1, b1), conv_relu<padding = 1>(s, k3, b3))
}

model squeezenet(batch = 16, image = 32, squeeze = 16, classes = 10) {
  input  x: f32[batch, 3, image, image]
  input  y: i32[batch]
  param  k0: f32[4 * squeeze, 3, 3, 3] = he_normal
  param  b0: f32[4 * squeeze] = zeros
  # fire 2 and 3: squeeze s, expand 4s + 4s
  param  f2_ks: f32[squeeze, 4 * squeeze, 1, 1] = he_normal
  param  f2_bs: f32[squeeze] = zeros
  param  f2_k1: f32[4 * squeeze, squeeze, 1, 1] = he_normal
  param  f2_b1: f32[4 * squeeze] = zeros
  param  f2_k3: f32[4 * squeeze, squeeze, 3, 3] = he_normal
  param  f2_b3: f32[4 * squeeze] = zeros
  param  f3_ks: f32[squeeze, 8 * squeeze, 1, 1] = he_normal
  param  f3_bs: f32[squeeze] = zeros
  param  f3_k1: f32[4 * squeeze, squeeze, 1, 1] = he_normal
  param  f3_b1: f32[4 * squeeze] = zeros
  param  f3_k3: f32[4 * squeeze, squeeze, 3, 3] = he_normal
  param  f3_b3: f32[4 * squeeze] = zeros
  # fire 4 and 5: squeeze 2s, expand 8s + 8s
  param  f4_ks: f32[2 * squeeze, 8 * squeeze, 1, 1] = he_normal
  param  f4_bs: f32[2 * squeeze] = zeros
  param  f4_k1: f32[8 * squeeze, 2 * squeeze, 1, 1] = he_normal
  param  f4_b1: f32[8 * squeeze] = zeros
  param  f4_k3: f32[8 * squeeze, 2 * squeeze, 3, 3] = he_normal
  param  f4_b3: f32[8 * squeeze] = zeros
  param  f5_ks: f32[2 * squeeze, 16 * squeeze, 1, 1] = he_normal
  param  f5_bs: f32[2 * squeeze] = zeros
  param  f5_k1: f32[8 * squeeze, 2 * squeeze, 1, 1] = he_normal
  param  f5_b1: f32[8 * squeeze] = zeros
  param  f5_k3: f32[8 * squeeze, 2 * squeeze, 3, 3] = he_normal
  param  f5_b3: f32[8 * squeeze] = zeros
  # classifier: 1x1 conv to the classes
  param  k10: f32[classes, 16 * squeeze, 1, 1] = he_normal  # torchvision's normal(0, 0.01) stalls
  param  b10: f32[classes] = zeros
  h = relu_4d(bias_add_nchw(conv2d<stride = 2>(x, k0), b0))
  h = max_pool2d<size = 3, stride = 2>(h)
  h = fire(h, f2_ks, f2_bs, f2_k1, f2_b1, f2_k3, f2_b3)
  h = fire(h, f3_ks, f3_bs, f3_k1, f3_b1, f3_k3, f3_b3)
  h = max_pool2d<size = 3, stride = 2>(h)
  h = fire(h, f4_ks, f4_bs, f4_k1, f4_b1, f4_k3, f4_b3)
  h = fire(h, f5_ks, f5_bs, f5_k1, f5_b1, f5_k3, f5_b3)
  logits = global_avg_pool(conv_relu(h, k10, b10))
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.01, momentum = 0.9)
}
