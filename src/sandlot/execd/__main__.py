"""``python -m sandlot.execd``."""

import sys

from sandlot.execd.main import main

sys.exit(main())
