"""nfc: a compiler toolkit for training deep networks with operators no library has.

The layers, in pipeline order: `grammar/` (Lark grammars) → `nfc` (frontend, IR, interpreter,
pass manager) → `nfc.passes` → `nfc.codegen` → `nfc.runtime`.
"""

__version__ = "0.1.0"
