"""Make the helpers beside these tests (`nfc_torch_cases`) importable under any import mode."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
