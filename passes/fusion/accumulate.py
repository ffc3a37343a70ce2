"""Running sums for gradient accumulation, before fusion partitions a function.

Autodiff sums the gradient contributions of a value read several times (a weight read by
every step of an unrolled RNN) in one compute at the end, `%d_w = (%d_w_0 + %d_w_1 + ... +
%d_w_7)`, so every contribution stays live until then: MI-LSTM's weight gradients held eight
16 MiB contributions at once. `split_sums` evaluates such a sum as a running sum instead,
`%s_1 = %d_w_0 + ... + %d_w_4` right after `%d_w_4` is produced (`CHUNK` terms per partial
sum), `%s_2 = %s_1 + %d_w_5 + ...`, the original compute adding the last terms: each
contribution dies at its partial sum. The
additions happen in the same left-to-right order as in the one compute, so the result is the
same bit for bit. The partial sums (and the final compute) carry `nf.accumulate`, naming the
sum; the partitioner never puts two computes of one sum in one kernel (the chain would be
one stage again, codegen inlining elementwise producers, with every contribution live).
"""

from __future__ import annotations

from nfc.ir import Binary, ComputeOp, Expr, Func, Index, Load

#: Attribute naming the running sum a compute belongs to.
ACCUMULATE_ATTR = "nf.accumulate"
#: Sums of smaller results are left as they are (they do not move the peak).
MIN_BYTES = 1 << 20
#: Contributions per partial sum: each partial sum is written and read back once more, a
#: quarter of the traffic its contributions already cost (MI-LSTM: 1 % of the step with 4,
#: 3.7 % with 1), and at most this many (plus one) contributions are live at once.
CHUNK = 4


def _terms(body: Expr) -> list[Expr]:
    """The operands of a left-nested chain `((a + b) + c) + ...`, in order."""
    out: list[Expr] = []
    while isinstance(body, Binary) and body.op == "+":
        out.append(body.b)
        body = body.a
    out.append(body)
    return out[::-1]


def split_sums(func: Func, min_bytes: int = MIN_BYTES, chunk: int | None = None) -> int:
    """Rewrite in `func`'s top-level block every elementwise compute of at least `min_bytes`
    that adds `chunk + 2` or more distinct whole tensors of its own type (`%a[i, j] + %b[i, j]
    + ...`) into a running sum: a partial sum per `chunk` terms (the first also adds the
    first term), each placed right after the last producer of its terms, the compute itself
    adding the remaining terms to the last one (`chunk`: `CHUNK`).
    Returns the number of sums rewritten."""
    chunk = CHUNK if chunk is None else chunk
    ops = func.body.ops
    count = 0
    for c in list(ops):
        if (not isinstance(c, ComputeOp) or c.reduce is not None or ACCUMULATE_ATTR in c.attrs
                or c.result.type.nbytes < min_bytes):
            continue
        terms = _terms(c.body)
        x = tuple(Index(a.name) for a in c.dims)
        if len(terms) < 2 + chunk or not all(isinstance(t, Load) and t.indices == x
                                     and t.tensor.type == c.result.type for t in terms):
            continue
        loads = [t for t in terms if isinstance(t, Load)]
        if len({id(t.tensor) for t in loads}) != len(loads):
            continue
        pos = {id(r): n for n, op in enumerate(ops) for r in op.results}
        tag = c.result.name or f"sum{count}"
        acc: Expr = terms[0]
        at = pos.get(id(loads[0].tensor), -1)
        new: list[tuple[int, ComputeOp]] = []
        rest = loads[1:]
        while len(rest) > chunk:
            part, rest = rest[:chunk], rest[chunk:]
            for t in part:
                at = max(at, pos.get(id(t.tensor), -1))
                acc = Binary("+", acc, t)
            op = ComputeOp(c.result.type, c.dims, acc, loc=c.loc,
                           attrs={**c.attrs, ACCUMULATE_ATTR: tag},
                           name=f"{tag}_acc{len(new) + 1}")
            new.append((at, op))
            acc = Load(op.result, x)
        for t in rest:
            acc = Binary("+", acc, t)
        c.body = acc
        c.attrs[ACCUMULATE_ATTR] = tag
        for at, op in reversed(new):  # later positions first: earlier ones stay valid
            ops.insert(at + 1, op)
        count += 1
    return count
