# ResNet-18 (He et al., 2016) for small images: a 3x3 stem (CIFAR style, no max pool), four
# stages of two basic blocks (channels width, 2w, 4w, 8w; stages 2-4 start with a stride-2 block
# whose shortcut is a 1x1 projection), global average pool, classifier: 17 convolutions + 3
# projections + 1 linear layer. Batch norm after every convolution, with running statistics
# (PyTorch's rule, layers.nf). The real ResNet-18 has width 64 and a 224x224 input.
import std.nn
import layers

# conv3x3-BN-ReLU-conv3x3-BN, identity shortcut, ReLU
op basic_block<train: bool>(x: T[N, C, H, W], k1: T[C, C, 3, 3], g1: T[C], b1: T[C], m1: T[C], v1: T[C], k2: T[C, C, 3, 3], g2: T[C], b2: T[C], m2: T[C], v2: T[C]) -> (y: T[N, C, H, W], nm1: T[C], nv1: T[C], nm2: T[C], nv2: T[C]) {
  a, nm1, nv1 = conv_bn_relu<train = train, padding = 1>(x, k1, g1, b1, m1, v1)
  z, nm2, nv2 = bn<train = train>(conv2d<padding = 1>(a, k2), g2, b2, m2, v2)
  y = relu_4d(z + x)
}

