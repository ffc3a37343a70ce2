# std.nn: the nfc standard library of neural-network operators, written in .nf.
#
# Every op is a group of tensor comprehensions; nothing below is implemented in Python.
# `T` is a dtype variable, so each op serves f32 and f64 (and f16/bf16) alike; `Int` is an
# integer dtype variable, so labels and ids are i32 or i64 (PyTorch's). Shape variables
# (N, C, H, W, ...) are bound by unification at each call site; `...` stands for any number of
# leading dimensions (rank-polymorphic ops work on the last axis). Layouts: row-major, images
# NCHW, linear weights [in, out] (y = x @ w + b). docs/stdlib.md documents every op.

# ---------------------------------------------------------------------------------------------
# matrix products and broadcasting adds

# a @ b; a may have leading batch dimensions, which share the one matrix b (numpy's matmul
# of a [..., N, K] stack and a [K, M] matrix)
op matmul(a: T[..., N, K], b: T[K, M]) -> T[..., N, M] {
  y[..., n, m] = sum(k) a[..., n, k] * b[k, m]
}

# batched matrix product over any number of leading batch dimensions, the same in a and b
# (none: matmul)
op bmm(a: T[..., N, K], b: T[..., K, M]) -> T[..., N, M] {
  y[..., i, m] = sum(k) a[..., i, k] * b[..., k, m]
}

# x @ w + b over the last axis of x (any number of leading dimensions)
op linear(x: T[..., K], w: T[K, M], b: T[M]) -> T[..., M] {
  y[..., m] = (sum(k) x[..., k] * w[k, m]) + b[m]
}

op linear_nobias(x: T[..., K], w: T[K, M]) -> T[..., M] {
  y[..., m] = sum(k) x[..., k] * w[k, m]
}

# bias over the last (feature) axis
op bias_add(x: T[..., C], b: T[C]) -> T[..., C] {
  y[..., c] = x[..., c] + b[c]
}

# bias over the channel axis of NCHW (numpy broadcasting would align b with W instead)
op bias_add_nchw(x: T[N, C, H, W], b: T[C]) -> T[N, C, H, W] {
  y[n, c, h, w] = x[n, c, h, w] + b[c]
}

# ---------------------------------------------------------------------------------------------
# convolution and pooling (NCHW)

