"""`python -m portable_spec.cli ...` runs the `portable-spec` command."""

import sys

from .main import main

sys.exit(main())
