"""``python -m dlmspec.cli``: the same as the ``dlmspec`` console script."""

import sys

from dlmspec.cli import main

sys.exit(main())
