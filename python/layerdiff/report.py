"""The report object returned by every comparison: a thin view over the Rust report."""

from __future__ import annotations

import html
import json
from functools import cached_property
from pathlib import Path


class Report:
    """A finished comparison. Drift is data here; only the CLI turns it into an exit code."""

    def __init__(self, native, inputs: list | None = None):
        self._native = native
        #: The exact inputs both sides were given, as flat `(name, dtype, shape, bytes)` tuples.
        self.inputs = inputs or []
        #: Lines about how the run went that are not findings (how it was split to bound memory).
        self.notes: list[str] = []
        #: The ONNX file the target ran, where the comparison had one (a PyTorch model against
        #: its export): what a repro is cut from.
        self.onnx_path: Path | None = None

    @cached_property
    def data(self) -> dict:
        """The whole report as plain Python data (the parsed JSON)."""
        return json.loads(self._native.to_json())

    @property
    def drift_origin(self) -> str | None:
        """The layer the headline names: the first defect (or undecided layer), else where the
        precision drift is born."""
        return self._native.drift_origin

    @property
    def first_exceeding(self) -> str | None:
        """The first layer, in execution order, whose accumulated error exceeds its tolerance."""
        return self.summary["first_exceeding"]

    @property
    def layers(self) -> list[dict]:
        """Every layer in execution order, with its ONNX value, statistics and verdict."""
        return self.data["layers"]

    @property
    def summary(self) -> dict:
        """Counts, drift origin and worst layers."""
        return self.data["summary"]

    @property
    def target_graph(self) -> dict | None:
        """When the target runtime optimized the model first: the graph that ran, how many
        values survived it and whether exposing them left the model outputs bit-identical."""
        return self.data.get("target_graph")

    @property
    def truth(self) -> dict | None:
        """What computed the float64 truth both sides are measured against (`runtime`,
        `detail`), when one ran."""
        return self.data.get("truth")

    @property
    def tolerance(self) -> dict:
        """The tolerance policy: `{"policy": "per_dtype"|"fixed"|"auto", "abs", "factor"}`; each
        layer's own tolerance is in its `tolerance` field."""
        return self.data["tolerance"]

    @property
    def exit_code(self) -> int:
        """The CLI's exit code under ``--fail-on defect`` (the default): 0 when no layer
        exceeds its tolerance or the drift is rounding only, 1 on a defect, an undecided cause,
        an inconclusive run or values that overflow to ±Inf."""
        return self._native.exit_code

    def layer(self, name: str) -> dict:
        """One layer by name (`layer1.0.relu#2`)."""
        for layer in self.layers:
            if layer["name"] == name:
                return layer
        raise KeyError(name)

    def to_node_data(self) -> str:
        """Each ONNX node's own error against its tolerance, as Model Explorer node data."""
        return self._native.to_node_data()

    def warned(self, warnings: list[str]) -> Report:
        """This report with `warnings` added to its summary."""
        return self._with(self._native.warned(warnings)) if warnings else self

    def advised(self, precision: str) -> Report:
        """This report with keep-in-float32 advice for a target computing in `precision`."""
        return self._with(self._native.advised(precision))

    def advised_by_module(self, owners: dict[str, str]) -> Report:
        """This report with its keep-in-float32 advice by module (`owners`: each gradient's
        module): what can run its backward in float32, where the layers are gradients."""
        return self._with(self._native.advised_by_module(owners))

    def layers_to_check(self, given: list[str]) -> list[str]:
        """The layers this lower-precision run checks by running again with them in float32:
        ``given`` (the user's), else those this report advises."""
        return self._native.layers_to_check(list(given))

    def advice_checked(self, with_kept: Report, kept: list[str], given: bool, precision: str):
        """The report of a lower-precision run with its keep-in-float32 advice checked, this
        report being the plain run and ``with_kept`` the run with ``kept`` in float32 (``given``:
        the user named them); what was said of either run (a bisection's note) still holds."""
        native = self._native.advice_checked(with_kept._native, kept, given, precision)
        report = (with_kept if given else self)._with(native)  # the run the core reported
        report.notes[:0] = [n for n in self.notes if n not in report.notes]
        return report

    def _with(self, native) -> Report:
        report = Report(native, inputs=self.inputs)
        report.notes = list(self.notes)
        report.onnx_path = self.onnx_path
        return report

    def to_json(self) -> str:
        """Deterministic JSON (same input, same bytes)."""
        return self._native.to_json()

    def to_markdown(self) -> str:
        return self._native.to_markdown()

    def to_html(self) -> str:
        """One self-contained HTML page: summary, error chart, sortable per-layer table, causes."""
        return self._native.to_html()

    def to_svg(self) -> str:
        """The error chart (each layer's error against its tolerance, log scale) as SVG."""
        return self._native.to_svg()

    def _repr_html_(self) -> str:
        # Jupyter shows the summary and the chart inline.
        return f"<pre>{html.escape(self.summary_text())}</pre>{self._native.to_svg()}"

    def summary_text(self) -> str:
        return self._native.summary_text()

    def timings_text(self) -> str:
        """The phase-by-phase breakdown (needs ``timings=True``)."""
        return self._native.timings_text()

    def write(
        self,
        json: str | Path | None = None,
        markdown: str | Path | None = None,
        html: str | Path | None = None,
        svg: str | Path | None = None,
        node_data: str | Path | None = None,
    ) -> list[Path]:
        """Write the reports given a path (JSON, Markdown, HTML, the chart as SVG, Model Explorer
        node data); each file is written whole or not at all."""
        return [Path(p) for p in self._native.write(json, markdown, html, svg, node_data)]

    def __str__(self) -> str:
        """The summary the command prints: ``print(report)`` reads as the CLI does."""
        return self.summary_text().rstrip("\n")

    def __repr__(self) -> str:
        s = self.summary
        return (
            f"<layerdiff.Report {self.data['model']!r}: {s['layers_compared']} layers compared, "
            f"{s['layers_exceeding']} exceeding, drift_origin={self.drift_origin!r}>"
        )
