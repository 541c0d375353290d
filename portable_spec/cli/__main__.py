"""`python -m portable_spec.cli ...` runs the `portable-spec` command."""

import sys

from portable_spec.cli.main import main

sys.exit(main())
