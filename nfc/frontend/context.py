"""State shared while elaborating one function: bindings, emitted ops, diagnostics.

Error recovery works per statement: a statement that fails records its diagnostics and binds
its targets to POISON; any later use of a poisoned name aborts that statement silently
(`Poisoned`), so one mistake yields one message.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from nfc.diagnostics import CompileError, Diagnostic, error, note
from nfc.frontend import ast, limits
from nfc.frontend.ellipsis import ELLIPSIS, leading
from nfc.frontend.shapes import CTValue, format_tensor_type, names_in, with_bindings
from nfc.ir import ComputeOp, DType, Expr, Load, Loc, Op, Value

if TYPE_CHECKING:
    from nfc.frontend.imports import ModuleScope


@dataclass
class TensorInfo:
    """A name bound to a tensor value, with what a diagnostic needs to say about it."""

    value: Value
    name: str
    decl_loc: Loc | None
    decl_text: str
    decl_type: ast.TypeExpr | None = None
    values: dict[str, CTValue] | None = None
    """The declared type and the values of its variables, to show the relevant ones."""

    def describe(self, dim: int | None = None) -> str:
        """`f32[B, C, H, W] with H = 30`: the declaration, with the variables of `dim`."""
        if self.decl_type is None or self.values is None:
            return self.decl_text
        dims = self.decl_type.dims
        lead = self.values.get(ELLIPSIS) if leading(self.decl_type) else None
        if isinstance(lead, tuple) and dim is not None:
            # the value's dimension `dim` is one of `...` or a declared one after it
            names = [ELLIPSIS] if dim < len(lead) else names_in(dims[dim - len(lead) + 1])
        else:
            names = names_in(dims[dim]) if dim is not None and dim < len(dims) else None
        text = with_bindings(self.decl_type, self.values, names)
        return text.replace(self.decl_type.dtype, str(self.value.dtype), 1)

    @staticmethod
    def local(value: Value, name: str, loc: Loc | None) -> TensorInfo:
        """A tensor computed by a statement."""
        return TensorInfo(value, name, loc, format_tensor_type(value.type))


@dataclass(frozen=True)
class CompileTimeBinding:
    """A name bound to a compile-time value."""

    value: CTValue


@dataclass(frozen=True)
class DTypeBinding:
    """A dtype variable bound at a call (`T = f32`); usable as a cast `T(x)`."""

    dtype: DType


#: The builtin float constants: weak floats like a literal (`-inf` is `inf` negated).
FLOAT_CONSTANTS: dict[str, float] = {"inf": math.inf, "nan": math.nan}


class Poison:
    """A name whose definition failed."""


POISON = Poison()
Binding = TensorInfo | CompileTimeBinding | DTypeBinding | Poison


class Poisoned(Exception):
    """A poisoned name was used: abort the statement without a new diagnostic."""


class Fatal(Exception):
    """A limit was exceeded: stop elaborating altogether."""

    def __init__(self, err: CompileError) -> None:
        super().__init__(str(err))
        self.err = err


def shorten(name: str) -> str:
    """A name as quoted in a message (very long ones are cut)."""
    return name if len(name) <= 40 else name[:37] + "..."


class Env:
    """The names visible in a model body or in one inlined op call."""

    def __init__(self, scope: ModuleScope, training: bool) -> None:
        self.vars: dict[str, Binding] = {}
        self.scope = scope
        self.training = training

    def get(self, name: str) -> Binding | None:
        """The binding of `name`, the builtins `training`, `inf` and `nan` included; None when
        unknown."""
        b = self.vars.get(name)
        if b is None:
            if name == "training":
                return CompileTimeBinding(self.training)
            if name in FLOAT_CONSTANTS:
                return CompileTimeBinding(FLOAT_CONSTANTS[name])
        return b

    def _is_function(self, name: str, loc: Loc) -> bool:
        """Whether `name` is a builtin, an intrinsic or an op visible here."""
        from nfc.frontend.builtins import BUILTINS
        from nfc.frontend.scalars import INTRINSIC_ARITY

        if name in BUILTINS or name in INTRINSIC_ARITY:
            return True
        try:
            return self.scope.lookup_op(name, loc) is not None
        except CompileError:
            return False

    def unknown(self, name: str, loc: Loc, extra: list[str] | None = None,
                what: str = "name") -> CompileError:
        """An 'unknown name' error with a suggestion; the name is poisoned afterwards."""
        if self.scope.incomplete or self.vars.get(name) is POISON:
            raise Poisoned  # an import failed, or the name was reported already
        if what == "name" and self._is_function(name, loc):
            self.vars[name] = POISON
            return error(f"'{shorten(name)}' is a function, not a value: call it, "
                         f"`{shorten(name)}(...)`; compile-time arguments go by name, "
                         "`f<p = 2>(x)` (a bare `f<2>` reads as comparisons)", loc)
        cands = [*self.vars, "training", *FLOAT_CONSTANTS, *(extra or [])]
        self.vars[name] = POISON
        sugg = difflib.get_close_matches(name, cands, 1) if len(name) < 100 else []
        hint = f"; did you mean '{sugg[0]}'?" if sugg else ""
        return error(f"unknown {what} '{shorten(name)}'{hint}", loc)


@dataclass
class Ctx:
    """Everything elaboration of one function accumulates."""

    training: bool
    ops: list[Op] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    loads: dict[int, tuple[Load, ast.Subscript, TensorInfo]] = field(default_factory=dict)
    calls: list[tuple[str, Loc]] = field(default_factory=list)
    active: list[object] = field(default_factory=list)
    ticks: int = 0
    salt: int = 0
    max_statements: int = field(default_factory=limits.STATEMENTS.value)
    out_of_statements: bool = False
    """Whether elaboration stopped at the statement budget."""
    max_points: int = field(default_factory=limits.POINTS.value)
    max_tensor_bytes: int = field(default_factory=limits.TENSOR_BYTES.value)
    tensor_bytes: int = 0
    """Bytes of the function's arguments and computes so far (without reuse)."""
    depths: dict[int, tuple[Expr, int]] = field(default_factory=dict)
    op_costs: dict[int, int] = field(default_factory=dict)
    """Estimated statements of each op body (nfc.frontend.estimate)."""
    _seen: set[tuple[str, Loc | None]] = field(default_factory=set)

    @property
    def callsite(self) -> str | None:
        """`file:line:col` of the outermost op call being inlined (None outside calls)."""
        return str(self.calls[0][1]) if self.calls else None

    def emit(self, op: Op) -> None:
        """Append an op to the function body, recording the call site of inlined ops.

        A compute over more iteration points than the budget is refused, and so is the compute
        that takes the function's tensors past their budget of bytes (which stops
        elaboration: every later compute would be refused too).
        """
        if isinstance(op, ComputeOp):
            points = 1
            for a in op.all_axes:
                points *= a.extent
            if points > self.max_points:
                shape = " x ".join(str(a.extent) for a in op.all_axes)
                raise error(f"this compute has {points} iteration points ({shape}), more than "
                            f"the budget of {self.max_points} {limits.POINTS.what} "
                            f"({limits.POINTS.hint()})", op.loc)
            self.count_bytes(op.result.type.nbytes, op.loc)
        site = self.callsite
        if site is not None:
            op.attrs["nf.callsite"] = site
        self.ops.append(op)

    def count_bytes(self, nbytes: int, loc: Loc | None) -> None:
        """Add a tensor of `nbytes` to the function; refuse it past the budget."""
        self.tensor_bytes += nbytes
        if self.tensor_bytes > self.max_tensor_bytes:
            raise Fatal(error(f"the tensors of this function take "
                              f"{limits.human_bytes(self.tensor_bytes)} with this one, more than "
                              f"the budget of {limits.human_bytes(self.max_tensor_bytes)} "
                              f"({limits.TENSOR_BYTES.hint()})", loc, *self.call_notes()))

    def tick(self, loc: Loc) -> None:
        """Count one elaborated statement; refuse runaway unrolling."""
        self.depths.clear()  # expressions rarely outlive their statement: keep memory flat
        self.ticks += 1
        if self.ticks > self.max_statements:
            self.out_of_statements = True
            raise Fatal(error(f"more than {self.max_statements} {limits.STATEMENTS.what} "
                              f"({limits.STATEMENTS.hint()})", loc, *self.call_notes()))

    def depth(self, e: Expr) -> int:
        """The depth of expression `e` (1 for a leaf), memoised: linear in its size, no
        recursion."""
        kids = e.children()
        if not kids:
            return 1
        memo = self.depths
        hit = memo.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1]
        # the common case: expressions are built bottom-up, so the children are known
        best = 0
        for k in kids:
            grandkids = k.children()
            if not grandkids:
                d = 1
            else:
                got = memo.get(id(k))
                if got is not None and got[0] is k:
                    d = got[1]
                elif all(not g.children() for g in grandkids):
                    d = 2  # a fresh load `%x[i, j]`
                else:
                    break
            best = d if d > best else best
        else:
            memo[id(e)] = (e, best + 1)
            return best + 1
        stack: list[tuple[Expr, bool]] = [(e, False)]
        while stack:
            x, done = stack.pop()
            hit = self.depths.get(id(x))
            if hit is not None and hit[0] is x:
                continue
            kids = x.children()
            if done or not kids:
                d = 1 + max((self.depths[id(k)][1] for k in kids), default=0)
                self.depths[id(x)] = (x, d)
                continue
            stack.append((x, True))
            stack.extend((k, False) for k in kids)
        return self.depths[id(e)][1]

    def call_notes(self) -> list[Diagnostic]:
        """Notes pointing at the op calls being inlined, innermost first."""
        return [note(f"in op '{name}' called here", loc) for name, loc in reversed(self.calls)]

    def report(self, err: CompileError, with_calls: bool = True) -> None:
        """Record the diagnostics of `err` (deduplicated by message and location)."""
        extra = tuple(self.call_notes()) if with_calls else ()
        for d in err.diagnostics:
            key = (d.message, d.loc)
            if key in self._seen or len(self.diagnostics) >= 100:
                continue
            self._seen.add(key)
            self.diagnostics.append(replace(d, notes=d.notes + extra) if extra else d)

    def record_load(self, ld: Load, access: ast.Subscript, info: TensorInfo) -> None:
        """Remember where a load came from, to locate bounds violations."""
        self.loads[id(ld)] = (ld, access, info)

    def check_bounds(self, op: ComputeOp) -> None:
        """Report every access of `op` that may leave its tensor (nfc.bounds.check_bounds)."""
        from nfc.bounds import check_bounds

        for v in check_bounds(op):
            found = self.loads.get(id(v.load))
            if found is None or found[0] is not v.load:
                found = next((x for x in self.loads.values() if x[0] == v.load), None)
            if found is None:  # an access the frontend built itself: a frontend bug
                raise AssertionError(f"unlocated bounds violation {v} in {op}")
            _, access, info = found
            index = access.indices[v.dim] if v.dim < len(access.indices) else access
            if v.lo is None or v.hi is None:
                msg = (f"cannot bound access '{access.name}' dimension {v.dim} (size {v.size});"
                       f" guard it, e.g. `{access.name}[...] if 0 <= i < {v.size} else 0.0`")
            elif v.hi >= v.size:
                msg = (f"access '{access.name}' dimension {v.dim} can reach {v.hi} but the "
                       f"tensor has size {v.size}")
            else:
                msg = (f"access '{access.name}' dimension {v.dim} can reach {v.lo} but indices "
                       "start at 0")
            self.report(error(msg, index.loc, note(f"'{info.name}' declared here as "
                                                   f"{info.describe(v.dim)}", info.decl_loc)))
