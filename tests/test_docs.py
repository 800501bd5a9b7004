"""Generated documentation stays in step with the code."""

import sys

from conftest import ROOT


def test_cli_reference_is_current():
    sys.path.insert(0, str(ROOT / "scripts"))
    from cli_reference import render

    committed = (ROOT / "docs" / "cli.md").read_text()
    assert committed == render(), "docs/cli.md is stale: run `make docs`"
