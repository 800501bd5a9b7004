"""Another release of ONNX Runtime or OpenVINO to compare against, fetched from PyPI into the
user's cache.

    python -m layerdiff.releases onnxruntime==1.30.0
    python -m layerdiff.releases openvino==2026.4.0

installs that release in a virtualenv of its own under layerdiff's cache folder
(`LAYERDIFF_CACHE_DIR`, else `~/.cache/layerdiff`), once, and prints the side that runs on it:

    ort:lib=/home/me/.cache/layerdiff/runtimes/onnxruntime-1.30.0/lib/python3.11/site-packages/onnxruntime/capi/libonnxruntime.so.1.30.0
    openvino:lib=/home/me/.cache/layerdiff/runtimes/openvino-2026.4.0/lib/python3.11/site-packages/openvino/libs/libopenvino_c.so.2640

Give it as `--reference` or `--target` (`layerdiff onnx model.onnx --target ort:lib=…`): that side
runs in a worker process on the release, and the report names both releases. An ONNX Runtime
release whose C API is older than the one this layerdiff asks for runs through the virtualenv's
own Python package; a newer one is loaded by layerdiff's worker itself. OpenVINO releases from
2025.1 on run in layerdiff's worker (an older one is refused there, by name). The folder is
written whole or not at all: a failed install leaves nothing behind to be mistaken for a
release."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

from layerdiff._cache import cache_folder

PACKAGES = ("onnxruntime", "onnxruntime-gpu", "openvino")

# each package's library in its virtualenv, and the runtime spelling that runs on it
LIBRARIES = {
    "onnxruntime": ("onnxruntime/capi/libonnxruntime.so.*", "ort"),
    "onnxruntime-gpu": ("onnxruntime/capi/libonnxruntime.so.*", "ort"),
    "openvino": ("openvino/libs/libopenvino_c.so.*", "openvino"),
}


class ReleaseError(Exception):
    """A release that cannot be fetched, with what to do."""


def parse(spec: str) -> tuple[str, str]:
    """`onnxruntime==1.30.0` → (`onnxruntime`, `1.30.0`); a version alone is `onnxruntime`'s
    (OpenVINO's versions are years: `openvino==2026.4.0`)."""
    package, _, version = spec.rpartition("==")
    package = package or "onnxruntime"
    if package not in PACKAGES or not re.fullmatch(r"\d+\.\d+(\.\d+)?", version):
        raise ReleaseError(
            f"`{spec}` is not a release: give PACKAGE==VERSION with PACKAGE one of "
            f"{', '.join(PACKAGES)} (`onnxruntime==1.30.0`)"
        )
    if package == "openvino" and tuple(int(p) for p in version.split(".")[:2]) < (2025, 1):
        # its C API's element types changed in 2025.1: layerdiff's binding refuses older ones
        raise ReleaseError(
            f"`{spec}`: layerdiff runs OpenVINO 2025.1 and later (the C API's element types "
            "changed then); give a newer release"
        )
    return package, version


def library_in(folder: Path, package: str = "onnxruntime") -> Path | None:
    """The runtime library of `package` in the virtualenv at `folder`, if it holds one."""
    found = sorted(folder.glob(f"lib/python*/site-packages/{LIBRARIES[package][0]}"))
    return found[-1] if found else None


def side(package: str, library: Path) -> str:
    """The `--reference`/`--target` spelling that runs on `library` (`ort:lib=…`)."""
    return f"{LIBRARIES[package][1]}:lib={library}"


def fetch(package: str, version: str, *, quiet: bool = False) -> Path:
    """The library of `package==version`, installed into the cache first where it is not there."""
    folder = cache_folder() / "runtimes" / f"{package}-{version}"
    library = library_in(folder, package)
    if library is not None:
        return library
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.with_name(f"{folder.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    say = (lambda _: None) if quiet else (lambda text: print(text, file=sys.stderr))
    say(f"installing {package}=={version} into {folder}")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(partial)], check=True,
                       capture_output=True, text=True)  # fmt: skip
        # ONNX Runtime releases before 1.19 were built against numpy 1
        older = package != "openvino" and tuple(int(p) for p in version.split(".")[:2]) < (1, 19)
        numpy = "numpy<2" if older else "numpy"
        python = partial / "bin" / "python"
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             f"{package}=={version}", numpy],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
    except subprocess.CalledProcessError as e:
        shutil.rmtree(partial, ignore_errors=True)
        words = (e.stderr or e.stdout or "").strip().splitlines()[-3:]
        raise ReleaseError(
            f"cannot install {package}=={version} for this Python "
            f"({sys.version_info.major}.{sys.version_info.minor}): {' / '.join(words)}"
        ) from None
    # a folder left without its library (removed by hand) gives way; one another run finished
    # meanwhile stands, and this copy goes
    if folder.exists() and library_in(folder, package) is None:
        shutil.rmtree(folder, ignore_errors=True)
    try:
        partial.rename(folder)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
    library = library_in(folder, package)
    if library is None:
        shutil.rmtree(folder, ignore_errors=True)
        raise ReleaseError(f"{package}=={version} installed no runtime library")
    return library


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m layerdiff.releases",
        description="Fetch an ONNX Runtime or OpenVINO release from PyPI into layerdiff's cache "
        "and print the side that runs on it (`ort:lib=…`, `openvino:lib=…`).",
    )
    parser.add_argument(
        "release", help="PACKAGE==VERSION, e.g. onnxruntime==1.30.0 or openvino==2026.4.0"
    )
    args = parser.parse_args(argv)
    try:
        package, version = parse(args.release)
        library = fetch(package, version)
    except ReleaseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(side(package, library))
    return 0


if __name__ == "__main__":
    sys.exit(main())
