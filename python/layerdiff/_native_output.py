"""What native libraries print (TensorFlow's converter, TFLite's delegate notice, oneDNN):
written to the process's own file descriptors, past Python's `sys.stdout` and `sys.stderr`, so
only a redirect of the descriptors keeps it off the user's terminal."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile


@contextlib.contextmanager
def held_back(printed: list[str] | None = None):
    """Runs the block with file descriptors 1 and 2 going to a temporary file; what was
    written there is appended to `printed` (when given) for an error to quote."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            if printed is not None:
                sink.seek(0)
                printed.append(sink.read().decode(errors="replace"))
