"""Mutation fuzzing of the frontend: any input either compiles or raises CompileError whose
diagnostics are located inside a known file and render; never another exception."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nfc.diagnostics import SOURCES, CompileError, Diagnostic, render
from nfc.frontend import compile_source

ROOT = Path(__file__).resolve().parents[2]

SNIPPETS = [
    """
op pad2d<p: int>(x: T[N, C, H, W]) -> T[N, C, H + 2*p, W + 2*p] {
  y[n, c, h, w] = x[n, c, h - p, w - p] if p <= h < H + p and p <= w < W + p else 0.0
}
op bn(x: T[N, C], g: T[C], b: T[C]) -> (y: T[N, C], mean: T[C], var: T[C]) {
  mean[c] = (sum(n) x[n, c]) / N
  var[c]  = (sum(n) (x[n, c] - mean[c]) * (x[n, c] - mean[c])) / N
  y[n, c] = (x[n, c] - mean[c]) * rsqrt(var[c] + 1e-5) * g[c] + b[c]
}
model m(batch = 4, hidden = 6) {
  input x: f32[batch, 1, 3, 3]
  param g: f32[hidden] = ones
  state rm: f32[hidden] = zeros
  random u: f32[batch, hidden]
  xp = pad2d<p = 1>(x)
  f = reshape<[batch, 25]>(xp)
  t[n, j in 0..6] = f[n, j] * u[n, j] + (max(k) f[n, k])
  y, mean, var = bn(t, g, g)
  if training { update rm = 0.9 * rm + 0.1 * mean } else { z = 1 }
  for i in 0..3 { y = tanh(y) * 0.5 }
  loss = (sum(n, j) y[n, j]) / batch
  output y
  minimize loss with adam(lr = 0.001)
}
""",
    """
import std.nn
model e(batch = 3, v = 7, d = 4) {
  input ids: i32[batch]
  param emb: f32[v, d] = normal(0.0, 1.0)
  param w: f32[d, v] = uniform(-0.1, 0.1)
  h[n, j] = emb[ids[n], j]
  tt = transpose<[1, 0]>(h)
  s[j] = sum(n) tt[j, n] if j < d else 0.0
  logits = linear_nobias(h, w)
  loss = softmax_cross_entropy(logits, ids)
  output s
  minimize loss with sgd(lr = 0.1)
}
""",
    """
import std.nn
op norm(x: T[..., D], g: T[D]) -> T[..., D] {
  mu[...] = (sum(d) x[..., d]) / D
  y[..., d] = (x[..., d] - mu[...]) * g[d]
}
op cat(x: T[N, I], h: T[N, H]) -> T[N, I + H] {
  xh[n, k] = x[n, k] if k < I else h[n, k - I]
  y[n, k] = xh[n, k]
}
model p(batch = 2, seq = 3, d = 4) {
  input x: f32[batch, seq, d]
  param g: f32[d] = ones
  h = zeros<[batch, d]>
  c = full<[batch, d], 0.5>
  for t in 0..2 { h = tanh(h + c) }
  a = norm(x, g)
  b = layer_norm(softmax(a), g, zeros_like(g))
  z = cat(h, norm(h, g))
  loss = (sum(n, s, e) b[n, s, e]) + (sum(n, k) z[n, k])
  minimize loss with sgd(lr = 0.1)
}
""",
    # ops nothing calls: checked at sample sizes (nfc.frontend.uncalled)
    """
op gather(E: T[V, D], ids: I[N]) -> T[N, D] {
  y[n, d] = E[ids[n], d]
}
op shift<k: int>(x: T[..., W]) -> T[..., W] {
  y[..., w] = x[..., w - k] if w >= k else 0.0
}
op acc<steps: int = 3>(x: T[N, C], w: T[C, C]) -> (h: T[N, C], s: T[C]) {
  h = x
  for t in 0..steps { h = tanh(h + x) * 0.5 }
  s[c] = (sum(n) h[n, c] + w[c, c] + x[n, (c + 1) % C]) / N
}
model u(batch = 2) {
  input x: f32[batch, 3]
  y = x + x + x + x - x * x * x
  output y
}
""",
]

SOURCES_FOR_FUZZ = [p.read_text() for p in sorted((ROOT / "examples").glob("*.nf"))]
# the standard library op by op: small units keep each case fast (a parse is ~5 us per byte)
_STD = (ROOT / "nfc" / "std" / "nn.nf").read_text()
SOURCES_FOR_FUZZ += ["import std.nn\nop " + p for p in re.split(r"(?m)^op ", _STD)[1:]]
SOURCES_FOR_FUZZ += SNIPPETS

_TOKEN = re.compile(r"\s+|#[^\n]*|[A-Za-z_]\w*|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|\.\.\.|\.\.|->|//|"
                    r"<=|>=|==|!=|.", re.S)
TOKENS = [_TOKEN.findall(s) for s in SOURCES_FOR_FUZZ]
VOCAB = sorted({t for ts in TOKENS for t in ts if not t.isspace()} | {
    "sum", "max", "(", ")", "[", "]", "{", "}", "-", "<", ">", "..", "\n", "if", "else", "for",
    "1e400", "9" * 40, "99999999", "\x00", "é", "\t", "import", "std.nn", "model", "op", "<[",
    "...", "[...]", "zeros", "full", "zeros_like",
})


@st.composite
def mutants(draw: st.DrawFn) -> str:
    toks = list(TOKENS[draw(st.integers(0, len(TOKENS) - 1))])
    for _ in range(draw(st.integers(1, 4))):
        if not toks:
            toks = [""]
        kind = draw(st.sampled_from(["delete", "insert", "swap", "duplicate", "bytes"]))
        i = draw(st.integers(0, len(toks) - 1))
        if kind == "delete":
            del toks[i:i + draw(st.integers(1, 3))]
        elif kind == "insert":
            toks.insert(i, draw(st.sampled_from(VOCAB)))
        elif kind == "swap":
            j = draw(st.integers(0, len(toks) - 1))
            toks[i], toks[j] = toks[j], toks[i]
        elif kind == "duplicate":
            j = draw(st.integers(i, min(len(toks), i + 12)))
            toks[i:i] = toks[i:j]
        else:
            toks.insert(i, draw(st.binary(min_size=1, max_size=6)).decode("latin-1"))
    return "".join(toks)


def _check(d: Diagnostic) -> None:
    assert d.loc is not None, d
    text = SOURCES.files.get(d.loc.file)
    assert text is not None, d
    lines = text.split("\n")
    assert 1 <= d.loc.line <= len(lines), d
    assert 1 <= d.loc.col <= len(lines[d.loc.line - 1]) + 1, d
    for n in d.notes:
        if n.loc is not None:
            _check(n)
    assert render(d).startswith(str(d.loc))


@settings(max_examples=2000, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutants())
def test_mutants_compile_or_diagnose(text: str) -> None:
    try:
        compile_source(text, "fuzz.nf")
    except CompileError as err:
        assert err.diagnostics
        for d in err.diagnostics:
            _check(d)


def test_unmutated_sources_compile() -> None:
    for text in SOURCES_FOR_FUZZ:
        compile_source(text, "fuzz.nf")
