# A BERT-style encoder (Devlin et al., 2018) at a small size: token + position embeddings and
# layer norm, then `layers` post-LN encoder layers (multi-head self-attention, residual, layer
# norm, GELU MLP, residual, layer norm), then BERT's pooler (tanh of a linear map of the first
# token) and a classifier. The layers' weights are stacked along a leading layer axis, so one
# op serves every layer (`l` picks the slice). BERT-base is hidden 768, 12 heads, ffn 3072,
# 12 layers.
import std.nn

# layer norm over the last axis of [B, S, D]
op layer_norm3<eps: float = 1e-12>(x: T[B, S, D], g: T[D], b: T[D]) -> T[B, S, D] {
  mu[n, s] = (sum(d) x[n, s, d]) / D
  xc[n, s, d] = x[n, s, d] - mu[n, s]
  var[n, s] = (sum(d) xc[n, s, d] * xc[n, s, d]) / D
  y[n, s, d] = xc[n, s, d] * rsqrt(var[n, s] + eps) * g[d] + b[d]
}

# x W[l] + b[l] on [B, S, D] with weights stacked over layers
op dense3<l: int>(x: T[B, S, K], w: T[L, K, M], b: T[L, M]) -> T[B, S, M] {
  y[n, s, m] = (sum(k) x[n, s, k] * w[l, k, m]) + b[l, m]
}

op encoder_layer<l: int, heads: int>(x: T[B, S, D], wq: T[L, D, D], bq: T[L, D], wk: T[L, D, D], bk: T[L, D], wv: T[L, D, D], bv: T[L, D], wo: T[L, D, D], bo: T[L, D], g1: T[L, D], b1: T[L, D], w1: T[L, D, F], c1: T[L, F], w2: T[L, F, D], c2: T[L, D], g2: T[L, D], b2: T[L, D]) -> T[B, S, D] {
  q = dense3<l = l>(x, wq, bq)
  k = dense3<l = l>(x, wk, bk)
  v = dense3<l = l>(x, wv, bv)
  # scores of head h, query s, key t; the head owns features h * (D / heads) ...
  score[n, h in 0..heads, s, t] = (sum(e in 0..D // heads) q[n, s, h * (D // heads) + e] * k[n, t, h * (D // heads) + e]) * rsqrt(1.0 * (D // heads))
  mx[n, h, s] = max(t) score[n, h, s, t]
  ex[n, h, s, t] = exp(score[n, h, s, t] - mx[n, h, s])
  prob[n, h, s, t] = ex[n, h, s, t] / (sum(u) ex[n, h, s, u])
  # each output feature e reads the probabilities of its own head e // (D / heads)
  ctx[n, s, e] = sum(t) prob[n, e // (D // heads), s, t] * v[n, t, e]
  ln1g[d] = g1[l, d]
  ln1b[d] = b1[l, d]
  a = layer_norm3(x + dense3<l = l>(ctx, wo, bo), ln1g, ln1b)
  f = dense3<l = l>(a, w1, c1)
  act[n, s, j] = 0.5 * f[n, s, j] * (1.0 + erf(f[n, s, j] * 0.7071067811865476))
  ln2g[d] = g2[l, d]
  ln2b[d] = b2[l, d]
  y = layer_norm3(a + dense3<l = l>(act, w2, c2), ln2g, ln2b)
}

model bert(batch = 8, seq = 32, vocab = 128, hidden = 64, heads = 4, ffn = 256, layers = 2, classes = 2) {
  input  ids: i32[batch, seq]                    # tokens; caller guarantees 0 <= ids < vocab
  input  y: i32[batch]
  param  tok: f32[vocab, hidden] = normal(0.0, 0.02)
  param  pos: f32[seq, hidden] = normal(0.0, 0.02)
  param  ln_g: f32[hidden] = ones
  param  ln_b: f32[hidden] = zeros
  param  wq: f32[layers, hidden, hidden] = normal(0.0, 0.02)
  param  bq: f32[layers, hidden] = zeros
  param  wk: f32[layers, hidden, hidden] = normal(0.0, 0.02)
  param  bk: f32[layers, hidden] = zeros
  param  wv: f32[layers, hidden, hidden] = normal(0.0, 0.02)
  param  bv: f32[layers, hidden] = zeros
  param  wo: f32[layers, hidden, hidden] = normal(0.0, 0.02)
  param  bo: f32[layers, hidden] = zeros
  param  g1: f32[layers, hidden] = ones
  param  b1: f32[layers, hidden] = zeros
  param  w1: f32[layers, hidden, ffn] = normal(0.0, 0.02)
  param  c1: f32[layers, ffn] = zeros
  param  w2: f32[layers, ffn, hidden] = normal(0.0, 0.02)
  param  c2: f32[layers, hidden] = zeros
  param  g2: f32[layers, hidden] = ones
  param  b2: f32[layers, hidden] = zeros
  param  wp: f32[hidden, hidden] = normal(0.0, 0.02)
  param  bp: f32[hidden] = zeros
  param  wc: f32[hidden, classes] = normal(0.0, 0.02)
  param  bc: f32[classes] = zeros
  e[n, s, d] = tok[ids[n, s], d] + pos[s, d]
  x = layer_norm3(e, ln_g, ln_b)
  for l in 0..layers {
    x = encoder_layer<l = l, heads = heads>(x, wq, bq, wk, bk, wv, bv, wo, bo, g1, b1, w1, c1, w2, c2, g2, b2)
  }
  cls[n, d] = x[n, 0, d]
  pooled = tanh(linear(cls, wp, bp))
  logits = linear(pooled, wc, bc)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1, momentum = 0.9)
}
