# RUN: nfc opt %s --split-input-file --verify-diagnostics
# Frontend diagnostics checked with `#` directives, one case per chunk.
import std.nn

model tiny(batch = 2) {
  input  x: f32[batch, 4]
  param  w: f32[5, 3] = zeros
  param  b: f32[3] = zeros
  # expected-error@+1 {{shape mismatch for argument 2 of 'linear'}}
  y = relu(linear(x, w, b))
  output y
}

# -----

model tiny(batch = 2) {
  input  x: f32[batch, 4]
  y = nosuchop(x)  # expected-error {{nosuchop}}
  output y
}
