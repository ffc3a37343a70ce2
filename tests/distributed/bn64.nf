# A batch-norm model in f64 for the data-parallel tests (digits, 1x8x8 images): its running
# mean after one step is the mean over the global batch when --bn sync averages it.
import std.nn

op bn<momentum: float = 0.1>(x: T[N, C, H, W], g: T[C], b: T[C], rm: T[C], rv: T[C])
    -> (y: T[N, C, H, W], new_rm: T[C], new_rv: T[C]) {
  y, m, v = batch_norm_train(x, g, b)
  new_rm[c] = (1.0 - momentum) * rm[c] + momentum * m[c]
  new_rv[c] = (1.0 - momentum) * rv[c] + momentum * v[c]
}

model bn64(batch = 16) {
  input  x: f64[batch, 1, 8, 8]
  input  y: i32[batch]
  param  k1: f64[4, 1, 3, 3] = he_normal
  param  g1: f64[4] = ones
  param  b1: f64[4] = zeros
  state  m1: f64[4] = zeros
  state  v1: f64[4] = ones
  param  w2: f64[144, 10] = glorot_uniform
  param  b2: f64[10] = zeros
  z = conv2d(x, k1)
  if training {
    a, nm, nv = bn(z, g1, b1, m1, v1)
    update m1 = nm
    update v1 = nv
  } else {
    a = batch_norm_eval(z, g1, b1, m1, v1)
  }
  logits = linear(flatten(relu_4d(a)), w2, b2)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1)
}