# Cross-correlation like torch.nn.functional.conv2d, weight [O, C / groups, KH, KW]. The types
# say that C = CG * groups and O = OG * groups, so indivisible channel counts are diagnosed.
# Output channel o belongs to group o // OG and reads that group's CG input channels.
# Zero padding is a guard: the load only happens where the padded position is inside x.
op conv2d<stride: int = 1, padding: int = 0, dilation: int = 1, groups: int = 1>(
    x: T[N, CG * groups, H, W], k: T[OG * groups, CG, KH, KW])
    -> T[N, OG * groups, (H + 2 * padding - dilation * (KH - 1) - 1) // stride + 1,
                         (W + 2 * padding - dilation * (KW - 1) - 1) // stride + 1] {
  y[n, o, i, j] = sum(c, r, s) (x[n, (o // OG) * CG + c,
                                  i * stride + r * dilation - padding,
                                  j * stride + s * dilation - padding]
                                if padding <= i * stride + r * dilation < H + padding
                                   and padding <= j * stride + s * dilation < W + padding
                                else 0.0) * k[o, c, r, s]
}

# Depthwise convolution: one KH x KW filter per channel (conv2d with groups = C),
# weight [C, 1, KH, KW].
op depthwise_conv2d<stride: int = 1, padding: int = 0, dilation: int = 1>(
    x: T[N, C, H, W], k: T[C, 1, KH, KW])
    -> T[N, C, (H + 2 * padding - dilation * (KH - 1) - 1) // stride + 1,
               (W + 2 * padding - dilation * (KW - 1) - 1) // stride + 1] {
  y[n, c, i, j] = sum(r, s) (x[n, c, i * stride + r * dilation - padding,
                               j * stride + s * dilation - padding]
                             if padding <= i * stride + r * dilation < H + padding
                                and padding <= j * stride + s * dilation < W + padding
                             else 0.0) * k[c, 0, r, s]
}

# Max pooling over size x size windows. Padded positions read as -inf, the identity of max in
# every float dtype, so they never win while every window holds a real element, i.e.
# padding < size (PyTorch requires padding <= size / 2).
op max_pool2d<size: int, stride: int, padding: int = 0>(x: T[N, C, H, W])
    -> T[N, C, (H + 2 * padding - size) // stride + 1, (W + 2 * padding - size) // stride + 1] {
  y[n, c, i, j] = max(r in 0..size, s in 0..size) (
      x[n, c, i * stride + r - padding, j * stride + s - padding]
      if padding <= i * stride + r < H + padding and padding <= j * stride + s < W + padding
      else -inf)
}

# Average pooling; padded zeros count in the divisor (count_include_pad = True, as in PyTorch).
op avg_pool2d<size: int, stride: int, padding: int = 0>(x: T[N, C, H, W])
    -> T[N, C, (H + 2 * padding - size) // stride + 1, (W + 2 * padding - size) // stride + 1] {
  y[n, c, i, j] = (sum(r in 0..size, s in 0..size) (
      x[n, c, i * stride + r - padding, j * stride + s - padding]
      if padding <= i * stride + r < H + padding and padding <= j * stride + s < W + padding
      else 0.0)) / (size * size)
}

op global_avg_pool(x: T[N, C, H, W]) -> T[N, C] {
  y[n, c] = (sum(h, w) x[n, c, h, w]) / (H * W)
}

# ---------------------------------------------------------------------------------------------
# activations: elementwise on any rank of at least 1 (`x: T[..., D]`); relu_4d is relu on
# NCHW, kept for existing models

op relu(x: T[..., D]) -> T[..., D] {
  y[..., d] = max(x[..., d], 0.0)
}

op relu_4d(x: T[N, C, H, W]) -> T[N, C, H, W] {
  y[n, c, h, w] = max(x[n, c, h, w], 0.0)
}

op leaky_relu<alpha: float = 0.01>(x: T[..., D]) -> T[..., D] {
  y[..., d] = x[..., d] if x[..., d] > 0.0 else alpha * x[..., d]
}

op elu<alpha: float = 1.0>(x: T[..., D]) -> T[..., D] {
  y[..., d] = x[..., d] if x[..., d] > 0.0 else alpha * (exp(x[..., d]) - 1.0)
}

# exact GELU: x * Phi(x) with the erf form of the normal CDF (0.7071... = 1/sqrt(2))
op gelu(x: T[..., D]) -> T[..., D] {
  y[..., d] = 0.5 * x[..., d] * (1.0 + erf(x[..., d] * 0.7071067811865476))
}

op sigmoid(x: T[..., D]) -> T[..., D] {
  y[..., d] = sigmoid(x[..., d])
}

op tanh(x: T[..., D]) -> T[..., D] {
  y[..., d] = tanh(x[..., d])
}

# softmax over the last axis, stabilised by subtracting the row max
op softmax(x: T[..., C]) -> T[..., C] {
  m[...] = max(c) x[..., c]
  e[..., c] = exp(x[..., c] - m[...])
  s[...] = sum(c) e[..., c]
  y[..., c] = e[..., c] / s[...]
}

# log(softmax(x)) over the last axis, computed as x - max - log(sum(exp(x - max))): never
# overflows
op log_softmax(x: T[..., C]) -> T[..., C] {
  m[...] = max(c) x[..., c]
  s[...] = sum(c) exp(x[..., c] - m[...])
  y[..., c] = x[..., c] - m[...] - log(s[...])
}

# ---------------------------------------------------------------------------------------------
# losses (scalars, mean over the batch)

# mean over every leading position of -log softmax(logits)[..., labels[...]]: logits [N, C]
# with labels [N], [B, S, C] with [B, S] (a sequence), [C] with one label; caller guarantees
# 0 <= labels < C (a label outside that range selects no class and contributes 0). The
# positions are flattened row-major (a rank-2 call is softmax_cross_entropy_2d itself).
op softmax_cross_entropy(logits: T[..., C], labels: Int[...]) -> T[] {
  loss = softmax_cross_entropy_2d(reshape<[-1, C]>(logits), reshape<[-1]>(labels))
}

# mean over n of -log softmax(logits)[n, labels[n]]
op softmax_cross_entropy_2d(logits: T[N, C], labels: Int[N]) -> T[] {
  lp = log_softmax(logits)
  loss[] = -(sum(n, c) (lp[n, c] if labels[n] == c else 0.0)) / N
}

# mean squared error over all elements, any rank (the shapes must be equal): flattened
# row-major, then mse_1d
op mse(a: T[...], b: T[...]) -> T[] {
  loss = mse_1d(reshape<[-1]>(a), reshape<[-1]>(b))
}

# mean squared error of two vectors
op mse_1d(a: T[K], b: T[K]) -> T[] {
  loss[] = (sum(k) (a[k] - b[k]) * (a[k] - b[k])) / K
}

# ---------------------------------------------------------------------------------------------
# normalisation and regularisation

# normalisation over the last axis with a learned scale g and shift b
op layer_norm<eps: float = 1e-5>(x: T[..., D], g: T[D], b: T[D]) -> T[..., D] {
  mu[...] = (sum(d) x[..., d]) / D
  xc[..., d] = x[..., d] - mu[...]
  var[...] = (sum(d) xc[..., d] * xc[..., d]) / D
  y[..., d] = xc[..., d] * rsqrt(var[...] + eps) * g[d] + b[d]
}

# Training-mode batch norm over N, H, W per channel. Returns the normalised y and the batch
# statistics (mean, biased variance) for the caller's running-average update.
op batch_norm_train<eps: float = 1e-5>(x: T[N, C, H, W], g: T[C], b: T[C])
    -> (y: T[N, C, H, W], mean: T[C], var: T[C]) {
  mean[c] = (sum(n, h, w) x[n, c, h, w]) / (N * H * W)
  xc[n, c, h, w] = x[n, c, h, w] - mean[c]
  var[c] = (sum(n, h, w) xc[n, c, h, w] * xc[n, c, h, w]) / (N * H * W)
  y[n, c, h, w] = xc[n, c, h, w] * rsqrt(var[c] + eps) * g[c] + b[c]
}

# Inference-mode batch norm with running statistics.
op batch_norm_eval<eps: float = 1e-5>(x: T[N, C, H, W], g: T[C], b: T[C], mean: T[C],
                                      var: T[C]) -> T[N, C, H, W] {
  y[n, c, h, w] = (x[n, c, h, w] - mean[c]) * rsqrt(var[c] + eps) * g[c] + b[c]
}

# batch norm of [N, C] features (BatchNorm1d)
op batch_norm1d_train<eps: float = 1e-5>(x: T[N, C], g: T[C], b: T[C])
    -> (y: T[N, C], mean: T[C], var: T[C]) {
  mean[c] = (sum(n) x[n, c]) / N
  xc[n, c] = x[n, c] - mean[c]
  var[c] = (sum(n) xc[n, c] * xc[n, c]) / N
  y[n, c] = xc[n, c] * rsqrt(var[c] + eps) * g[c] + b[c]
}

op batch_norm1d_eval<eps: float = 1e-5>(x: T[N, C], g: T[C], b: T[C], mean: T[C], var: T[C])
    -> T[N, C] {
  y[n, c] = (x[n, c] - mean[c]) * rsqrt(var[c] + eps) * g[c] + b[c]
}

# Inverted dropout: keep where u >= p (probability 1 - p) and scale by 1 / (1 - p), so the
# expectation is unchanged and inference is the identity. u is uniform [0, 1) (`random u`).
op dropout<p: float>(x: T[..., D], u: T[..., D]) -> T[..., D] {
  y[..., d] = x[..., d] * (1.0 / (1.0 - p)) if u[..., d] >= p else 0.0
}

# dropout on NCHW, kept for existing models (dropout takes any rank)
op dropout_4d<p: float>(x: T[N, C, H, W], u: T[N, C, H, W]) -> T[N, C, H, W] {
  y[n, c, h, w] = x[n, c, h, w] * (1.0 / (1.0 - p)) if u[n, c, h, w] >= p else 0.0
}

# ---------------------------------------------------------------------------------------------
# shape ops (the builtins reshape<[...]> and transpose<[...]> cover the general cases)

op transpose2d(x: T[N, M]) -> T[M, N] {
  y[j, i] = x[i, j]
}

# NCHW -> N x (C*H*W), row-major like torch.flatten(x, 1)
op flatten(x: T[N, C, H, W]) -> T[N, C * H * W] {
  y[n, k] = x[n, k // (H * W), (k // W) % H, k % W]
}

op concat2d_axis0(a: T[N, C], b: T[M, C]) -> T[N + M, C] {
  y[i, j] = a[i, j] if i < N else b[i - N, j]
}

op concat2d_axis1(a: T[N, C], b: T[N, D]) -> T[N, C + D] {
  y[i, j] = a[i, j] if j < C else b[i, j - C]
}

op concat4d_axis0(a: T[N, C, H, W], b: T[M, C, H, W]) -> T[N + M, C, H, W] {
  y[n, c, h, w] = a[n, c, h, w] if n < N else b[n - N, c, h, w]
}

op concat4d_axis1(a: T[N, C, H, W], b: T[N, D, H, W]) -> T[N, C + D, H, W] {
  y[n, c, h, w] = a[n, c, h, w] if c < C else b[n, c - C, h, w]
}

op concat4d_axis2(a: T[N, C, H, W], b: T[N, C, G, W]) -> T[N, C, H + G, W] {
  y[n, c, h, w] = a[n, c, h, w] if h < H else b[n, c, h - H, w]
}

op concat4d_axis3(a: T[N, C, H, W], b: T[N, C, H, V]) -> T[N, C, H, W + V] {
  y[n, c, h, w] = a[n, c, h, w] if w < W else b[n, c, h, w - W]
}

# x[start : start + size] along one axis; a slice past the end is a bounds error at the call
op slice2d_axis0<start: int, size: int>(x: T[N, C]) -> T[size, C] {
  y[i, j] = x[start + i, j]
}

op slice2d_axis1<start: int, size: int>(x: T[N, C]) -> T[N, size] {
  y[i, j] = x[i, start + j]
}

op slice4d_axis0<start: int, size: int>(x: T[N, C, H, W]) -> T[size, C, H, W] {
  y[n, c, h, w] = x[start + n, c, h, w]
}

op slice4d_axis1<start: int, size: int>(x: T[N, C, H, W]) -> T[N, size, H, W] {
  y[n, c, h, w] = x[n, start + c, h, w]
}

op slice4d_axis2<start: int, size: int>(x: T[N, C, H, W]) -> T[N, C, size, W] {
  y[n, c, h, w] = x[n, c, start + h, w]
}

op slice4d_axis3<start: int, size: int>(x: T[N, C, H, W]) -> T[N, C, H, size] {
  y[n, c, h, w] = x[n, c, h, start + w]
}

# zero padding of p on each side of H and W
op pad2d<p: int>(x: T[N, C, H, W]) -> T[N, C, H + 2 * p, W + 2 * p] {
  y[n, c, h, w] = x[n, c, h - p, w - p] if p <= h < H + p and p <= w < W + p else 0.0
}

# Sub-pixel upsampling in CRD order (ONNX DepthToSpace mode "CRD", which is
# torch.nn.functional.pixel_shuffle): channel c * r * r + (h % r) * r + (w % r) of x lands at
# (c, h, w). Kept under this name for existing models; depth2space_crd is the same op.
op depth2space<r: int>(x: T[N, C * r * r, H, W]) -> T[N, C, H * r, W * r] {
  y[n, c, h, w] = x[n, c * r * r + (h % r) * r + w % r, h // r, w // r]
}

op depth2space_crd<r: int>(x: T[N, C * r * r, H, W]) -> T[N, C, H * r, W * r] {
  y[n, c, h, w] = x[n, c * r * r + (h % r) * r + w % r, h // r, w // r]
}

# DCR order (ONNX DepthToSpace's default mode "DCR", TensorFlow's depth_to_space): the
# channels are [r, r, C], so channel ((h % r) * r + w % r) * C + c lands at (c, h, w).
op depth2space_dcr<r: int>(x: T[N, C * r * r, H, W]) -> T[N, C, H * r, W * r] {
  y[n, c, h, w] = x[n, ((h % r) * r + w % r) * C + c, h // r, w // r]
}

# Inverse of depth2space in CRD order (torch pixel_unshuffle; ONNX SpaceToDepth is the
# inverse of DCR instead).
op space2depth<r: int>(x: T[N, C, H * r, W * r]) -> T[N, C * r * r, H, W] {
  y[n, c, h, w] = x[n, c // (r * r), h * r + (c % (r * r)) // r, w * r + c % r]
}

# ShuffleNet channel shuffle: view the channels as [groups, G], transpose, flatten. Output
# channel c = i * groups + j reads input channel j * G + i.
op channel_shuffle<groups: int>(x: T[N, G * groups, H, W]) -> T[N, G * groups, H, W] {
  y[n, c, h, w] = x[n, (c % groups) * G + c // groups, h, w]
}

# Row lookup E[ids[...]] for ids of any rank; caller guarantees 0 <= ids < V.
op embedding(ids: Int[...], E: T[V, D]) -> T[..., D] {
  y[..., d] = E[ids[...], d]
}

# ---------------------------------------------------------------------------------------------
# capsules (NeoFlow's capsule convolution; Sabour et al.'s squash and margin loss)

# Capsule convolution over P x P pose matrices: each output pose is the sum over input capsule
# types c and window offsets (r, s) of the matrix product A-pose @ K-pose.
op capsule_conv<stride: int = 2>(A: T[B, C, H, W, P, P], K: T[O, C, KH, KW, P, P])
    -> T[B, O, (H - KH) // stride + 1, (W - KW) // stride + 1, P, P] {
  y[b, o, p, q, i, j] = sum(c, r, s, t) A[b, c, p * stride + r, q * stride + s, i, t]
                                        * K[o, c, r, s, t, j]
}

# squash(v) = |v|^2 / (1 + |v|^2) * v / |v| over the last axis (the capsule vector);
# eps keeps the gradient finite at v = 0
op squash<eps: float = 1e-7>(x: T[..., D]) -> T[..., D] {
  n2[...] = sum(d) x[..., d] * x[..., d]
  y[..., d] = x[..., d] * (n2[...] / (1.0 + n2[...])) * rsqrt(n2[...] + eps)
}

# length of each capsule vector (the last axis): sqrt(sum(v^2) + eps)
op capsule_length<eps: float = 1e-7>(x: T[..., D]) -> T[...] {
  y[...] = sqrt((sum(d) x[..., d] * x[..., d]) + eps)
}

# Margin loss over capsule lengths, mean over every leading position (as
# softmax_cross_entropy: lengths [N, K] with labels [N], [B, S, K] with [B, S], ...):
#   T_k max(0, m_pos - |v_k|)^2 + lam (1 - T_k) max(0, |v_k| - m_neg)^2, T_k = (labels[n] == k)
op margin_loss<m_pos: float = 0.9, m_neg: float = 0.1, lam: float = 0.5>(
    lengths: T[..., K], labels: Int[...]) -> T[] {
  loss = margin_loss_2d<m_pos = m_pos, m_neg = m_neg, lam = lam>(reshape<[-1, K]>(lengths),
                                                               reshape<[-1]>(labels))
}

op margin_loss_2d<m_pos: float = 0.9, m_neg: float = 0.1, lam: float = 0.5>(
    lengths: T[N, K], labels: Int[N]) -> T[] {
  hi[n, k] = max(m_pos - lengths[n, k], 0.0)
  lo[n, k] = max(lengths[n, k] - m_neg, 0.0)
  loss[] = (sum(n, k) (hi[n, k] * hi[n, k] if labels[n] == k
                       else lam * lo[n, k] * lo[n, k])) / N
}

# ---------------------------------------------------------------------------------------------
# recurrent cells

# LSTM cell; w = [W_x; W_h] stacked on the input axis, gates in the order i, f, g, o (PyTorch).
# [x, h] is concatenated by a conditional expression (concat2d_axis1).
op lstm_cell(x: T[N, I], h: T[N, H], c: T[N, H], w: T[I + H, 4 * H], b: T[4 * H])
    -> (h_out: T[N, H], c_out: T[N, H]) {
  xh = concat2d_axis1(x, h)
  z = linear(xh, w, b)
  c_out[n, j] = sigmoid(z[n, H + j]) * c[n, j]               # forget gate * old cell
                + sigmoid(z[n, j]) * tanh(z[n, 2 * H + j])    # + input gate * candidate
  h_out[n, j] = sigmoid(z[n, 3 * H + j]) * tanh(c_out[n, j])
}
