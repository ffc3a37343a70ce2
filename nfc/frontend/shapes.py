"""Compile-time values, type expressions and shape unification at call sites.

Shapes of op parameters are symbolic (`x: T[N, K]`); at each call the argument types bind the
shape variables (N, K) and dtype variables (T). A dimension may be an expression with one
unknown (`H + 2*p`), solved when it is affine in that unknown.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nfc.diagnostics import CompileError, error, note
from nfc.frontend import ast
from nfc.frontend.ellipsis import ELLIPSIS, WHERE, leading
from nfc.frontend.limits import MAX_CT_INT
from nfc.ir import DType, Loc, TensorType

CTValue = int | float | bool | tuple[int, ...]
DTYPES = {d.value: d for d in DType}


class Unbound(Exception):
    """A compile-time expression mentions a variable that has no value yet."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def is_dtype_var(name: str) -> bool:
    """A capitalised identifier in dtype position is a dtype variable (T, U, ...)."""
    return name not in DTYPES and name[:1].isupper()


#: The dtypes an integer dtype variable (`Int`, `Int2`, ...) may take: labels and ids.
INT_DTYPES = (DType.I32, DType.I64)


def dtype_class(name: str) -> tuple[DType, ...] | None:
    """The dtypes dtype variable `name` is restricted to: `Int` followed by digits or nothing
    binds only integer dtypes (INT_DTYPES); other dtype variables take any dtype (None)."""
    if name.startswith("Int") and (name[3:] == "" or name[3:].isdigit()):
        return INT_DTYPES
    return None


def eval_ct(e: ast.Expr, lookup: Callable[[str, Loc], CTValue]) -> CTValue:
    """The value of a compile-time expression (shapes, ranges, compile-time arguments).

    `lookup(name, loc)` gives a name's value, raises Unbound, or raises a CompileError.
    """
    if isinstance(e, ast.Num | ast.Bool):
        return e.value
    if isinstance(e, ast.Name):
        return lookup(e.id, e.loc)
    if isinstance(e, ast.EllipsisExpr):
        raise error(WHERE, e.loc)
    if isinstance(e, ast.ListExpr):
        items = []
        for item in e.items:
            v = eval_ct(item, lookup)
            if not isinstance(v, int) or isinstance(v, bool):
                raise error("a list holds integers only", item.loc)
            items.append(v)
        return tuple(items)
    if isinstance(e, ast.Unary) and e.op == "neg":
        v = eval_ct(e.x, lookup)
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise error("cannot negate this value", e.loc)
        return -v
    if isinstance(e, ast.BinOp):
        first, links = ast.chain(e)
        acc = eval_ct(first, lookup)
        for link in links:  # a loop, not recursion: chains may be long
            acc = _arith(link, acc, eval_ct(link.b, lookup))
        return acc
    raise error("expected a compile-time value (numbers, names and + - * / // %)", e.loc)


def _arith(e: ast.BinOp, a: CTValue, b: CTValue) -> CTValue:
    if isinstance(a, bool | tuple) or isinstance(b, bool | tuple):
        raise error(f"operator '{e.op}' needs numbers", e.loc)
    try:
        r = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
             "/": lambda: a / b, "//": lambda: a // b, "%": lambda: a % b}[e.op]()
    except ZeroDivisionError:
        raise error("division by zero in a compile-time expression", e.loc) from None
    except OverflowError:
        raise error("compile-time value is too large", e.loc) from None
    if isinstance(r, int) and abs(r) > MAX_CT_INT:
        raise error("compile-time integer is too large", e.loc)
    return r


def eval_int(e: ast.Expr, lookup: Callable[[str, Loc], CTValue], what: str) -> int:
    """A compile-time integer."""
    v = eval_ct(e, lookup)
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise error(f"{what} must be an integer, found {format_ct(v)}", e.loc)
    return v


