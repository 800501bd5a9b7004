"""A native library's start-up lines kept off the terminal: TensorFlow writes some to the
process's stderr (file descriptor 2) below Python as it loads, before its own log level is
read (`oneDNN custom operations are on` on CPUs with AVX-512, absl's note before it), and a
command's first lines should be its own."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

#: Lines TensorFlow writes as it loads, whatever TF_CPP_MIN_LOG_LEVEL says.
TENSORFLOW = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions",
    "Unable to register cuDNN factory",
    "Unable to register cuBLAS factory",
    "Unable to register cuFFT factory",
    "computation placer already registered",
    "could not find cuda drivers",
)


@contextlib.contextmanager
def dropped(patterns: tuple[str, ...] = TENSORFLOW):
    """Captures file descriptor 2 while the block runs and writes back what was written there,
    less the lines that hold one of `patterns`."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to keep clean
        yield
        return
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors="replace").splitlines(keepends=True)
            kept = [line for line in lines if not any(p in line for p in patterns)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
