"""nfc: a compiler toolkit for training deep networks with operators no library has.

The layers, in pipeline order: `grammar/` (Lark grammars) → `nfc` (frontend, IR, interpreter,
pass manager) → `nfc.passes` → `nfc.codegen` → `nfc.runtime`.
"""

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """`nfc.load(path)`: open a compiled model (nfc.runtime.loader.load), imported on use."""
    if name == "load":
        from nfc.runtime.loader import load

        return load
    raise AttributeError(f"module 'nfc' has no attribute '{name}'")
