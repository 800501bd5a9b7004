"""Generated documentation stays in step with the code."""

import sys

from conftest import ROOT


def test_cli_reference_is_current():
    sys.path.insert(0, str(ROOT / "scripts"))
    from cli_reference import render

    committed = (ROOT / "docs" / "cli.md").read_text()
    assert committed == render(), "docs/cli.md is stale: run `make docs`"


def test_the_example_report_reproduces_here(tmp_path):
    """`make pipeline` on another CPU rewrote the committed report while the README called the
    JSON deterministic. What holds everywhere: the same layers, pairings, statuses and verdict,
    and every difference within the layer's tolerance of the committed one; on the machine it
    was made on (the same `machine` record and side versions), the same bytes."""
    import json

    from conftest import run_cli

    committed_path = ROOT / "examples" / "reports" / "resnet18_fp32.json"
    committed = json.loads(committed_path.read_text())
    fresh_path = tmp_path / "r.json"
    result = run_cli("torch", "resnet18", "--seed", "0", "--json", str(fresh_path), "-q")
    assert result.returncode in (0, 1), result.stderr
    fresh = json.loads(fresh_path.read_text())
    same = lambda key: [(x["name"], x["status"], x["location"]) for x in key["layers"]]  # noqa: E731
    assert same(fresh) == same(committed)
    for key in ("layers_total", "layers_compared", "drift_origin", "inconclusive"):
        assert fresh["summary"][key] == committed["summary"][key], key
    for now, then in zip(fresh["layers"], committed["layers"], strict=True):
        if then["accumulated"] is not None:
            diff = abs(now["accumulated"]["max_abs_diff"] - then["accumulated"]["max_abs_diff"])
            assert diff <= then["tolerance"]["atol"], now["name"]
    if fresh["machine"] == committed["machine"] and all(
        fresh[side] == committed[side] for side in ("reference", "target")
    ):
        assert fresh_path.read_bytes() == committed_path.read_bytes(), "run `make pipeline`"


def test_the_results_table_matches_the_committed_reports():
    sys.path.insert(0, str(ROOT / "scripts"))
    from reports import END, START, table

    results = (ROOT / "docs" / "results.md").read_text()
    committed = results.split(START, 1)[1].split(END, 1)[0]
    assert committed == "\n" + table(), "the table in docs/results.md is stale: run `make reports`"


def test_every_relative_link_of_the_readme_and_the_docs_resolves():
    """A page moved or renamed leaves no dead link behind (anchors are not checked)."""
    import re

    dead = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                dead.append(f"{page.relative_to(ROOT)} → {target}")
    assert not dead, dead


def test_every_file_docs_design_names_exists():
    """docs/design.md says where each thing lives: a file or folder it names that was moved or
    renamed fails here. Names are relative to the repository, to `crates/`, to a crate's `src/`
    or to the Python package, as the page's tables give them."""
    import re

    roots = [ROOT, ROOT / "crates", ROOT / "python", ROOT / "python" / "layerdiff"]
    roots += sorted(ROOT.glob("crates/*/src"))
    text = (ROOT / "docs" / "design.md").read_text()
    named = set(re.findall(r"`([\w.-]+(?:/[\w.-]+)*(?:\.(?:rs|py|md|toml)|/))`", text))
    named = {n for n in named if "/" in n or n.endswith((".rs", ".py"))}
    assert len(named) > 40, sorted(named)  # the tables were read
    missing = sorted(n for n in named if not any((r / n).exists() for r in roots))
    assert not missing, f"docs/design.md names what is not there: {missing}"


def test_the_flow_crate_has_no_import_circle():
    """scripts/import_graph.py: parts of crates/layerdiff-flow/src/ that use each other. The
    engine knows the sides only through its traits, the ONNX library no verb, and a verb no
    verb but those it runs; a new circle fails here."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from import_graph import circles, edges

    graph = edges()
    assert {"engine", "onnx", "verbs::onnx", "sides::graph", "spec::target"} <= set(graph)
    assert graph["verbs::reduce"] == {"onnx"}, graph["verbs::reduce"]
    assert not any(p.startswith("sides") for p in graph["engine"]), graph["engine"]
    assert circles(graph) == []


def test_no_file_names_one_that_names_it():
    """scripts/file_graph.py: the files of every crate that name an item of each other (a file
    and its own submodules aside). Each such pair is one concept cut in two; every crate is
    held to none."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from file_graph import file_circles

    found = file_circles()
    assert found == [], found


def test_no_file_or_function_is_longer_than_design_md_allows():
    """docs/design.md ("Keeping it readable"): no source file over 500 lines, no function over
    120, but the one exception it names and argues for."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from house_sizes import long_files, long_functions

    assert long_files(500) == []
    exceptions = [(path, name) for path, name, _ in long_functions(120)]
    assert exceptions == [("crates/layerdiff-core/src/compare/avx2.rs", "block")], exceptions
    assert (
        "`block` (`crates/layerdiff-core/src/compare/avx2.rs`)"
        in (ROOT / "docs" / "design.md").read_text()
    )
