"""Random `.nf` models for the backend fuzzer (backend_fuzz.py): `ProgramGen` writes mostly
valid programs (elementwise expressions over the intrinsics, sum/max/min/prod reductions,
broadcasting, `//` and `%` index arithmetic, padded and strided window accesses, contractions,
reshapes, transposes, gathers through an integer input, standard-library ops, random and state
declarations), `mutate` applies the frontend fuzzer's token mutations, and `make_program(seed,
index)` picks one deterministically."""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Tensor:
    """A float tensor of the program: its shape and a bound on its magnitude."""

    name: str
    shape: tuple[int, ...]
    mag: float


@dataclass
class Space:
    """Index variables of a comprehension: name -> extent."""

    dims: dict[str, int]
    conds: list[str] = field(default_factory=list)


class ProgramGen:
    """A random, mostly valid `.nf` model (see the module docstring)."""

    MAX_MAG = 1e4
    MAX_POINTS = 1 << 20
    """Most iterations (output points times reduction points) of one comprehension."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.decls: list[str] = []
        self.lines: list[str] = []
        self.tensors: list[Tensor] = []
        self.used: set[str] = set()
        self.n = 0
        self.ids: tuple[str, int, int] | None = None  # (name, batch, vocabulary)

    # -- helpers ---------------------------------------------------------------------------
    def fresh(self, prefix: str = "t") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def shape(self, rank: int | None = None) -> tuple[int, ...]:
        r = self.rng
        rank = rank if rank is not None else r.choice([1, 2, 2, 2, 3, 3, 4])
        return tuple(r.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17]) if rank <= 2
                     else r.choice([1, 2, 3, 4, 5, 6]) for _ in range(rank))

    def add_input(self, shape: tuple[int, ...]) -> Tensor:
        t = Tensor(self.fresh("x"), shape, 5.0)
        self.decls.append(f"  input {t.name}: f32[{', '.join(map(str, shape))}]")
        self.tensors.append(t)
        return t

    def add_param(self, shape: tuple[int, ...]) -> Tensor:
        t = Tensor(self.fresh("w"), shape, 5.0)
        self.decls.append(f"  param {t.name}: f32[{', '.join(map(str, shape))}] = "
                          f"normal(0.0, 1.0)")
        self.tensors.append(t)
        return t

    def add_random(self, shape: tuple[int, ...]) -> Tensor:
        """`random u: f32[...]`: uniform in [0, 1) from the in-graph generator."""
        t = Tensor(self.fresh("u"), shape, 1.0)
        self.decls.append(f"  random {t.name}: f32[{', '.join(map(str, shape))}]")
        self.tensors.append(t)
        return t

    def pick(self) -> Tensor:
        # prefer recent tensors, so that the program is deep rather than wide
        k = len(self.tensors)
        i = min(k - 1, int(k * (1 - self.rng.random() ** 2)))
        return self.tensors[i]

    def define(self, line: str, name: str, shape: tuple[int, ...], mag: float) -> Tensor:
        t = Tensor(name, shape, mag)
        self.lines.append("  " + line)
        self.tensors.append(t)
        return t

    def use(self, t: Tensor) -> Tensor:
        self.used.add(t.name)
        return t

    # -- index expressions -----------------------------------------------------------------
    def subscript(self, size: int, space: Space, red: dict[str, int]) -> tuple[str, str] | None:
        """An index expression that stays in 0..size for every point of the space (and the
        reduction indices `red`), and an optional guard; None when nothing fits."""
        r = self.rng
        cands: list[tuple[str, str]] = []
        for v, d in list(space.dims.items()) + list(red.items()):
            if d == size:
                cands += [(v, "")] * 4
            if d < size:
                cands.append((v, ""))
                cands.append((f"{v} + {r.randint(1, size - d)}", ""))
                cands.append((f"{d - 1} - {v}", ""))
            if d > 1 and size > 1:
                cands.append((f"({v} + {r.randint(1, size)}) % {size}", ""))
                cands.append((f"(2 * {v} + 1) % {size}", ""))
            for c in (2, 3, 4):
                if (d - 1) // c < size and d > 1:
                    cands.append((f"{v} // {c}", ""))
                if c <= size and d > c:
                    cands.append((f"{v} % {c}", ""))
            p = (d - size) // 2
            if d > size and p > 0:  # padding: reads guarded by the window
                cands.append((f"{v} - {p}", f"{p} <= {v} < {size + p}"))
            if d > size:  # a window that reads past the end, guarded
                cands.append((v, f"{v} < {size}"))
        # strided windows: stride * i + k with a reduction index k
        for v, d in space.dims.items():
            for k, kd in red.items():
                for s in (1, 2, 3):
                    if s * (d - 1) + kd - 1 < size and d > 1:
                        cands += [(f"{s} * {v} + {k}" if s > 1 else f"{v} + {k}", "")] * 2
                    elif s * (d - 1) + kd - 1 < size + 2 and d > 1:
                        e = f"{s} * {v} + {k} - 1"
                        cands.append((e, f"0 <= {e} < {size}"))
        if size <= 4 or not cands:
            cands.append((str(r.randrange(size)), ""))
        return r.choice(cands) if cands else None

    def load(self, space: Space, red: dict[str, int]) -> tuple[str, float]:
        """A (possibly guarded) load of a random tensor, or an index-valued float."""
        r = self.rng
        if r.random() < 0.05:
            v = r.choice(list(space.dims) + list(red))
            return f"f32({v}) * 0.25", 0.25 * max(list(space.dims.values()) + list(red.values()))
        if self.ids is not None and r.random() < 0.1:
            return self.gather(space, red)
        for _ in range(6):
            t = self.pick()
            subs = [self.subscript(s, space, red) for s in t.shape]
            if all(s is not None for s in subs):
                self.use(t)
                idx = ", ".join(s[0] for s in subs)  # type: ignore[index]
                guards = [s[1] for s in subs if s and s[1]]  # type: ignore[index]
                text = f"{t.name}[{idx}]"
                if guards:
                    text = f"({text} if {' and '.join(guards)} else 0.0)"
                return text, t.mag
        return f"{r.choice([0.5, 1.5, -2.0, 3.0])}", 3.0

    def gather(self, space: Space, red: dict[str, int]) -> tuple[str, float]:
        """emb[ids[n], j]: a data-dependent row of an embedding table."""
        assert self.ids is not None
        name, batch, vocab = self.ids
        n = self.subscript(batch, space, red)
        width = self.rng.choice([1, 2, 3, 4])
        j = self.subscript(width, space, red)
        if n is None or j is None or n[1] or j[1]:
            return "1.0", 1.0
        emb = self.add_param((vocab, width))
        self.use(emb)
        return f"{emb.name}[{name}[{n[0]}], {j[0]}]", emb.mag

    # -- element expressions ---------------------------------------------------------------
    def expr(self, space: Space, red: dict[str, int], depth: int) -> tuple[str, float]:
        r = self.rng
        if depth <= 0 or r.random() < 0.25:
            return self.load(space, red)
        kind = r.choices(["bin", "un", "minmax", "select", "const", "nested"],
                         [6, 4, 1, 1, 1, 1 if not red else 0])[0]
        a, ma = self.expr(space, red, depth - 1)
        if kind == "bin":
            b, mb = self.expr(space, red, depth - 1)
            op = r.choice(["+", "-", "*", "*", "/"])
            if op == "/":
                den = r.choice([f"(abs({b}) + 0.5)", f"(1.0 + {b} * {b})"])
                return f"({a} / {den})", ma * 2.0
            if op == "*" and ma * mb > self.MAX_MAG:
                return f"({a} + tanh({b}))", ma + 1.0
            return f"({a} {op} {b})", (ma * mb if op == "*" else ma + mb)
        if kind == "un":
            fn = r.choice(["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "abs",
                           "neg", "pow", "square"])
            if fn == "exp":
                return (f"exp({a})", math.exp(ma)) if ma < 8 else (f"exp(tanh({a}))", math.e)
            if fn == "log":
                return f"log(abs({a}) + 0.5)", max(1.0, math.log(ma + 0.5))
            if fn == "sqrt":
                return f"sqrt({a} * {a} + 0.25)", ma + 0.5
            if fn == "rsqrt":
                return f"rsqrt(abs({a}) + 0.5)", 1.5
            if fn == "abs":
                return f"abs({a})", ma
            if fn == "neg":
                return f"(-{a})", ma
            if fn == "pow":
                c = r.choice([2.0, 3.0, 0.5, -1.0, 1.5])
                if c > 0 and (min(ma, 1e6) + 0.5) ** c > self.MAX_MAG:
                    return f"tanh({a})", 1.0
                return f"pow(abs({a}) + 0.5, {c})", max((ma + 0.5) ** c, 2.0)
            if fn == "square":
                return (f"pow({a}, 2.0)", ma * ma) if ma * ma < self.MAX_MAG else \
                    (f"tanh({a})", 1.0)
            return f"{fn}({a})", 1.0
        if kind == "minmax":
            b, mb = self.expr(space, red, depth - 1)
            return f"{r.choice(['max', 'min'])}({a}, {b})", max(ma, mb)
        if kind == "select":
            b, mb = self.expr(space, red, depth - 1)
            dims = list(space.dims.items())
            v, d = r.choice(dims) if dims else ("", 1)
            if d > 1 and r.random() < 0.6:
                cond = f"{v} < {r.randint(1, d - 1)}"
            else:
                c, _ = self.expr(space, red, 0)
                cond = f"{c} > {r.choice(['0.0', '0.5', '-1.0'])}"
            return f"({a} if {cond} else {b})", max(ma, mb)
        if kind == "nested":
            kd = r.choice([2, 3, 4, 5])
            k = self.fresh("k")
            inner, mi = self.expr(space, {k: kd}, depth - 1)
            fn = r.choice(["sum", "sum", "max", "min"])
            return f"({a} * ({fn}({k} in 0..{kd}) {inner}))", ma * mi * kd
        c = r.choice([0.5, 2.0, -1.5, 0.1, 3.0])
        return f"({a} * {c})", ma * abs(c)

    def tame(self, text: str, mag: float) -> tuple[str, float]:
        """Keep magnitudes in a range where float32 neither overflows nor loses everything."""
        if mag > self.MAX_MAG:
            if self.rng.random() < 0.5:
                return f"tanh({text})", 1.0
            scale = 10.0 ** -math.ceil(math.log10(mag / 10.0))
            return f"({text}) * {scale:g}", mag * scale
        return text, mag

    # -- statements ------------------------------------------------------------------------
    def comprehension(self) -> None:
        r = self.rng
        base = self.pick().shape if r.random() < 0.7 else self.shape()
        shape = tuple(max(1, d + r.choice([0, 0, 0, 2, -1])) for d in base)
        space = Space({f"i{j}": d for j, d in enumerate(shape)})
        name = self.fresh()
        lhs = f"{name}[{', '.join(f'{v} in 0..{d}' for v, d in space.dims.items())}]"
        if r.random() < 0.45:
            nred = r.choice([1, 1, 2])
            red: dict[str, int] = {}
            for _ in range(nred):
                # a reduction extent that matches some tensor dimension, so contractions occur;
                # at most MAX_POINTS iterations, or the interpreter (the oracle) takes minutes
                # on the gradients (a 5120 x 5120 x 2 min-reduction took over 400 s)
                t = self.pick()
                room = self.MAX_POINTS // (math.prod(shape) * math.prod(red.values()))
                sizes = [d for d in list(t.shape) + [2, 3] if d <= room]
                red[self.fresh("k")] = r.choice(sizes or [1])
            fn = r.choices(["sum", "max", "min", "prod"], [8, 2, 2, 1])[0]
            body, mb = self.expr(space, red, r.randint(1, 2))
            if fn == "prod":
                body, mb = f"(1.0 + 0.1 * tanh({body}))", 1.1
            ranges = ", ".join(f"{k} in 0..{d}" for k, d in red.items())
            size = math.prod(red.values())
            growth = size if fn == "sum" else 1.1 ** min(size, 200) if fn == "prod" else 1
            text, mag = self.tame(f"{fn}({ranges}) ({body})", mb * growth)
        else:
            text, mag = self.tame(*self.expr(space, {}, r.randint(1, 3)))
        self.define(f"{lhs} = {text}", name, shape, mag)

    def tensor_level(self) -> None:
        r = self.rng
        a = self.pick()
        kind = r.choice(["bcast", "unary", "reshape", "transpose", "std", "std"])
        name = self.fresh()
        if kind == "bcast":
            # a tensor whose shape is a suffix of a's (or 1s there): numpy broadcasting
            cands = [t for t in self.tensors if len(t.shape) <= len(a.shape) and all(
                x in (1, y) for x, y in zip(reversed(t.shape), reversed(a.shape), strict=False))]
            b = r.choice(cands)
            op = r.choice(["+", "-", "*"])
            mag = a.mag * b.mag if op == "*" else a.mag + b.mag
            text, mag = self.tame(f"{self.use(a).name} {op} {self.use(b).name}", mag)
            self.define(f"{name} = {text}", name, a.shape, mag)
        elif kind == "unary":
            fn = r.choice(["tanh", "sigmoid", "relu", "abs"])
            mag = a.mag if fn in ("relu", "abs") else 1.0
            self.define(f"{name} = {fn}({self.use(a).name}) * 0.5", name, a.shape, mag * 0.5)
        elif kind == "reshape":
            size = math.prod(a.shape)
            dims = [f for f in range(1, size + 1) if size % f == 0]
            d0 = r.choice(dims)
            shape = (d0, size // d0) if r.random() < 0.7 else (size,)
            self.define(f"{name} = reshape<[{', '.join(map(str, shape))}]>({self.use(a).name})",
                        name, shape, a.mag)
        elif kind == "transpose" and len(a.shape) > 1:
            perm = list(range(len(a.shape)))
            r.shuffle(perm)
            shape = tuple(a.shape[p] for p in perm)
            self.define(f"{name} = transpose<[{', '.join(map(str, perm))}]>({self.use(a).name})",
                        name, shape, a.mag)
        else:
            self.std_op(a, name)

    def std_op(self, a: Tensor, name: str) -> None:
        r = self.rng
        d = a.shape[-1]
        choice = r.choice(["softmax", "layer_norm", "linear", "conv", "pool", "gelu"])
        if choice == "conv" and len(a.shape) == 4 and min(a.shape[2:]) >= 2:
            n, c, h, w = a.shape
            k = r.choice([1, 2, 3])
            stride, pad = r.choice([1, 2]), r.choice([0, 1])
            if h + 2 * pad < k or w + 2 * pad < k:
                k = 1
            kern = self.add_param((r.choice([1, 2, 3]), c, k, k))
            self.use(kern)
            o = kern.shape[0]
            shape = (n, o, (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1)
            text, mag = self.tame(f"conv2d<stride = {stride}, padding = {pad}>("
                                  f"{self.use(a).name}, {kern.name})", a.mag * 5 * c * k * k)
            self.define(f"{name} = {text}", name, shape, mag)
        elif choice == "pool" and len(a.shape) == 4 and min(a.shape[2:]) >= 2:
            n, c, h, w = a.shape
            fn = r.choice(["max_pool2d", "avg_pool2d"])
            shape = (n, c, (h - 2) // 2 + 1, (w - 2) // 2 + 1)
            self.define(f"{name} = {fn}<size = 2, stride = 2>({self.use(a).name})",
                        name, shape, a.mag)
        elif choice == "layer_norm":
            g, b = self.add_param((d,)), self.add_param((d,))
            self.use(g)
            self.use(b)
            self.define(f"{name} = layer_norm({self.use(a).name}, {g.name}, {b.name})",
                        name, a.shape, 5.0 * math.sqrt(d) + 5.0)
        elif choice == "linear":
            m = r.choice([1, 2, 3, 5, 8, 16, 33, 64])
            w, b = self.add_param((d, m)), self.add_param((m,))
            self.use(w)
            self.use(b)
            text, mag = self.tame(f"linear({self.use(a).name}, {w.name}, {b.name})",
                                  a.mag * 5.0 * d + 5.0)
            self.define(f"{name} = {text}", name, a.shape[:-1] + (m,), mag)
        elif choice == "gelu":
            self.define(f"{name} = gelu({self.use(a).name})", name, a.shape, a.mag)
        else:
            self.define(f"{name} = softmax({self.use(a).name})", name, a.shape, 1.0)

    def program(self) -> str:
        r = self.rng
        for _ in range(r.randint(1, 3)):
            self.add_input(self.shape())
        if r.random() < 0.3:
            self.add_input(self.shape(4))
        if r.random() < 0.15:
            batch, vocab = r.randint(1, 6), r.randint(2, 9)
            self.ids = (self.fresh("ids"), batch, vocab)
            self.decls.append(f"  input {self.ids[0]}: i32[{batch}]")
        for _ in range(r.randint(1, 2)):  # a model needs a trainable parameter
            self.add_param(self.shape())
        if r.random() < 0.15:  # a GEMM big enough for the parallel micro-kernel path
            m, k = r.choice([24, 48, 64, 96]), r.choice([16, 32, 64])
            x, w = self.add_input((m, k)), self.add_param((k, r.choice([16, 32, 64, 80])))
            name, kk = self.fresh(), self.fresh("k")
            self.use(x)
            self.use(w)
            self.define(f"{name}[i0 in 0..{m}, i1 in 0..{w.shape[1]}] = (sum({kk} in 0..{k}) "
                        f"{x.name}[i0, {kk}] * {w.name}[{kk}, i1]) * {1 / k:.3g}",
                        name, (m, w.shape[1]), 25.0)
        if r.random() < 0.15:
            self.add_random(self.shape())
        for _ in range(r.randint(1, 7)):
            if r.random() < 0.6:
                self.comprehension()
            else:
                self.tensor_level()
        sinks = [t for t in self.tensors if t.name not in self.used and not
                 t.name.startswith("x")]
        terms = []
        for t in sinks or self.tensors[-1:]:
            idx = [f"j{i}" for i in range(len(t.shape))]
            ranges = ", ".join(f"{j} in 0..{d}" for j, d in zip(idx, t.shape, strict=True))
            scale = 1.0 / (math.prod(t.shape) * max(t.mag, 1.0))
            sub = f"{t.name}[{', '.join(idx)}]"
            body = f"{sub} * {sub}" if r.random() < 0.5 else sub
            terms.append(f"(sum({ranges}) {body}) * {scale:.3g}")
        outputs = [t.name for t in sinks[:2]]
        if r.random() < 0.2:  # a running statistic: `state` and `update`
            t = r.choice(self.tensors)
            s = self.fresh("s")
            self.decls.append(f"  state {s}: f32[{', '.join(map(str, t.shape))}] = zeros")
            self.lines.append(f"  update {s} = 0.9 * {s} + 0.1 * {t.name}")
        opt = r.choice(["sgd(lr = 0.1)", "sgd(lr = 0.05, momentum = 0.9)",
                        "adam(lr = 0.01)"])
        body = self.decls + self.lines + [f"  loss = {' + '.join(terms)}"]
        if outputs:
            body.append(f"  output {', '.join(outputs)}")
        body.append(f"  minimize loss with {opt}")
        return "import std.nn\nmodel fuzz() {\n" + "\n".join(body) + "\n}\n"


# ---------------------------------------------------------------------------------------------
# mutation (the frontend fuzzer's token mutations, driven by random.Random)

_TOKEN = re.compile(r"\s+|#[^\n]*|[A-Za-z_]\w*|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|\.\.\.|\.\.|->|//|"
                    r"<=|>=|==|!=|.", re.S)
_VOCAB = ["+", "-", "*", "/", "//", "%", "(", ")", "[", "]", "0", "1", "2", "0.5", "i0", "i1",
          "k1", "sum", "max", "min", "exp", "tanh", "abs", "if", "else", "<", ">=", "and",
          ",", "reshape", "transpose", "0..2", "3"]


def _snippets() -> list[str]:
    """The small whole programs of the frontend fuzzer (tests/frontend/test_frontend_fuzz.py)."""
    path = ROOT / "tests" / "frontend" / "test_frontend_fuzz.py"
    text = path.read_text(encoding="utf-8")
    m = re.search(r"SNIPPETS = \[(.*?)\n\]", text, re.S)
    return re.findall(r'"""(.*?)"""', m.group(1), re.S) if m else []


def mutate(text: str, rng: random.Random) -> str:
    """Delete, insert, swap or duplicate a few tokens of `text`."""
    toks = _TOKEN.findall(text)
    words = [i for i, t in enumerate(toks) if not t.isspace()]
    vocab = sorted({t for t in toks if not t.isspace()}) + _VOCAB
    for _ in range(rng.randint(1, 3)):
        if not words:
            break
        i = rng.choice(words)
        kind = rng.choice(["delete", "insert", "swap", "duplicate", "replace", "replace"])
        if kind == "delete":
            toks[i] = ""
        elif kind == "insert":
            toks[i] = rng.choice(vocab) + " " + toks[i]
        elif kind == "swap":
            j = rng.choice(words)
            toks[i], toks[j] = toks[j], toks[i]
        elif kind == "duplicate":
            toks[i] = toks[i] + " " + toks[i]
        else:
            same = [t for t in vocab if t[:1].isdigit() == toks[i][:1].isdigit()]
            toks[i] = rng.choice(same or vocab)
    return "".join(toks)


def make_program(seed: int, index: int) -> tuple[str, str]:
    """(kind, source) of case `index` of campaign `seed` (deterministic)."""
    rng = random.Random(f"{seed}:{index}")
    u = rng.random()
    if u < 0.75:
        return "generated", ProgramGen(rng).program()
    if u < 0.92:
        return "mutant", mutate(ProgramGen(rng).program(), rng)
    snippets = _snippets()
    return "snippet-mutant", mutate(rng.choice(snippets), rng) if snippets else ""
