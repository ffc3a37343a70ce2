import sys

from nfc.cli import main

sys.exit(main())
