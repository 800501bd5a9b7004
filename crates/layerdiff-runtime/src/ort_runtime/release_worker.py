"""A worker for an ONNX Runtime release that layerdiff cannot load in a process of its own.

layerdiff's binding asks ONNX Runtime's C API for the version it was built against; a release
older than that answers nothing. Such a release runs in its own Python package instead: layerdiff
starts this script with the release's interpreter (`PYTHON -c SCRIPT ARGS`, from the virtualenv
`scripts/ort_release.py` makes), and it answers the requests of layerdiff's isolated sides
(crates/layerdiff-runtime/src/isolated/wire.rs) as `layerdiff __worker` does: a frame is a JSON
header and the blobs it announces, each preceded by its length as 8 little-endian bytes.

ARGS: --provider NAME --spelling SPELLING --opt LEVEL [--option KEY=VALUE]... [--without NAME]...
      [--custom-ops PATH]... [--threads N] [--as-saved]

Sessions are made as layerdiff makes them: the optimization level, the optimizers disabled at it,
the provider and its options, custom-op libraries, external data read from the model's folder.
Only numpy and the release's onnxruntime are imported."""

import json
import os
import signal
import struct
import sys

DTYPES = {
    "float64": "float64", "float32": "float32", "float16": "float16", "int64": "int64",
    "int32": "int32", "int16": "int16", "int8": "int8", "uint64": "uint64", "uint32": "uint32",
    "uint16": "uint16", "uint8": "uint8", "bool": "bool",
}  # fmt: skip
LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
          "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}  # fmt: skip


class Failed(Exception):
    """A request the runtime refused: its kind, as the wire names it."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def arguments(argv):
    args = {"provider": "CPUExecutionProvider", "spelling": "cpu", "opt": "disable", "option": [],
            "without": [], "custom_ops": [], "threads": None, "as_saved": False}  # fmt: skip
    it = iter(argv)
    for flag in it:
        if flag == "--as-saved":
            args["as_saved"] = True
            continue
        key = flag.removeprefix("--").replace("-", "_")
        if key not in args:
            raise SystemExit(f"error: a release worker does not take {flag}")
        value = next(it)
        if isinstance(args[key], list):
            args[key].append(value)
        else:
            args[key] = value
    return args


def read_exact(stream, n):
    data = stream.read(n)
    if len(data) != n:
        raise EOFError
    return data


def blob(stream):
    (n,) = struct.unpack("<Q", read_exact(stream, 8))
    return read_exact(stream, n)


def header(stream):
    first = stream.read(8)
    if not first:
        return None
    if len(first) != 8:
        raise EOFError
    (n,) = struct.unpack("<Q", first)
    return json.loads(read_exact(stream, n))


def send(stream, head, blobs):
    text = json.dumps(head).encode()
    stream.write(struct.pack("<Q", len(text)) + text)
    for b in blobs:
        stream.write(struct.pack("<Q", len(b)))
        stream.write(b)
    stream.flush()


def tensors_out(np, names, arrays):
    heads, blobs = [], []
    for name, array in zip(names, arrays, strict=True):
        array = np.ascontiguousarray(array)
        dtype = "bool" if array.dtype == np.bool_ else array.dtype.name
        if dtype not in DTYPES:
            raise Failed("run", f"output `{name}` is {array.dtype}, which layerdiff does not read")
        heads.append({"name": name, "dtype": dtype, "shape": list(array.shape)})
        blobs.append(array.tobytes())
    return heads, blobs


def session(ort, args, model, base_dir, optimized_into=None):
    options = ort.SessionOptions()
    level = "disable" if args["as_saved"] else args["opt"]
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    if args["without"] and level != "disable":
        options.add_session_config_entry(
            "optimization.disable_specified_optimizers", ";".join(args["without"])
        )
    if args["threads"]:
        options.intra_op_num_threads = int(args["threads"])
    for library in args["custom_ops"]:
        try:
            options.register_custom_ops_library(library)
        except Exception as e:
            raise Failed("custom_ops", f"ONNX Runtime cannot load the custom-op library "
                                       f"`{library}`: {e}") from e  # fmt: skip
    if base_dir:
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", base_dir
        )
    if optimized_into:
        options.optimized_model_filepath = optimized_into
    provider_options = dict(o.split("=", 1) for o in args["option"])
    providers = [(args["provider"], provider_options)]
    if args["provider"] != "CPUExecutionProvider":
        if args["provider"] not in ort.get_available_providers():
            raise Failed("provider_unavailable", f"{args['provider']} is not in this build of "
                                                 f"ONNX Runtime {ort.__version__}")  # fmt: skip
        providers.append("CPUExecutionProvider")
    try:
        return ort.InferenceSession(model, options, providers=providers)
    except Exception as e:
        raise Failed("session", str(e)) from e


def answer(np, ort, args, request, model, inputs):
    what = request.get("do")
    base_dir = request.get("base_dir")
    if what == "run":
        outputs = request.get("outputs") or []
        keep = request.get("twice")
        s = session(ort, args, model, base_dir)
        try:
            runs = [s.run(outputs, inputs)]
            if keep is not None:
                runs = [runs[0], s.run(outputs, inputs)]
                pairs = (zip(outputs, r, strict=True) for r in runs)
                runs = [[(n, a) for n, a in pair if n in keep] for pair in pairs]
            else:
                runs = [list(zip(outputs, runs[0], strict=True))]
        except Exception as e:
            raise Failed("run", str(e)) from e
        heads, blobs = [], []
        for run in runs:
            h, b = tensors_out(np, [n for n, _ in run], [a for _, a in run])
            heads.append(h)
            blobs.extend(b)
        return {"runs": heads}, blobs
    if what == "optimize":
        into = os.path.join(request["into"], "optimized.onnx")
        if args["opt"] == "disable" or args["as_saved"]:
            return {"optimized": False}, []
        session(ort, args, model, base_dir, optimized_into=into)
        return {"optimized": os.path.exists(into)}, []
    if what == "placement":
        return {"nodes": []}, []
    raise Failed("other", f"a request the worker does not know: {what!r}")


def main(argv):
    args = arguments(argv)
    # The answers' own channel: a copy of standard output, which then points at standard error,
    # so that what the runtime prints cannot break the answers. The command that started the
    # worker decides when it stops.
    sys.stdout.flush()
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import numpy as np
    import onnxruntime as ort

    requests = sys.stdin.buffer
    while True:
        try:
            request = header(requests)
            if request is None:
                return 0
            model = blob(requests)
            heads = request.get("inputs") or []
            raw = [(h, blob(requests)) for h in heads]
        except EOFError:
            return 3
        try:
            inputs = {}
            for h, data in raw:
                dtype = DTYPES.get(h["dtype"])
                if dtype is None:
                    raise Failed("inputs", f"input `{h['name']}`: ONNX Runtime's Python API "
                                           f"takes no {h['dtype']} array")  # fmt: skip
                inputs[h["name"]] = np.frombuffer(data, dtype=dtype).reshape(h["shape"])
            head, blobs = answer(np, ort, args, request, model, inputs)
        except Failed as e:
            head, blobs = {"error": {"kind": e.kind, "message": str(e)}}, []
            if e.kind == "provider_unavailable":
                head["error"]["provider"] = args["spelling"]
        except Exception as e:  # noqa: BLE001 - every failure goes back as an answer
            head, blobs = {"error": {"kind": "other", "message": f"{type(e).__name__}: {e}"}}, []
        try:
            send(answers, head, blobs)
        except BrokenPipeError:
            return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
