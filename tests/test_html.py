"""The HTML report and its chart, opened in a real headless browser (Debian's chromium): the page
renders without a console error and without asking the network for anything, the chart has a
point per compared layer and marks the drift origin, the table sorts and filters, and `--out`
writes the page and the chart beside the JSON."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

import pytest
from browser import Browser, find_chromium
from conftest import ROOT, run_cli

torch = pytest.importorskip("torch")

import layerdiff  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def drifting(resnet18, tmp_path_factory):
    """ResNet-18 against itself in bfloat16: rounding born at the first convolution, with causes."""
    model, inputs, _ = resnet18
    report = layerdiff.compare_torch(model, inputs, target="torch:bf16")
    folder = tmp_path_factory.mktemp("html")
    report.write(json=folder / "r.json", html=folder / "r.html", svg=folder / "r.svg")
    return report, folder


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = find_chromium()
    if chromium is None:
        message = "chromium is not installed (`make browser` installs Debian's)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    b = Browser(chromium, tmp_path_factory.mktemp("profile"))
    yield b
    b.close()


def test_the_page_renders_offline_without_console_errors(drifting, browser):
    report, folder = drifting
    browser.open(folder / "r.html")
    title = browser.evaluate("document.title")
    assert title == "layerdiff: " + report.data["model"]
    verdict = browser.evaluate("document.getElementById('verdict').textContent")
    assert verdict.startswith("bfloat16 rounding only: no layer computes differently"), verdict
    assert f"born at {report.drift_origin}" in verdict
    assert browser.problems() == []
    page = (folder / "r.html").resolve().as_uri()
    assert [url for url in browser.requests() if url != page] == []


def test_the_chart_has_a_point_per_compared_layer_and_marks_the_origin(drifting, browser):
    report, folder = drifting
    browser.open(folder / "r.html")
    points = browser.evaluate("document.querySelectorAll('#chart g.point').length")
    judged = [x for x in report.layers if x["accumulated"] or x["local"]]
    assert points == len(judged) == report.summary["layers_compared"]
    origin = browser.evaluate("document.querySelector('#chart line.origin + text').textContent")
    assert origin == f"drift born at {report.drift_origin}"
    # drawn, not just present: the chart takes real space on the page
    width = browser.evaluate("document.querySelector('#chart svg').getBoundingClientRect().width")
    assert width > 500
    # a point leads to its row of the table
    href = browser.evaluate("document.querySelector('#chart a').getAttribute('href')")
    assert browser.evaluate(f"document.querySelector('{href}') !== null")


def test_the_chart_plots_own_error_against_what_precision_explains(drifting, browser):
    """Rounding only: every layer's own error sits under the defect line of the second panel,
    however far its errors pass the tolerance in the first."""
    report, folder = drifting
    browser.open(folder / "r.html")
    own = browser.evaluate(
        "Array.from(document.querySelectorAll('#chart rect.own')).map(r => r.getAttribute('fill'))"
    )
    held = [x for x in report.layers if x.get("baseline")]
    assert len(own) == len(held) > 10
    assert set(own) == {"#2e7d32"}, "a rounding-only run has no point beyond the defect line"
    assert report.summary["layers_exceeding"] > 10


def test_alike_causes_are_said_once_with_the_others_named(drifting, browser):
    report, folder = drifting
    browser.open(folder / "r.html")
    items = browser.evaluate("document.querySelectorAll('#causes > li').length")
    caused = [x for x in report.layers if x.get("cause") and x["cause"] != "inherited"]
    assert 0 < items < len(caused) / 4, (items, len(caused))
    named = browser.evaluate(
        "Array.from(document.querySelectorAll('#causes a code')).map(c => c.textContent)"
    )
    assert sorted(named) == sorted(x["name"] for x in caused)


def column(browser, index: int) -> list[str]:
    return browser.evaluate(
        "Array.from(document.querySelectorAll('#layers tbody tr'))"
        f".filter(r => !r.hidden).map(r => r.cells[{index}].getAttribute('data-v'))"
    )


def test_the_table_sorts_by_a_column_both_ways(drifting, browser):
    report, folder = drifting
    browser.open(folder / "r.html")
    heads = browser.evaluate(
        "Array.from(document.querySelectorAll('#layers thead th')).map(h => h.textContent)"
    )
    i = heads.index("max abs diff")
    assert [int(v) for v in column(browser, 0)] == list(range(len(report.layers)))
    click = f"document.querySelectorAll('#layers thead th')[{i}].click()"
    browser.evaluate(click)
    ascending = [float(v) for v in column(browser, i)]
    assert ascending == sorted(ascending) and ascending[0] < ascending[-1]
    browser.evaluate(click)
    descending = [float(v) for v in column(browser, i)]
    assert descending == sorted(ascending, reverse=True)
    worst = max(report.layers, key=lambda x: x["accumulated"]["max_abs_diff"])
    first = browser.evaluate("document.querySelector('#layers tbody tr').id")
    assert first == f"layer-{worst['index']}"
    assert browser.problems() == []


def test_the_table_filters_by_text_and_by_verdict(drifting, browser):
    report, folder = drifting
    browser.open(folder / "r.html")
    browser.evaluate(
        "const w = document.getElementById('which'); w.value = 'exceeds';"
        "w.dispatchEvent(new Event('change'))"
    )
    exceeding = [x for x in report.layers if x["exceeds_tol"] or x["local_exceeds"]]
    assert len(column(browser, 0)) == len(exceeding)
    browser.evaluate(
        "const f = document.getElementById('filter'); f.value = 'layer3.1';"
        "f.dispatchEvent(new Event('input'))"
    )
    shown = [int(v) for v in column(browser, 0)]
    assert shown and all("layer3.1" in report.layers[i]["name"] for i in shown)
    assert browser.evaluate("document.getElementById('shown').textContent") == (
        f"{len(shown)} of {len(report.layers)} layers"
    )


def test_the_svg_chart_stands_alone(drifting):
    report, folder = drifting
    svg = ET.parse(folder / "r.svg").getroot()
    assert svg.tag == SVG + "svg"
    assert svg.find(f"{SVG}a") is None  # no links to a table that is not there
    texts = [t.text for t in svg.iter(SVG + "text")]
    assert f"drift born at {report.drift_origin}" in texts and "tolerance" in texts
    assert (folder / "r.svg").read_text() == report.to_svg()


def test_out_writes_the_page_and_the_chart_beside_the_json(tmp_path):
    out = tmp_path / "run"
    result = run_cli("torch", f"{ROOT}/tests/builders/seed_mlp.py:build", "--out", str(out), "-q")
    assert result.returncode == 0, result.stderr
    assert {p.name for p in out.iterdir()} >= {"report.json", "report.html", "report.svg"}
    page = (out / "report.html").read_text()
    assert (
        page.startswith("<!DOCTYPE html>")
        and "<script" in page
        and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    )
    assert json.loads((out / "report.json").read_text())["summary"]["drift_origin"] is None
    assert 'class="verdict clean"' in page
