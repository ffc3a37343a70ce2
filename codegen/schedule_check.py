"""Checking schedules that come from outside: an `nf.schedule` attribute in IR text, a record
of an imported tuning cache (the checks nfc.codegen.space re-exports).

`schedule_problem(op, value)` says why a value cannot be `op`'s schedule, `template_problem(cfg)`
why a parameter dict fits neither template when the kernel is unknown. Both accept what a
machine with other vector registers may have chosen: the register limits and the vector widths
of the host are the tuner's concern, not a reason to refuse a schedule that lowers correctly on
any target. The template rules themselves (`loop_rule_problem`, `gemm_rule_problem`) stay with
the spaces that apply them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from nfc.codegen.cpu import CpuTarget
from nfc.ir import ComputeOp, Func, KernelOp, Op

__all__ = ["check_schedule_attrs", "schedule_problem", "template_problem"]


def _domain_problem(cfg: Mapping[str, Any], domains: Mapping[str, Any]) -> str:
    """Missing or unknown parameter names, values out of their candidate lists."""
    missing = sorted(set(domains) - set(cfg))
    unknown = sorted(set(cfg) - set(domains))
    if missing or unknown:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(f"'{k}'" for k in missing))
        if unknown:
            parts.append("unknown " + ", ".join(f"'{k}'" for k in unknown))
        return "parameters " + "; ".join(parts)
    for k, allowed in domains.items():
        v = cfg[k]
        if isinstance(v, bool) or v not in allowed or type(v) is not type(allowed[0]):
            shown = ", ".join(repr(x) for x in allowed[:12]) + (", ..." if len(allowed) > 12
                                                                 else "")
            return f"'{k}' = {v!r} is not one of {shown}"
    return ""


_POSITIONAL_AXIS = re.compile(r"[dr](0|[1-9][0-9]{0,2})")


def template_problem(cfg: Mapping[str, Any]) -> str:
    """Why `cfg`, a schedule recorded for a canonical kernel (axes `d0`, `r0`, ...; see
    nfc.runtime.tuning.kernels) of an unknown kind, is a parameter dict of neither template,
    or breaks a rule that holds on every target; empty when it could be a schedule."""
    from nfc.codegen.space import (
        ANY_VEC,
        GEMM_DEFAULTS,
        GEMM_PARAMS,
        LOOP_FIXED_PARAMS,
        gemm_rule_problem,
        loop_rule_problem,
    )

    if "mr" in cfg or set(cfg) <= set(GEMM_PARAMS):
        cfg = {**GEMM_DEFAULTS, **cfg}
        why = _domain_problem(cfg, GEMM_PARAMS)
        return (f"as a gemm schedule: {why}" if why else
                ("as a gemm schedule: " + w if (w := gemm_rule_problem(cfg)) else ""))
    def axis(v: Any) -> bool:
        return isinstance(v, str) and (v == "" or _POSITIONAL_AXIS.fullmatch(v) is not None)
    domains: dict[str, Any] = {**LOOP_FIXED_PARAMS, "vec": ANY_VEC}
    # a dict recorded before the `parallel_reduce` knob leaves it out: the heuristic choice
    cfg = {"parallel_reduce": 0, **cfg}
    why = _domain_problem({k: v for k, v in cfg.items() if k not in ("vec_axis", "tile_axis")},
                          domains)
    if not why:
        for k in ("vec_axis", "tile_axis"):
            if k not in cfg:
                why = f"parameters missing '{k}'"
            elif not axis(cfg[k]):
                why = f"'{k}' = {cfg[k]!r} is not an axis of a canonical kernel (d0, r0, ...)"
            if why:
                break
    if not why and cfg["tile_axis"].startswith("r"):
        why = "'tile_axis' must be an output axis (d0, d1, ...)"
    if not why:
        why = loop_rule_problem(cfg, lambda a: a.startswith("d"),
                                True if cfg["vec_axis"].startswith("r") else None)
    return f"as a loop schedule: {why}" if why else ""


def schedule_problem(op: Op, value: Any, target: CpuTarget | None = None) -> str:
    """Why `value`, an `nf.schedule` attribute, cannot be the schedule of `op`; empty when it
    can. A compute takes its space's parameter dict (every parameter, each value one of the
    template's, the axes its own) or a `Schedule.to_dict()` form; an `nf.kernel` a
    `GroupSchedule.to_dict()` form; explicit forms must lower."""
    from nfc.codegen.lower import ScheduleError, lower
    from nfc.codegen.schedule import schedule_from_dict
    from nfc.codegen.space import (
        ANY_VEC,
        GEMM_DEFAULTS,
        GemmSpace,
        LoopSpace,
        gemm_rule_problem,
        loop_rule_problem,
        schedule_space,
    )

    if not isinstance(value, dict):
        return f"a schedule is a dictionary of parameters, not {type(value).__name__}"
    if not isinstance(op, ComputeOp | KernelOp):
        return f"'{op.opname}' has no schedule"
    if "version" in value or "kind" in value:
        kind = value.get("kind", "compute")
        want = "compute" if isinstance(op, ComputeOp) else "group"
        if kind != want:
            return f"a schedule of kind '{kind}' given to a {want} op (want kind '{want}')"
        try:
            sched = schedule_from_dict(value)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            return f"malformed {kind} schedule: {err}"
        try:
            lower(op, sched)
        except ScheduleError as err:
            return str(err)
        except (KeyError, TypeError, IndexError, ValueError) as err:
            # a hand-written schedule may break lowering's assumptions in other ways
            return f"the schedule does not fit this op ({type(err).__name__}: {err})"
        return ""
    if not isinstance(op, ComputeOp):
        return "an nf.kernel needs a group schedule (kind 'group'), not space parameters"
    space = schedule_space(op, target)
    domains: dict[str, Any] = dict(space.params)
    if isinstance(space, LoopSpace):
        domains["vec"] = ANY_VEC  # another target's vector width lowers all the same
    if isinstance(space, GemmSpace):
        value = {**GEMM_DEFAULTS, **value}
    else:  # left out (written before the knob): the heuristic choice, valid wherever 0 is
        value = {"parallel_reduce": 0, **value}
    why = _domain_problem(value, {k: tuple(v) for k, v in domains.items()})
    if not why:
        if isinstance(space, GemmSpace):
            why = gemm_rule_problem(value)
        else:
            why = loop_rule_problem(value, lambda a: a in space.dims, bool(space.raxes))
    return f"not a schedule of this op's {space.kind} space: {why}" if why else ""


def check_schedule_attrs(funcs: Iterable[Func], target: CpuTarget | None = None) -> None:
    """Raise CompileError with one located diagnostic per op of `funcs` (computes inside
    `nf.kernel` ops included) whose `nf.schedule` attribute `schedule_problem` refuses."""
    from nfc.codegen.space import SCHEDULE_ATTR
    from nfc.diagnostics import CompileError, Diagnostic

    found: list[Diagnostic] = []
    for f in funcs:
        for op in f.body.ops:
            inner = op.body.ops if isinstance(op, KernelOp) else []
            for o in (op, *inner):
                if SCHEDULE_ATTR in o.attrs:
                    why = schedule_problem(o, o.attrs[SCHEDULE_ATTR], target)
                    if why:
                        # IR without `loc(...)` has no op location: name the op as well
                        names = ", ".join(f"%{v.name}" for v in o.results if v.name)
                        what = f"{names} ({o.opname} in @{f.name})" if names else o.opname
                        found.append(Diagnostic(
                            "error", f"invalid '{SCHEDULE_ATTR}' of {what}: {why}",
                            o.loc or f.loc))
    if found:
        raise CompileError(found)
