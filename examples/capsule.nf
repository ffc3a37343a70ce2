# A small capsule network: conv -> primary 4x4 pose capsules -> capsule convolution (NeoFlow's
# novel op) -> squash -> class capsules -> lengths -> margin loss. No routing, to stay small.
import std.nn

model capsnet(batch = 16, classes = 10) {
  input  x: f32[batch, 1, 12, 12]
  input  y: i32[batch]
  param  k0: f32[32, 1, 3, 3] = he_normal
  param  c0: f32[32] = zeros
  param  k1: f32[4, 2, 3, 3, 4, 4] = normal(0.0, 0.05)
  param  w2: f32[1024, 160] = glorot_uniform
  a0 = relu_4d(bias_add_nchw(conv2d(x, k0), c0))                      # [batch, 32, 10, 10]
  # 32 channels = 2 capsule types x a 4x4 pose: move the pose to the last two axes
  p0 = reshape<[batch, 2, 10, 10, 4, 4]>(
         transpose<[0, 1, 3, 4, 2]>(reshape<[batch, 2, 16, 10, 10]>(a0)))
  p1 = capsule_conv<stride = 2>(p0, k1)                               # [batch, 4, 4, 4, 4, 4]
  u1 = squash(reshape<[batch, 64, 16]>(p1))                           # 64 capsules of 16
  v2 = squash(reshape<[batch, classes, 16]>(linear_nobias(reshape<[batch, 1024]>(u1), w2)))
  lengths = capsule_length(v2)                                        # [batch, classes]
  loss = margin_loss(lengths, y)
  output lengths
  minimize loss with sgd(lr = 0.01, momentum = 0.9)
}
