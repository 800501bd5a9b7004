"""Another release of ONNX Runtime or OpenVINO to compare against, fetched from PyPI (or installed
from its wheel file) into the user's cache.

    python -m layerdiff.releases onnxruntime==1.30.0
    python -m layerdiff.releases openvino==2026.4.0
    python -m layerdiff.releases ./onnxruntime-1.30.0-cp311-cp311-manylinux_2_27_x86_64.whl

installs that release in a virtualenv of its own under layerdiff's cache folder
(`LAYERDIFF_CACHE_DIR`, else `~/.cache/layerdiff`), once, and prints the side that runs on it:

    ort:lib=/home/me/.cache/layerdiff/runtimes/onnxruntime-1.30.0/lib/python3.11/site-packages/onnxruntime/capi/libonnxruntime.so.1.30.0
    openvino:lib=/home/me/.cache/layerdiff/runtimes/openvino-2026.4.0/lib/python3.11/site-packages/openvino/libs/libopenvino_c.so.2640

A release comes from the package index (PyPI); on a machine without one, give the wheel file of
the release, fetched where there is one (`pip download onnxruntime==1.30.0 --no-deps -d .`): it is
installed as it is, its Python dependencies (numpy) taken from this environment.

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

from layerdiff import _layerdiff
from layerdiff._cache import cache_folder


class ReleaseError(Exception):
    """A release that cannot be fetched, with what to do."""


def parse(spec: str) -> tuple[str, str]:
    """`onnxruntime==1.30.0` → (`onnxruntime`, `1.30.0`); a version alone is `onnxruntime`'s
    (OpenVINO's versions are years: `openvino==2026.4.0`). Which packages ship a runtime and
    which of their versions layerdiff runs is each runtime's own word (its `Wheel`, in Rust)."""
    try:
        return _layerdiff.parse_release(spec)
    except _layerdiff.UsageError as e:
        raise ReleaseError(str(e)) from None


def wheel(given: str) -> tuple[str, str]:
    """The package and version of a release's wheel file, from its name (`onnxruntime_gpu-1.31.1-
    cp311-cp311-manylinux_2_27_x86_64.whl` → (`onnxruntime-gpu`, `1.31.1`))."""
    path = Path(given)
    if not path.is_file():
        raise ReleaseError(
            f"`{given}` does not exist: give a release's wheel file, or PACKAGE==VERSION"
        )
    parts = path.name.removesuffix(".whl").split("-")
    if not path.name.endswith(".whl") or len(parts) < 5:
        raise ReleaseError(
            f"`{given}` is not a wheel file (NAME-VERSION-PYTHON-ABI-PLATFORM.whl): give the "
            "release's wheel, as `pip download onnxruntime==1.30.0 --no-deps` fetches it"
        )
    package = parts[0].lower().replace("_", "-")
    return parse(f"{package}=={parts[1]}")


def library_in(folder: Path, package: str = "onnxruntime") -> Path | None:
    """The runtime library of `package` in the virtualenv at `folder`, if it holds one."""
    library = _layerdiff.release_wheel(package).library
    found = sorted(folder.glob(f"lib/python*/site-packages/{library}"))
    return found[-1] if found else None


def side(package: str, library: Path) -> str:
    """The `--reference`/`--target` spelling that runs on `library` (`ort:lib=…`)."""
    return f"{_layerdiff.release_wheel(package).runtime}:lib={library}"


def fetch(package: str, version: str, *, quiet: bool = False, wheel: Path | None = None) -> Path:
    """The library of `package==version`, installed into the cache first where it is not there:
    from the package index, or from its `wheel` file (no index needed)."""
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
        python = partial / "bin" / "python"
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        if wheel is not None:
            # as it is, offline: its Python dependencies are this environment's
            subprocess.run([*pip, "--no-index", "--no-deps", str(wheel.resolve())],
                           check=True, capture_output=True, text=True)  # fmt: skip
            _share_numpy(partial)
        else:
            # what an older release needs beside it (ONNX Runtime before 1.19: numpy 1)
            needs = _layerdiff.release_wheel(package).needs(version)
            subprocess.run([*pip, f"{package}=={version}", "numpy", *needs],
                           check=True, capture_output=True, text=True)  # fmt: skip
    except subprocess.CalledProcessError as e:
        shutil.rmtree(partial, ignore_errors=True)
        raise ReleaseError(_why_not_installed(package, version, e, wheel)) from None
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


#: What pip says when it cannot reach the package index.
_UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
    r"resolution|Name or service not known|Network is unreachable|No route to host|"
    r"Could not fetch URL|ProxyError|ConnectTimeout|ReadTimeout|Max retries exceeded"
)


def _why_not_installed(package: str, version: str, e, wheel: Path | None) -> str:
    """Why pip could not install the release, and what to do."""
    said = f"{e.stderr or ''}\n{e.stdout or ''}"
    words = " / ".join(said.strip().splitlines()[-2:])
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if wheel is not None:
        return f"cannot install `{wheel}` for this Python ({python}): {words}"
    import platform

    kind = f"{platform.system()} {platform.machine()}, Python {python}"
    fetch_wheel = (
        f"\nhint: a release comes from the package index; on a machine without one, fetch its "
        f"wheel on a machine of this kind ({kind}) that has it (`pip download "
        f"{package}=={version} --no-deps --only-binary=:all: -d .`) and give the file: "
        f"`python -m layerdiff.releases ./{package.replace('-', '_')}-{version}-….whl`"
    )
    if _UNREACHABLE.search(said):
        errno = re.search(r"\[Errno -?\d+\][^'\")]*", said)
        return (
            f"cannot fetch {package}=={version}: the package index cannot be reached from this "
            f"machine{f' ({errno.group(0).strip()})' if errno else ''}{fetch_wheel}"
        )
    if "(from versions: none)" in said:
        return (
            f"cannot fetch {package}=={version}: the package index offers no build of "
            f"{package} pip can install here (this Python is {python}; an index it cannot reach "
            f"offers none either){fetch_wheel}"
        )
    return f"cannot install {package}=={version} for this Python ({python}): {words}"


def _share_numpy(venv: Path) -> None:
    """This environment's packages (numpy, above all) after the virtualenv's own, for a release
    installed from its wheel without its dependencies."""
    import numpy

    site = next(venv.glob("lib/python*/site-packages"))
    (site / "layerdiff-shared.pth").write_text(f"{Path(numpy.__file__).parent.parent}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m layerdiff.releases",
        description="Fetch an ONNX Runtime or OpenVINO release from PyPI into layerdiff's cache "
        "and print the side that runs on it (`ort:lib=…`, `openvino:lib=…`).",
    )
    parser.add_argument(
        "release",
        help="PACKAGE==VERSION, e.g. onnxruntime==1.30.0 or openvino==2026.4.0; or the release's "
        "wheel file, on a machine without the package index",
    )
    args = parser.parse_args(argv)
    try:
        if args.release.endswith(".whl") or Path(args.release).is_file():
            package, version = wheel(args.release)
            library = fetch(package, version, wheel=Path(args.release))
        else:
            package, version = parse(args.release)
            library = fetch(package, version)
    except ReleaseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(side(package, library))
    return 0


if __name__ == "__main__":
    sys.exit(main())
