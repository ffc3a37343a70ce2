"""Make the helper modules beside these tests (`tuning_fakes`) importable under any pytest
import mode; the measuring workers inherit the path as well."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
