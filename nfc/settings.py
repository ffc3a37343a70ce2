"""`--set k=v` settings: the one parser behind every command that takes them.

    parse_settings(["batch=32", "opt.lr=0.01", "opt.name=adam"])
    -> ({"batch": 32}, {"lr": 0.01, "name": "adam"})

A setting is a model parameter (`batch=32`: a number or a bool, handed to the frontend and
to passes as `Context.params`) or, spelled `opt.<name>`, an optimizer hyperparameter
(`opt.lr=0.01`, `opt.name=adam`) that `apply_optimizer` writes into the module's
`nf.optimizer` attribute. Values are `true`/`false`, an integer, a float, else text (text only
for the optimizer: `opt.name=adam`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nfc.ir import Module

__all__ = ["SettingError", "apply_optimizer", "parse_settings", "parse_value"]


class SettingError(ValueError):
    """A malformed `--set` item."""


def parse_value(text: str) -> int | float | bool | str:
    """`true`/`false`, an int, a float, else the text itself."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text.strip()


def parse_settings(items: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model parameters, optimizer overrides) from `k=v` strings (see the module doc)."""
    params: dict[str, Any] = {}
    opt: dict[str, Any] = {}
    for item in items:
        key, sep, val = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SettingError(f"--set expects key=value, got '{item}'")
        value = parse_value(val)
        if key.startswith("opt."):
            opt[key[4:]] = value
        else:
            if isinstance(value, str):
                raise SettingError(f"model parameter '{key}' must be a number or a bool, "
                                   f"got '{val}'")
            params[key] = value
    return params, opt


def apply_optimizer(module: Module, overrides: Mapping[str, Any]) -> None:
    """Write the `opt.<name>` overrides into the module's `nf.optimizer` attribute; naming
    another optimizer (`name=adam`) starts from that optimizer's defaults."""
    if not overrides:
        return
    cur = module.attrs.get("nf.optimizer")
    new = dict(cur) if isinstance(cur, dict) else {"name": "sgd"}
    if "name" in overrides and overrides["name"] != new.get("name"):
        new = {"name": overrides["name"]}  # another optimizer: its own defaults
    for k, v in overrides.items():
        new[k] = float(v) if isinstance(v, int) and not isinstance(v, bool) else v
    module.attrs["nf.optimizer"] = new
