# MLP-3 (784-256-128-10) on flattened 28x28 images, trained with SGD + momentum.
# The layer sizes are model params, so `params={"inputs": 64, ...}` retargets it.
import std.nn

model mlp(batch = 256, inputs = 784, hidden1 = 256, hidden2 = 128, classes = 10) {
  input  x: f32[batch, inputs]
  input  y: i32[batch]
  param  w1: f32[inputs, hidden1] = he_normal
  param  b1: f32[hidden1] = zeros
  param  w2: f32[hidden1, hidden2] = he_normal
  param  b2: f32[hidden2] = zeros
  param  w3: f32[hidden2, classes] = glorot_uniform
  param  b3: f32[classes] = zeros
  h1 = relu(linear(x, w1, b1))
  h2 = relu(linear(h1, w2, b2))
  logits = linear(h2, w3, b3)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1, momentum = 0.9)
}
