# Layers shared by the benchmark models in this folder (`import layers`). No model here.
import std.nn

# Batch norm in either mode, with PyTorch's running-statistics rule: in training the batch
# statistics normalise and the running averages move towards them (the variance unbiased,
# n / (n - 1), as torch.nn.BatchNorm2d does); in evaluation the running averages normalise and
# come back unchanged. Call it with `train = training` and write the `update`s in the model.
op bn<train: bool, momentum: float = 0.1>(x: T[N, C, H, W], g: T[C], b: T[C], m: T[C], v: T[C]) -> (y: T[N, C, H, W], new_m: T[C], new_v: T[C]) {
  if train {
    y, mean, var = batch_norm_train(x, g, b)
    new_m[c] = (1.0 - momentum) * m[c] + momentum * mean[c]
    new_v[c] = (1.0 - momentum) * v[c] + momentum * var[c] * (N * H * W) / (N * H * W - 1)
  } else {
    y = batch_norm_eval(x, g, b, m, v)
    new_m = m
    new_v = v
  }
}

# conv (no bias) -> batch norm -> ReLU, the building brick of ResNet and MobileNet
op conv_bn_relu<train: bool, stride: int = 1, padding: int = 0, groups: int = 1>(x: T[N, CG * groups, H, W], k: T[O, CG, KH, KW], g: T[O], b: T[O], m: T[O], v: T[O]) -> (y: T[N, O, (H + 2 * padding - KH) // stride + 1, (W + 2 * padding - KW) // stride + 1], new_m: T[O], new_v: T[O]) {
  z, new_m, new_v = bn<train = train>(conv2d<stride = stride, padding = padding, groups = groups>(x, k), g, b, m, v)
  y = relu_4d(z)
}
