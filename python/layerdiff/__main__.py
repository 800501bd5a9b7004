"""`python -m layerdiff`: the `layerdiff` command."""

import sys

from layerdiff._cli import main

sys.exit(main())
