"""`python -m mlxcel ...` is `mlxcel ...`."""

import sys

from mlxcel.cli import main

sys.exit(main())
