"""python -m converters.cli …, the same as the `compressor` command."""

import sys

from converters.cli import main

sys.exit(main())