def format_ct(v: CTValue) -> str:
    """A compile-time value as source text."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return "[" + ", ".join(str(x) for x in v) + "]"
    return repr(v)


_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "//": 2, "%": 2}


def format_expr(e: ast.Expr, ctx: int = 0) -> str:
    """Source text of a compile-time expression."""
    if isinstance(e, ast.Num):
        return repr(e.value)
    if isinstance(e, ast.Bool):
        return "true" if e.value else "false"
    if isinstance(e, ast.Name):
        return e.id
    if isinstance(e, ast.Unary):
        return "-" + format_expr(e.x, 3)
    if isinstance(e, ast.BinOp):
        p = _PREC.get(e.op, 1)
        first, links = ast.chain(e)
        text = format_expr(first, p)
        for link in links:
            text += f" {link.op} {format_expr(link.b, p + 1)}"
        return f"({text})" if p < ctx else text
    if isinstance(e, ast.ListExpr):
        return "[" + ", ".join(format_expr(i) for i in e.items) + "]"
    return "..."  # `...` itself, and anything that is not a compile-time expression


def _dims(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def format_type(t: ast.TypeExpr) -> str:
    """Source text of a type expression."""
    return f"{t.dtype}[{', '.join(format_expr(d) for d in t.dims)}]"


def names_in(e: ast.Expr) -> list[str]:
    """Names mentioned by an expression, in order, without repeats."""
    out: list[str] = []
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, ast.Name) and x.id not in out:
            out.append(x.id)
        stack.extend(reversed(x.children()))
    return out


def format_tensor_type(t: TensorType) -> str:
    """A concrete type in surface syntax, `f32[64, 784]`."""
    return f"{t.dtype}[{', '.join(str(d) for d in t.shape)}]"


@dataclass
class Binding:
    """What unification found: shape variables, dtype variables and where each was bound."""

    dims: dict[str, int]
    dtypes: dict[str, DType]
    origin: dict[str, str]
    ellipsis: tuple[int, ...] | None = None
    """The leading dimensions `...` stands for (None when no parameter has `...`)."""

    def lookup(self, name: str, loc: Loc) -> CTValue:
        """A lookup function for eval_ct: unbound names raise Unbound."""
        if name in self.dims:
            return self.dims[name]
        raise Unbound(name)


def _affine(e: ast.Expr, known: Callable[[str, Loc], CTValue],
            var: str) -> tuple[int, int] | None:
    """(a, b) with `e == a * var + b` when `e` looks affine in `var` (checked at 0, 1, 2)."""
    try:
        f0, f1, f2 = (_at(e, known, var, v) for v in (0, 1, 2))
    except (CompileError, Unbound):
        return None
    if not all(isinstance(f, int) and not isinstance(f, bool) for f in (f0, f1, f2)):
        return None
    a = f1 - f0  # type: ignore[operator]
    if a == 0 or f2 - f1 != a:  # type: ignore[operator]
        return None
    return a, f0  # type: ignore[return-value]


def _at(e: ast.Expr, known: Callable[[str, Loc], CTValue], var: str, v: int) -> CTValue:
    def look(n: str, loc: Loc) -> CTValue:
        return v if n == var else known(n, loc)
    return eval_ct(e, look)


def _solve(e: ast.Expr, actual: int, known: Callable[[str, Loc], CTValue],
           var: str) -> int | None:
    """The value of `var` making `e == actual`, when `e` is affine in `var`; else None."""
    form = _affine(e, known, var)
    if form is None or (actual - form[1]) % form[0]:
        return None
    v = (actual - form[1]) // form[0]
    try:
        return v if _at(e, known, var, v) == actual else None
    except (CompileError, Unbound):
        return None


def unify_params(op: ast.OpDef, arg_types: list[TensorType], arg_locs: list[Loc],
                 cvals: dict[str, CTValue]) -> Binding:
    """Bind the op's shape and dtype variables from the argument types, or raise."""
    b = Binding({}, {}, {})

    def known(name: str, loc: Loc) -> CTValue:
        if name in cvals:
            return cvals[name]
        return b.lookup(name, loc)

    pending: list[tuple[int, int, ast.Expr]] = []
    for i, (p, t) in enumerate(zip(op.params, arg_types, strict=True)):
        where = f"argument {i + 1} of '{op.name}'"
        decl = note(f"parameter '{p.name}' declared here as {format_type(p.type)}", p.loc)
        dt = p.type.dtype
        if is_dtype_var(dt):
            if dt in b.dtypes and b.dtypes[dt] != t.dtype:
                raise error(f"{where} has dtype {t.dtype} but parameter '{p.name}' expects "
                            f"{dt} = {b.dtypes[dt]} (bound by {b.origin[dt]})", arg_locs[i],
                            decl)
            allowed = dtype_class(dt)
            if allowed is not None and t.dtype not in allowed:
                raise error(f"{where} has dtype {t.dtype} but parameter '{p.name}' expects "
                            f"{dt}, an integer dtype ({' or '.join(map(str, allowed))})",
                            arg_locs[i], decl)
            b.dtypes.setdefault(dt, t.dtype)
            b.origin.setdefault(dt, f"argument {i + 1}")
        elif dt in DTYPES and DTYPES[dt] != t.dtype:
            raise error(f"{where} has dtype {t.dtype} but parameter '{p.name}' expects {dt}",
                        arg_locs[i], decl)
        dims = p.type.dims
        if leading(p.type):
            dims = dims[1:]
            if t.rank < len(dims):
                raise error(f"{where} has rank {t.rank} ({format_tensor_type(t)}) but parameter "
                            f"'{p.name}' expects rank {len(dims)} or more", arg_locs[i], decl)
            lead = t.shape[:t.rank - len(dims)]
            if b.ellipsis is None:
                b.ellipsis = lead
                b.origin[ELLIPSIS] = f"argument {i + 1}"
            elif lead != b.ellipsis:
                raise error(f"leading dimensions of {where} are {_dims(lead)} ('...' of "
                            f"{format_tensor_type(t)}) but '...' = {_dims(b.ellipsis)} was bound "
                            f"by {b.origin[ELLIPSIS]}", arg_locs[i], decl)
        elif len(dims) != t.rank:
            raise error(f"{where} has rank {t.rank} ({format_tensor_type(t)}) but parameter "
                        f"'{p.name}' expects rank {len(dims)}", arg_locs[i], decl)
        off = t.rank - len(dims)
        pending += [(i, d + off, e) for d, e in enumerate(dims)]
    progress = True
    while pending and progress:
        progress = False
        for item in list(pending):
            i, d, e = item
            actual = arg_types[i].shape[d]
            try:
                value = eval_ct(e, known)
            except Unbound as u:
                unknown = [n for n in names_in(e) if n not in cvals and n not in b.dims]
                if len(unknown) != 1:
                    continue
                if isinstance(e, ast.Name):
                    solved: int | None = actual
                else:
                    solved = _solve(e, actual, known, u.name)
                if solved is None:
                    continue
                b.dims[unknown[0]] = solved
                b.origin[unknown[0]] = f"argument {i + 1} dimension {d}"
                value = eval_ct(e, known)
            pending.remove(item)
            progress = True
            if value != actual:
                _mismatch(op, i, arg_types, arg_locs, b, cvals, e)
    if pending:
        i, d, e = pending[0]
        _indivisible(op, i, d, e, arg_types, arg_locs, known, cvals, b)
        raise error(f"cannot infer {', '.join(repr(n) for n in names_in(e))} from "
                    f"dimension {d} of argument {i + 1} of '{op.name}' "
                    f"(size {arg_types[i].shape[d]}): only affine expressions in one unknown "
                    f"are solved", arg_locs[i], note("declared here", e.loc))
    return b


