# Character-level LSTM language model (TVM_T's LSTM LM, at character level): embed each
# character, run an LSTM unrolled over `steps` positions (std.nn lstm_cell: [x, h] joined by a
# conditional expression, gates i, f, g, o), and predict the next character at every
# position. The loss is the mean cross-entropy over positions. tests/models trains it on the
# text of Python's own documentation (pydoc_data.topics), characters mapped to ASCII codes.
import std.nn

model lstm_lm(batch = 16, steps = 32, vocab = 128, embed = 64, hidden = 256) {
  input  ids: i32[batch, steps]                  # characters; caller guarantees 0 <= ids < vocab
  input  targets: i32[batch, steps]              # the next characters
  param  emb: f32[vocab, embed] = normal(0.0, 0.1)
  param  w: f32[embed + hidden, 4 * hidden] = glorot_uniform
  param  b: f32[4 * hidden] = zeros
  param  wo: f32[hidden, vocab] = glorot_uniform
  param  bo: f32[vocab] = zeros
  h[n in 0..batch, j in 0..hidden] = 0.0
  c[n in 0..batch, j in 0..hidden] = 0.0
  total[] = 0.0
  for t in 0..steps {
    x_t[n] = ids[n, t]
    y_t[n] = targets[n, t]
    h, c = lstm_cell(embedding(x_t, emb), h, c, w, b)
    total = total + softmax_cross_entropy(linear(h, wo, bo), y_t)
  }
  loss = total / steps
  minimize loss with sgd(lr = 1.0)
}