# the same with stride 2 and C -> D channels; the shortcut is a strided 1x1 conv + BN
op down_block<train: bool>(x: T[N, C, H, W], k1: T[D, C, 3, 3], g1: T[D], b1: T[D], m1: T[D], v1: T[D], k2: T[D, D, 3, 3], g2: T[D], b2: T[D], m2: T[D], v2: T[D], kd: T[D, C, 1, 1], gd: T[D], bd: T[D], md: T[D], vd: T[D]) -> (y: T[N, D, (H - 1) // 2 + 1, (W - 1) // 2 + 1], nm1: T[D], nv1: T[D], nm2: T[D], nv2: T[D], nmd: T[D], nvd: T[D]) {
  a, nm1, nv1 = conv_bn_relu<train = train, stride = 2, padding = 1>(x, k1, g1, b1, m1, v1)
  z, nm2, nv2 = bn<train = train>(conv2d<padding = 1>(a, k2), g2, b2, m2, v2)
  s, nmd, nvd = bn<train = train>(conv2d<stride = 2>(x, kd), gd, bd, md, vd)
  y = relu_4d(z + s)
}

model resnet18(batch = 16, image = 32, width = 16, classes = 10) {
  input  x: f32[batch, 3, image, image]
  input  y: i32[batch]
  # stem: conv3x3 3 -> width, BN, ReLU
  param  stem_k: f32[width, 3, 3, 3] = he_normal
  param  stem_g: f32[width] = ones
  param  stem_b: f32[width] = zeros
  state  stem_m: f32[width] = zeros
  state  stem_v: f32[width] = ones
  # stage 1, block a: width -> width channels
  param  s1a_k1: f32[width, width, 3, 3] = he_normal
  param  s1a_1_g: f32[width] = ones
  param  s1a_1_b: f32[width] = zeros
  state  s1a_1_m: f32[width] = zeros
  state  s1a_1_v: f32[width] = ones
  param  s1a_k2: f32[width, width, 3, 3] = he_normal
  param  s1a_2_g: f32[width] = ones
  param  s1a_2_b: f32[width] = zeros
  state  s1a_2_m: f32[width] = zeros
  state  s1a_2_v: f32[width] = ones
  # stage 1, block b
  param  s1b_k1: f32[width, width, 3, 3] = he_normal
  param  s1b_1_g: f32[width] = ones
  param  s1b_1_b: f32[width] = zeros
  state  s1b_1_m: f32[width] = zeros
  state  s1b_1_v: f32[width] = ones
  param  s1b_k2: f32[width, width, 3, 3] = he_normal
  param  s1b_2_g: f32[width] = ones
  param  s1b_2_b: f32[width] = zeros
  state  s1b_2_m: f32[width] = zeros
  state  s1b_2_v: f32[width] = ones
  # stage 2, block a: stride 2, width -> 2 * width channels
  param  s2a_k1: f32[2 * width, width, 3, 3] = he_normal
  param  s2a_1_g: f32[2 * width] = ones
  param  s2a_1_b: f32[2 * width] = zeros
  state  s2a_1_m: f32[2 * width] = zeros
  state  s2a_1_v: f32[2 * width] = ones
  param  s2a_k2: f32[2 * width, 2 * width, 3, 3] = he_normal
  param  s2a_2_g: f32[2 * width] = ones
  param  s2a_2_b: f32[2 * width] = zeros
  state  s2a_2_m: f32[2 * width] = zeros
  state  s2a_2_v: f32[2 * width] = ones
  param  s2a_kd: f32[2 * width, width, 1, 1] = he_normal
  param  s2a_d_g: f32[2 * width] = ones
  param  s2a_d_b: f32[2 * width] = zeros
  state  s2a_d_m: f32[2 * width] = zeros
  state  s2a_d_v: f32[2 * width] = ones
  # stage 2, block b
  param  s2b_k1: f32[2 * width, 2 * width, 3, 3] = he_normal
  param  s2b_1_g: f32[2 * width] = ones
  param  s2b_1_b: f32[2 * width] = zeros
  state  s2b_1_m: f32[2 * width] = zeros
  state  s2b_1_v: f32[2 * width] = ones
  param  s2b_k2: f32[2 * width, 2 * width, 3, 3] = he_normal
  param  s2b_2_g: f32[2 * width] = ones
  param  s2b_2_b: f32[2 * width] = zeros
  state  s2b_2_m: f32[2 * width] = zeros
  state  s2b_2_v: f32[2 * width] = ones
  # stage 3, block a: stride 2, 2 * width -> 4 * width channels
  param  s3a_k1: f32[4 * width, 2 * width, 3, 3] = he_normal
  param  s3a_1_g: f32[4 * width] = ones
  param  s3a_1_b: f32[4 * width] = zeros
  state  s3a_1_m: f32[4 * width] = zeros
  state  s3a_1_v: f32[4 * width] = ones
  param  s3a_k2: f32[4 * width, 4 * width, 3, 3] = he_normal
  param  s3a_2_g: f32[4 * width] = ones
  param  s3a_2_b: f32[4 * width] = zeros
  state  s3a_2_m: f32[4 * width] = zeros
  state  s3a_2_v: f32[4 * width] = ones
  param  s3a_kd: f32[4 * width, 2 * width, 1, 1] = he_normal
  param  s3a_d_g: f32[4 * width] = ones
  param  s3a_d_b: f32[4 * width] = zeros
  state  s3a_d_m: f32[4 * width] = zeros
  state  s3a_d_v: f32[4 * width] = ones
  # stage 3, block b
  param  s3b_k1: f32[4 * width, 4 * width, 3, 3] = he_normal
  param  s3b_1_g: f32[4 * width] = ones
  param  s3b_1_b: f32[4 * width] = zeros
  state  s3b_1_m: f32[4 * width] = zeros
  state  s3b_1_v: f32[4 * width] = ones
  param  s3b_k2: f32[4 * width, 4 * width, 3, 3] = he_normal
  param  s3b_2_g: f32[4 * width] = ones
  param  s3b_2_b: f32[4 * width] = zeros
  state  s3b_2_m: f32[4 * width] = zeros
  state  s3b_2_v: f32[4 * width] = ones
  # stage 4, block a: stride 2, 4 * width -> 8 * width channels
  param  s4a_k1: f32[8 * width, 4 * width, 3, 3] = he_normal
  param  s4a_1_g: f32[8 * width] = ones
  param  s4a_1_b: f32[8 * width] = zeros
  state  s4a_1_m: f32[8 * width] = zeros
  state  s4a_1_v: f32[8 * width] = ones
  param  s4a_k2: f32[8 * width, 8 * width, 3, 3] = he_normal
  param  s4a_2_g: f32[8 * width] = ones
  param  s4a_2_b: f32[8 * width] = zeros
  state  s4a_2_m: f32[8 * width] = zeros
  state  s4a_2_v: f32[8 * width] = ones
  param  s4a_kd: f32[8 * width, 4 * width, 1, 1] = he_normal
  param  s4a_d_g: f32[8 * width] = ones
  param  s4a_d_b: f32[8 * width] = zeros
  state  s4a_d_m: f32[8 * width] = zeros
  state  s4a_d_v: f32[8 * width] = ones
  # stage 4, block b
  param  s4b_k1: f32[8 * width, 8 * width, 3, 3] = he_normal
  param  s4b_1_g: f32[8 * width] = ones
  param  s4b_1_b: f32[8 * width] = zeros
  state  s4b_1_m: f32[8 * width] = zeros
  state  s4b_1_v: f32[8 * width] = ones
  param  s4b_k2: f32[8 * width, 8 * width, 3, 3] = he_normal
  param  s4b_2_g: f32[8 * width] = ones
  param  s4b_2_b: f32[8 * width] = zeros
  state  s4b_2_m: f32[8 * width] = zeros
  state  s4b_2_v: f32[8 * width] = ones
  param  fc_w: f32[8 * width, classes] = glorot_uniform
  param  fc_b: f32[classes] = zeros

  h, stem_nm, stem_nv = conv_bn_relu<train = training, padding = 1>(x, stem_k, stem_g, stem_b, stem_m, stem_v)
  h, s1a_1_nm, s1a_1_nv, s1a_2_nm, s1a_2_nv = basic_block<train = training>(h, s1a_k1, s1a_1_g, s1a_1_b, s1a_1_m, s1a_1_v, s1a_k2, s1a_2_g, s1a_2_b, s1a_2_m, s1a_2_v)
  h, s1b_1_nm, s1b_1_nv, s1b_2_nm, s1b_2_nv = basic_block<train = training>(h, s1b_k1, s1b_1_g, s1b_1_b, s1b_1_m, s1b_1_v, s1b_k2, s1b_2_g, s1b_2_b, s1b_2_m, s1b_2_v)
  h, s2a_1_nm, s2a_1_nv, s2a_2_nm, s2a_2_nv, s2a_d_nm, s2a_d_nv = down_block<train = training>(h, s2a_k1, s2a_1_g, s2a_1_b, s2a_1_m, s2a_1_v, s2a_k2, s2a_2_g, s2a_2_b, s2a_2_m, s2a_2_v, s2a_kd, s2a_d_g, s2a_d_b, s2a_d_m, s2a_d_v)
  h, s2b_1_nm, s2b_1_nv, s2b_2_nm, s2b_2_nv = basic_block<train = training>(h, s2b_k1, s2b_1_g, s2b_1_b, s2b_1_m, s2b_1_v, s2b_k2, s2b_2_g, s2b_2_b, s2b_2_m, s2b_2_v)
  h, s3a_1_nm, s3a_1_nv, s3a_2_nm, s3a_2_nv, s3a_d_nm, s3a_d_nv = down_block<train = training>(h, s3a_k1, s3a_1_g, s3a_1_b, s3a_1_m, s3a_1_v, s3a_k2, s3a_2_g, s3a_2_b, s3a_2_m, s3a_2_v, s3a_kd, s3a_d_g, s3a_d_b, s3a_d_m, s3a_d_v)
  h, s3b_1_nm, s3b_1_nv, s3b_2_nm, s3b_2_nv = basic_block<train = training>(h, s3b_k1, s3b_1_g, s3b_1_b, s3b_1_m, s3b_1_v, s3b_k2, s3b_2_g, s3b_2_b, s3b_2_m, s3b_2_v)
  h, s4a_1_nm, s4a_1_nv, s4a_2_nm, s4a_2_nv, s4a_d_nm, s4a_d_nv = down_block<train = training>(h, s4a_k1, s4a_1_g, s4a_1_b, s4a_1_m, s4a_1_v, s4a_k2, s4a_2_g, s4a_2_b, s4a_2_m, s4a_2_v, s4a_kd, s4a_d_g, s4a_d_b, s4a_d_m, s4a_d_v)
  h, s4b_1_nm, s4b_1_nv, s4b_2_nm, s4b_2_nv = basic_block<train = training>(h, s4b_k1, s4b_1_g, s4b_1_b, s4b_1_m, s4b_1_v, s4b_k2, s4b_2_g, s4b_2_b, s4b_2_m, s4b_2_v)
  logits = linear(global_avg_pool(h), fc_w, fc_b)
  if training {
    update stem_m = stem_nm
    update stem_v = stem_nv
    update s1a_1_m = s1a_1_nm
    update s1a_1_v = s1a_1_nv
    update s1a_2_m = s1a_2_nm
    update s1a_2_v = s1a_2_nv
    update s1b_1_m = s1b_1_nm
    update s1b_1_v = s1b_1_nv
    update s1b_2_m = s1b_2_nm
    update s1b_2_v = s1b_2_nv
    update s2a_1_m = s2a_1_nm
    update s2a_1_v = s2a_1_nv
    update s2a_2_m = s2a_2_nm
    update s2a_2_v = s2a_2_nv
    update s2a_d_m = s2a_d_nm
    update s2a_d_v = s2a_d_nv
    update s2b_1_m = s2b_1_nm
    update s2b_1_v = s2b_1_nv
    update s2b_2_m = s2b_2_nm
    update s2b_2_v = s2b_2_nv
    update s3a_1_m = s3a_1_nm
    update s3a_1_v = s3a_1_nv
    update s3a_2_m = s3a_2_nm
    update s3a_2_v = s3a_2_nv
    update s3a_d_m = s3a_d_nm
    update s3a_d_v = s3a_d_nv
    update s3b_1_m = s3b_1_nm
    update s3b_1_v = s3b_1_nv
    update s3b_2_m = s3b_2_nm
    update s3b_2_v = s3b_2_nv
    update s4a_1_m = s4a_1_nm
    update s4a_1_v = s4a_1_nv
    update s4a_2_m = s4a_2_nm
    update s4a_2_v = s4a_2_nv
    update s4a_d_m = s4a_d_nm
    update s4a_d_v = s4a_d_nv
    update s4b_1_m = s4b_1_nm
    update s4b_1_v = s4b_1_nv
    update s4b_2_m = s4b_2_nm
    update s4b_2_v = s4b_2_nv
  }
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.05, momentum = 0.9)
}
