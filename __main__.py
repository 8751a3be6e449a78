"""`python -m mlxcel ...` is `mlxcel ...`."""

import sys

from mlxcel.cli.main import main

sys.exit(main())
