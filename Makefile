# layerdiff: two commands set up a fresh machine.
#   make pipeline   environment, release build, the ResNet-18 flow, its reports in run/resnet18/
#   make test       environment, build, Rust tests, Python tests
#   make test-all   make test, then the tests that repeat at random at their thorough settings (CI)
# Both are idempotent: the virtualenv is created once, requirements reinstalled only when
# requirements.txt changes, and cargo rebuilds only what changed.

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
DEPS := $(VENV)/.requirements.stamp
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: pipeline test test-all build env browser proto lint clean docs golden conformance kernel-swap bench mapping validation reports fuzz calibrate ort-release openvino-release

env: $(DEPS)

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(DEPS): requirements.txt | $(PY)
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

# The extension and the package, built in release mode and installed (editable) into .venv: one
# abi3 extension for every Python from 3.10 on (a per-version one left by an older build would
# be imported before it, so it goes).
build: $(DEPS)
	rm -f python/layerdiff/_layerdiff.cpython-*.so
	maturin develop --release --quiet

# The run is this machine's: it goes to run/resnet18/ (every report format), never over the
# committed examples/reports/ (`make reports` rewrites those), so `make test` after it compares
# nothing machine-dependent with committed bytes.
pipeline: build
	layerdiff torch resnet18 --seed 0 --out run/resnet18 \
		|| test $$? -eq 1  # exit 1 means drift was found and reported

# Debian's chromium, which the HTML report's browser test (tests/test_html.py) opens headless.
browser:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || \
	      { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; }; \
	  else \
	    echo "note: chromium is missing and installing it needs root and apt-get: the browser test will be skipped"; \
	  fi; }

# The Rust tests build in release mode: they reuse the dependencies `build` compiled (a debug
# build of them all, tract and ONNX Runtime's bindings among them, took minutes of a fresh
# 2-core machine), and they run faster. The Python tests run in TEST_JOBS processes (one per
# core, at most 4: each holds PyTorch), a test file per process at a time so its module
# fixtures are built once.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))

test: build browser
	cargo test --workspace --release --quiet
	cargo build --workspace --release --quiet --bins  # the binary tests/conftest.py's rust_exe runs
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile
	$(PY) -m pytest -q -n $(TEST_JOBS) tests/test_keras.py tests/test_keras_twin.py  # TensorFlow in processes of their own (tests/conftest.py)

# `make test`, then what it leaves out (LAYERDIFF_TEST_ALL=1): the random-moment interrupt
# tests at 20 runs, not 6, and the slow end-to-end runs marked `thorough`, whose every path a
# faster test covers too (torch.compile of every ResNet-18 leaf, ViT-B/16 whole, ...): what CI
# runs (.ci/run).
test-all: test
	LAYERDIFF_TEST_ALL=1 $(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile tests/test_interrupt.py
	LAYERDIFF_TEST_ALL=1 $(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile -m thorough

# Every fuzz target for FUZZ_SECONDS (default 600) each, FUZZ_JOBS at a time (scripts/fuzz.sh):
# needs the nightly toolchain and cargo-fuzz, which it installs when missing. What it keeps is
# checked in under fuzz/corpus/; `make test` replays that and fuzz/regressions/ in seconds.
fuzz: $(DEPS)
	@rustup toolchain list | grep -q nightly || rustup toolchain install nightly --profile minimal
	@command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
	scripts/fuzz.sh

# Regenerate the checked-in prost code from the vendored onnx-ml.proto.
proto:
	cargo run --quiet --manifest-path tools/onnx-codegen/Cargo.toml
	cargo fmt --all

lint: $(DEPS)
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings
	$(VENV)/bin/ruff check python tests benches fuzz crates/layerdiff-runtime/src/ort_runtime
	$(VENV)/bin/ruff format --check python tests benches fuzz crates/layerdiff-runtime/src/ort_runtime

clean:
	cargo clean
	rm -rf $(VENV)

# Regenerate docs/cli.md from the command's --help (tests check it is current).
docs: build
	$(PY) scripts/cli_reference.py

# Rewrite the engine's golden report (crates/layerdiff-flow/tests/golden/), after a change to
# what reports say that is meant.
golden:
	LAYERDIFF_BLESS=1 cargo test --release --quiet -p layerdiff-flow --test engine golden

# Run the ONNX backend node tests through layerdiff and rewrite docs/conformance.md.
conformance: build
	$(PY) scripts/conformance.py

# Which kernel carries a LayerNormalization → MatMul discrepancy (examples/kernel_swap/).
kernel-swap: $(DEPS)
	cargo run --release --quiet -p layerdiff-runtime --example kernel_swap > examples/kernel_swap/results.md
	@echo "wrote examples/kernel_swap/results.md"

# The validation suite's examples (examples/validation/): the op matrix on this machine's
# backends, and the execution-provider table and op audit of ResNet-50 and a GPT-2 decoder.
validation: build
	$(PY) scripts/validation_examples.py

# Measure the comparator (GB/s per dtype against numpy and the machine's read bandwidth) and
# the per-phase overhead on ResNet-18 and ViT-B/16; rewrites docs/performance.md.
bench: build
	$(PY) benches/run.py

# Another ONNX Runtime release from PyPI into layerdiff's cache, for a side `ort:lib=…`
# (docs/onnx.md): `make ort-release VERSION=1.30.0` prints the side to give.
ort-release: build
	@test -n "$(VERSION)" || { echo "error: give the release, e.g. make ort-release VERSION=1.30.0" >&2; exit 2; }
	$(PY) -m layerdiff.releases onnxruntime==$(VERSION)

# The same for OpenVINO (`openvino:lib=…`): `make openvino-release VERSION=2026.4.0`.
openvino-release: build
	@test -n "$(VERSION)" || { echo "error: give the release, e.g. make openvino-release VERSION=2026.4.0" >&2; exit 2; }
	$(PY) -m layerdiff.releases openvino==$(VERSION)

# The defect-or-precision rule on every built-in model (forward, float16 and bfloat16; gradients
# in bfloat16 and float16) and on planted faults; rewrites the calibration table in
# docs/metrics.md and fails on a defect in a clean run or a fault not found where it is.
calibrate: build
	$(PY) scripts/calibrate_baseline.py

# Map real architectures (transformers, torchvision, timm) through both exporters; rewrites
# docs/mapping.md.
mapping: build
	$(PY) scripts/mapping_matrix.py

# Every built-in model against its export at float32, converted to float16, and PyTorch in
# bfloat16; the batch axis of ResNet-50 and the GPT-2 decoder; the summary table in docs/results.md
# (examples/reports/).
reports: build
	$(PY) scripts/reports.py
