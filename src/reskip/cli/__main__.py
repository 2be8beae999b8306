"""`python -m reskip.cli`: the same as the `reskip` command."""

import sys

from . import main

sys.exit(main())
