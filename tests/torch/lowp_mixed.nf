# A mixed-precision contraction for tests/torch/test_lowp_ops.py: 16-bit operands (T is f16 or
# bf16 there), products and sums in f32, an f32 result (what the precision pass makes of a
# matmul).
op matmul_f32(a: T[N, K], b: T[K, M]) -> f32[N, M] {
  y[n, m] = sum(k) f32(a[n, k]) * f32(b[k, m])
}

# The same with the format spelled out: only bf16 operands fit.
op matmul_bf16_f32(a: bf16[N, K], b: bf16[K, M]) -> f32[N, M] {
  y[n, m] = sum(k) f32(a[n, k]) * f32(b[k, m])
}
