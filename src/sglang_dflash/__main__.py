"""`python -m sglang_dflash` is the same as the `sglang-dflash` console script."""

import sys

from sglang_dflash.cli import main

sys.exit(main())
