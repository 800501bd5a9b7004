"""Regenerates docs/images/model-explorer-node-data.png: the float16 overflow example
(tests/builders/overflow.py) compared with `--node-data`, opened in Model Explorer with its ONNX
adapter, every layer expanded, photographed by headless chromium (WebGL through SwiftShader).

Model Explorer is not a dependency of layerdiff; install it into any environment first:

    python -m venv /tmp/me && /tmp/me/bin/pip install model-explorer-onnx
    .venv/bin/python scripts/node_data_screenshot.py /tmp/me/bin/model-explorer
"""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from browser import Browser, find_chromium  # noqa: E402

OUT = ROOT / "docs" / "images" / "model-explorer-node-data.png"
PORT = 8097


def main(model_explorer: str) -> None:
    work = Path(tempfile.mkdtemp())
    subprocess.run(
        [sys.executable, "-m", "layerdiff", "torch", f"{ROOT}/tests/builders/overflow.py:build",
         "--dtype", "fp16", "--out", str(work), "-q"],
        check=False,
    )  # fmt: skip
    server = subprocess.Popen(
        [model_explorer, str(work / "model.fp16.onnx"),
         f"--node_data_paths={work / 'report.node-data.json'}",
         "--extensions=model_explorer_onnx", "--no_open_in_browser", f"--port={PORT}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        url = None
        for line in server.stdout:
            found = re.search(rf"http://localhost:{PORT}/\S+", line)
            if found:
                url = found.group(0)
                break
        if url is None:
            sys.exit("Model Explorer did not start")
        flags = ("--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--ignore-gpu-blocklist")
        browser = Browser(find_chromium(), Path(tempfile.mkdtemp()), flags)
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": False},
        )
        browser.call("Page.navigate", {"url": url})
        time.sleep(20)
        browser.evaluate(
            "Array.from(document.querySelectorAll('mat-icon'))"
            ".find(e => e.textContent.trim() == 'unfold_more_double').parentElement.click()"
        )
        time.sleep(3)
        shot = browser.call("Page.captureScreenshot", {"format": "png"})
        browser.close()
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_bytes(base64.b64decode(shot["data"]))
        print(f"wrote {OUT.relative_to(ROOT)}")
    finally:
        server.terminate()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "model-explorer")
