"""nfc: a compiler toolkit for training deep networks with operators no library has.

The layers, in pipeline order: `grammar/` (Lark grammars) → `nfc` (frontend, IR, interpreter,
pass manager) → `nfc.passes` → `nfc.codegen` → `nfc.runtime`.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

__version__ = "0.1.0"

#: Short names of runtime packages: `import nfc.torch` is `nfc.runtime.torch` (one module
#: object under both names), so the integration lives in the runtime layer it belongs to.
ALIASES = {"nfc.torch": "nfc.runtime.torch", "nfc.jax": "nfc.runtime.jax"}


_SPECS: dict[str, importlib.machinery.ModuleSpec | None] = {}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an ALIASES name as its target module, imported on first use."""

    def find_spec(self, name: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        """A spec for the aliases, None for every other name."""
        return importlib.util.spec_from_loader(name, self) if name in ALIASES else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        """The target module itself (imported now), not a copy."""
        module = importlib.import_module(ALIASES[spec.name])
        _SPECS[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the target ran when it was imported. Its own spec is put back
        (the import system set the alias's), so it stays `nfc.runtime.torch` for reloads
        and tools."""
        module.__spec__ = _SPECS[module.__name__]


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.append(_AliasFinder())


def __getattr__(name: str) -> object:
    """`nfc.load(path)`: open a compiled model (nfc.runtime.loader.load), imported on use;
    `nfc.torch`, `nfc.jax`: the framework integrations (ALIASES)."""
    if name == "load":
        from nfc.runtime.loader import load

        return load
    if f"nfc.{name}" in ALIASES:
        return importlib.import_module(f"nfc.{name}")
    raise AttributeError(f"module 'nfc' has no attribute '{name}'")
