# A small conv net with batch norm (training statistics, running averages as state) and
# dropout drawn from the in-graph generator.
import std.nn

model bnnet(batch = 4, classes = 3) {
  input  x: f64[batch, 2, 5, 5]
  input  y: i32[batch]
  param  k: f64[3, 2, 3, 3] = he_normal
  param  g: f64[3] = ones
  param  b: f64[3] = zeros
  param  w: f64[27, classes] = normal(0.0, 0.3)
  state  rm: f64[3] = zeros
  state  rv: f64[3] = ones
  random u: f64[batch, 27]
  c = conv2d<stride = 2, padding = 1>(x, k)
  if training {
    yb, mean, var = batch_norm_train(c, g, b)
    update rm = 0.9 * rm + 0.1 * mean
    update rv = 0.9 * rv + 0.1 * var
    h = dropout<p = 0.25>(flatten(relu_4d(yb)), u)
  } else {
    h = flatten(relu_4d(batch_norm_eval(c, g, b, rm, rv)))
  }
  logits = matmul(h, w)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.05, momentum = 0.9, nesterov = true, clip_norm = 5.0)
}
