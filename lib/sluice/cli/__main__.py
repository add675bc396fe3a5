"""``python -m sluice.cli``: the ``sluice`` command without the console script."""

import sys

from sluice.cli.app import main

sys.exit(main())