def _indivisible(op: ast.OpDef, i: int, d: int, e: ast.Expr, arg_types: list[TensorType],
                 arg_locs: list[Loc], known: Callable[[str, Loc], CTValue],
                 cvals: dict[str, CTValue], b: Binding) -> None:
    """Raise a clear error when dimension `d` cannot be `e` because of divisibility
    (`G * groups` of size 5 with groups = 2)."""
    unknown = [n for n in names_in(e) if n not in cvals and n not in b.dims]
    if len(unknown) != 1:
        return
    form = _affine(e, known, unknown[0])
    actual = arg_types[i].shape[d]
    if form is None or not (actual - form[1]) % form[0]:
        return
    a, c = form
    size = f"{actual}" if c == 0 else f"{actual} - {c}" if c > 0 else f"{actual} + {-c}"
    given = [f"{n} = {format_ct(known(n, e.loc))}" for n in names_in(e) if n != unknown[0]]
    p = op.params[i]
    raise error(f"dimension {d} of argument {i + 1} of '{op.name}' has size {actual}, but "
                f"parameter '{p.name}' needs {format_expr(e)}"
                f"{' with ' + ', '.join(given) if given else ''}: {size} is not a multiple "
                f"of {abs(a)}", arg_locs[i],
                note(f"parameter '{p.name}' declared here as {format_type(p.type)}", p.loc))


def _mismatch(op: ast.OpDef, i: int, arg_types: list[TensorType], arg_locs: list[Loc],
              b: Binding, cvals: dict[str, CTValue], bad: ast.Expr) -> None:
    p = op.params[i]
    dims = []
    for e in p.type.dims:
        if isinstance(e, ast.EllipsisExpr):
            dims += [str(n) for n in b.ellipsis or ()]
            continue
        try:
            dims.append(str(eval_ct(e, lambda n, loc: cvals[n] if n in cvals
                                    else b.lookup(n, loc))))
        except (Unbound, CompileError):
            dims.append("?")
    dt = b.dtypes.get(p.type.dtype, p.type.dtype)
    notes = [note(f"parameter '{p.name}' declared here as {format_type(p.type)}", p.loc)]
    for n in names_in(bad):
        if n in b.origin:
            notes.append(note(f"{n} = {b.dims[n]} was bound by {b.origin[n]}", bad.loc))
    raise error(f"shape mismatch for argument {i + 1} of '{op.name}': expected "
                f"{format_type(p.type)} = {dt}[{', '.join(dims)}], got "
                f"{format_tensor_type(arg_types[i])}", arg_locs[i], *notes)


def with_bindings(t: ast.TypeExpr, values: dict[str, CTValue],
                  only: list[str] | None = None) -> str:
    """`T[N, K]` followed by the values of its variables (or of `only`): `with N = 64`."""
    names = only if only is not None else [n for d in t.dims for n in names_in(d)]
    if leading(t) and ELLIPSIS in values and (only is None or ELLIPSIS in only):
        names = [ELLIPSIS, *names]
    seen = [n for i, n in enumerate(names) if n in values and n not in names[:i]]
    text = format_type(t)
    if seen:
        text += " with " + ", ".join(f"{n} = {format_ct(values[n])}" for n in seen)
    return text
