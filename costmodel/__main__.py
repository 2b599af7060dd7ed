"""`python -m costmodel` runs the CLI, for GPU machines that run from a checkout."""

import sys

from costmodel.cli import main

sys.exit(main())
