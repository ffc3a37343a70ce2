# The capsule layer of examples/torch_capsule/train.py, written once here and called from
# PyTorch through nfc.torch.load_op: a capsule convolution (NeoFlow's novel op; each output
# pose is a sum of 4x4 matrix products over input capsule types and a KH x KW window) followed
# by squash over each output pose read as a 16-vector. nfc derives the backward of the pair.
import std.nn

op capsule_layer<stride: int = 2, eps: float = 1e-7>(A: T[B, C, H, W, P, P],
                                                     K: T[O, C, KH, KW, P, P])
    -> T[B, O, (H - KH) // stride + 1, (W - KW) // stride + 1, P, P] {
  u = capsule_conv<stride = stride>(A, K)
  n2[b, o, p, q] = sum(i, j) u[b, o, p, q, i, j] * u[b, o, p, q, i, j]
  v[b, o, p, q, i, j] = u[b, o, p, q, i, j] * (n2[b, o, p, q] / (1.0 + n2[b, o, p, q]))
                        * rsqrt(n2[b, o, p, q] + eps)
}
