"""`python -m layerdiff`: the `layerdiff` command."""

from layerdiff._cli import run

run()
