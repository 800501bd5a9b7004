"""The op matrix's TensorFlow backends: `tf` (eager) and `xla` (`tf.function(jit_compile=True)`),
each case of `layerdiff.torch._op_cases` spelled with TensorFlow's own ops (Keras's, where Keras
is how TensorFlow users compute it: layer and RMS normalization).

They run in a process of their own, since TensorFlow and PyTorch's triton abort when both are
loaded: `python -m layerdiff.keras._op_calls DIR` reads `DIR/requests.json` (one request per
cell: case, PyTorch call, its keyword arguments and keyword inputs, dtype, backend, the key of
its inputs) and `DIR/inputs.npz` (each case's inputs, already rounded to the dtype, as float32),
and writes `DIR/results.npz` (each result widened to float32, exactly) and
`DIR/results.json` (its dtype and the roundings the spelling adds, or why there is none).

Values keep PyTorch's layouts: a convolution or a pooling is computed channels-last, as
TensorFlow's CPU kernels need, between exact transposes.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from layerdiff._native_chatter import dropped  # noqa: E402

with dropped():  # TensorFlow's start-up lines, written below Python as it loads
    import keras
    import tensorflow as tf
import numpy as np  # noqa: E402

DTYPES = {"float32": tf.float32, "float16": tf.float16, "bfloat16": tf.bfloat16}


def _nhwc(x):
    return tf.transpose(x, [0, 2, 3, 1])


def _nchw(x):
    return tf.transpose(x, [0, 3, 1, 2])


def _conv2d(x, w, stride=1, padding=0, **_):
    p = padding if isinstance(padding, int) else padding[0]
    x = tf.pad(_nhwc(x), [[0, 0], [p, p], [p, p], [0, 0]])
    y = tf.nn.conv2d(x, tf.transpose(w, [2, 3, 1, 0]), strides=stride, padding="VALID")
    return _nchw(y)


def _conv1d(x, w, stride=1, padding=0, **_):
    x = tf.pad(tf.transpose(x, [0, 2, 1]), [[0, 0], [padding, padding], [0, 0]])
    y = tf.nn.conv1d(x, tf.transpose(w, [2, 1, 0]), stride=stride, padding="VALID")
    return tf.transpose(y, [0, 2, 1])


def _max_pool2d(x, kernel_size, stride=None, padding=0, **_):
    x = tf.pad(_nhwc(x), [[0, 0], [padding] * 2, [padding] * 2, [0, 0]], constant_values=-math.inf)
    return _nchw(tf.nn.max_pool2d(x, kernel_size, stride or kernel_size, "VALID"))


def _avg_pool2d(x, kernel_size, stride=None, **_):
    return _nchw(tf.nn.avg_pool2d(_nhwc(x), kernel_size, stride or kernel_size, "VALID"))


def _interpolate(x, scale_factor, mode, align_corners=False, **_):
    if mode != "bilinear" or align_corners:
        raise NotImplementedError(f"interpolate mode {mode!r} is not spelled in TensorFlow here")
    h, w = x.shape[2], x.shape[3]
    size = (int(h * scale_factor), int(w * scale_factor))
    y = tf.image.resize(_nhwc(x), size, method="bilinear")  # half-pixel centres, as PyTorch's
    return tf.cast(_nchw(y), x.dtype)  # resize answers in float32


def _moments_norm(x, axes, weight=None, bias=None, eps=1e-5):
    mean, var = tf.nn.moments(x, axes=axes, keepdims=True)
    return tf.nn.batch_normalization(x, mean, var, bias, weight, eps)


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    # Keras's own (what `keras.layers.LayerNormalization` computes), not a user's composition
    axes = list(range(len(x.shape) - len(normalized_shape), len(x.shape)))
    return keras.ops.layer_normalization(x, weight, bias, axis=axes, epsilon=eps)


def _rms_norm(x, normalized_shape, weight=None, eps=1e-6):
    axes = list(range(len(x.shape) - len(normalized_shape), len(x.shape)))
    return keras.ops.rms_normalization(x, weight, axis=axes, epsilon=eps)


def _group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    n, c = x.shape[0], x.shape[1]
    grouped = tf.reshape(x, [n, num_groups, -1])
    y = tf.reshape(_moments_norm(grouped, [2], eps=eps), tf.shape(x))
    shape = [1, c] + [1] * (len(x.shape) - 2)
    if weight is not None:
        y = y * tf.reshape(weight, shape)
    if bias is not None:
        y = y + tf.reshape(bias, shape)
    return y


def _batch_norm(x, mean, var, weight=None, bias=None, eps=1e-5, **_):
    shape = [1, -1] + [1] * (len(x.shape) - 2)
    r = [None if t is None else tf.reshape(t, shape) for t in (mean, var, bias, weight)]
    return tf.nn.batch_normalization(x, *r, eps)


def _attention(q, k, v, is_causal=False):
    scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        n = scores.shape[-1]
        above = tf.cast(tf.linalg.band_part(tf.ones((n, n)), 0, -1) - tf.eye(n), tf.bool)
        scores = tf.where(above, tf.constant(-math.inf, scores.dtype), scores)
    return tf.matmul(tf.nn.softmax(scores, axis=-1), v)


def _gather(x, dim, index):
    return tf.gather(x, index, axis=dim, batch_dims=dim)


def _scatter(x, dim, index, src):
    if dim != len(x.shape) - 1 or len(x.shape) != 2:
        raise NotImplementedError("scatter is spelled in TensorFlow for the last of two dims")
    rows = tf.broadcast_to(tf.range(x.shape[0], dtype=index.dtype)[:, None], index.shape)
    return tf.tensor_scatter_nd_update(x, tf.stack([rows, index], -1), src)


def _reduce(fn):
    return lambda x, dim=None: fn(x, axis=dim)


# PyTorch call → the same computation in TensorFlow, on the case's inputs in PyTorch's order,
# with its keyword arguments (and keyword inputs) by name.
CALLS = {
    "torch.matmul": lambda a, b: tf.matmul(a, b),
    "torch.bmm": lambda a, b: tf.matmul(a, b),
    "torch.addmm": lambda c, a, b: c + tf.matmul(a, b),
    "F.linear": lambda x, w, b=None: tf.matmul(x, w, transpose_b=True) + (0 if b is None else b),
    "F.relu": tf.nn.relu,
    "F.gelu": lambda x, approximate="none": tf.nn.gelu(x, approximate=approximate == "tanh"),
    "F.silu": tf.nn.silu,
    "torch.sigmoid": tf.math.sigmoid,
    "torch.tanh": tf.math.tanh,
    "F.layer_norm": _layer_norm,
    "F.rms_norm": _rms_norm,
    "F.group_norm": _group_norm,
    "F.batch_norm": _batch_norm,
    "F.softmax": lambda x, dim: tf.nn.softmax(x, axis=dim),
    "F.log_softmax": lambda x, dim: tf.nn.log_softmax(x, axis=dim),
    "torch.sum": _reduce(tf.reduce_sum),
    "torch.mean": _reduce(tf.reduce_mean),
    "torch.amax": _reduce(tf.reduce_max),
    "torch.argmax": lambda x, dim: tf.math.argmax(x, axis=dim, output_type=tf.int64),
    "torch.cumsum": lambda x, dim: tf.math.cumsum(x, axis=dim),
    "torch.add": tf.math.add,
    "torch.mul": tf.math.multiply,
    "torch.div": tf.math.divide,
    "torch.pow": tf.math.pow,
    "torch.exp": tf.math.exp,
    "torch.log": tf.math.log,
    "torch.sqrt": tf.math.sqrt,
    "torch.rsqrt": tf.math.rsqrt,
    "F.embedding": lambda index, table: tf.gather(table, index),
    "torch.index_select": lambda x, dim, index: tf.gather(x, index, axis=dim),
    "torch.gather": _gather,
    "torch.scatter": _scatter,
    "torch.where": tf.where,
    "F.conv1d": _conv1d,
    "F.conv2d": _conv2d,
    "F.max_pool2d": _max_pool2d,
    "F.avg_pool2d": _avg_pool2d,
    "F.interpolate": _interpolate,
    "F.scaled_dot_product_attention": _attention,
}


# Intermediate results a spelling rounds to the dtype beyond the case's own `stages`, where
# TensorFlow has no single op for it: a product rounded before its bias is added (Keras's Dense
# does the same), a batch norm's scale and offset, the attention scores' scale.
EXTRA_STAGES = {
    "torch.addmm": 1,
    "F.linear": 1,
    "F.batch_norm": 4,
    "F.group_norm": 4,
    "F.scaled_dot_product_attention": 1,
}


def compute(request: dict, arrays: list[np.ndarray]) -> tf.Tensor:
    """One cell's result: the case's call in TensorFlow, eager or compiled by XLA."""
    fn = CALLS.get(request["call"])
    if fn is None:
        raise NotImplementedError(f"`{request['call']}` has no TensorFlow spelling in layerdiff")
    dtype = DTYPES[request["dtype"]]
    with tf.device("/CPU:0"):  # the backends are named for the CPU: a GPU build stays off its GPU
        values = [
            tf.cast(tf.constant(a), dtype) if a.dtype.kind == "f" else tf.constant(a)
            for a in arrays
        ]
    keywords = request["keywords"]
    split = len(values) - len(keywords)

    def run(*given):
        named = dict(zip(keywords, given[split:], strict=True))
        return fn(*given[:split], **named, **request["kwargs"])

    if request["backend"] == "xla":
        run = tf.function(run, jit_compile=True)
    with tf.device("/CPU:0"):
        return run(*values)


def serve(folder: Path) -> None:
    """Every request in `folder`, answered there."""
    requests = json.loads((folder / "requests.json").read_text())
    with np.load(folder / "inputs.npz") as stored:
        inputs = {key: stored[key] for key in stored.files}
    results, answers = {}, []
    for i, request in enumerate(requests):
        arrays = [inputs[f"{request['inputs']}.{k}"] for k in range(request["count"])]
        try:
            out = compute(request, arrays)
            if isinstance(out, (tuple, list)):
                out = out[0]
            name = out.dtype.name
            value = out.numpy()
            results[str(i)] = value.astype(np.float32) if out.dtype.is_floating else value
            answers.append({"dtype": name, "stages": EXTRA_STAGES.get(request["call"], 0)})
        except Exception as e:  # a backend's failure is the cell's finding
            answers.append({"error": f"{type(e).__name__}: {e}".strip().splitlines()[0][:2000]})
    np.savez(folder / "results.npz", **results)
    (folder / "results.json").write_text(json.dumps(answers))


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
