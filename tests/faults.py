"""Faults injected into an ONNX file at one node, one per cause layerdiff names. Each helper
reads `src`, edits one node (found by its output value) and writes `dst`."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _edit(src, dst, edit):
    model = onnx.load(str(src))
    edit(model.graph)
    onnx.save(model, str(dst))
    return dst


def producer(graph, value):
    return next(n for n in graph.node if value in n.output)


def initializer(graph, name):
    return next(i for i in graph.initializer if i.name == name)


def _set_initializer(graph, name, array):
    init = initializer(graph, name)
    init.CopyFrom(numpy_helper.from_array(array.astype(numpy_helper.to_array(init).dtype), name))


def perturb_weight(src, dst, value, delta, filters=slice(0, 1)):
    """Adds `delta` to some output filters of the weight of the node producing `value`."""

    def edit(graph):
        name = producer(graph, value).input[1]
        weight = numpy_helper.to_array(initializer(graph, name)).copy()
        weight[filters] += delta
        _set_initializer(graph, name, weight)

    return _edit(src, dst, edit)


def scale_weight(src, dst, value, factor):
    """Multiplies the whole weight of the node producing `value` by `factor`."""

    def edit(graph):
        name = producer(graph, value).input[1]
        _set_initializer(graph, name, numpy_helper.to_array(initializer(graph, name)) * factor)

    return _edit(src, dst, edit)


def set_attribute(src, dst, value, name, new):
    """Sets attribute `name` of the node producing `value`."""

    def edit(graph):
        node = producer(graph, value)
        kept = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute(name, new)])

    return _edit(src, dst, edit)


def edited_norm(src, dst, index=2, epsilon=0.5):
    """Sets the `epsilon` of the `index`-th LayerNormalization; returns that node as edited."""
    norm = [n for n in onnx.load(str(src)).graph.node if n.op_type == "LayerNormalization"][index]
    set_attribute(src, dst, norm.output[0], "epsilon", epsilon)
    return producer(onnx.load(str(dst)).graph, norm.output[0])


def in_float16(src, dst, value):
    """Runs the node producing `value` in float16: its inputs cast down, its weights stored in
    float16, its output cast back to float32 under the same name. The casts carry the node's
    metadata (its PyTorch scope), as a converter that keeps metadata writes them."""

    def edit(graph):
        node = producer(graph, value)
        position = list(graph.node).index(node)
        casts = []
        for k, name in enumerate(node.input):
            if not name:
                continue
            inits = [i for i in graph.initializer if i.name == name]
            if inits:
                half = numpy_helper.from_array(
                    numpy_helper.to_array(inits[0]).astype(np.float16), f"{name}_fp16"
                )
                graph.initializer.append(half)
                node.input[k] = half.name
            else:
                casts.append(
                    helper.make_node(
                        "Cast", [name], [f"{name}_fp16"], to=TensorProto.FLOAT16,
                        name=f"{node.name}_cast_in{k}",
                    )
                )  # fmt: skip
                node.input[k] = f"{name}_fp16"
        node.output[0] = f"{value}_fp16"
        back = helper.make_node(
            "Cast", [node.output[0]], [value], to=TensorProto.FLOAT, name=f"{node.name}_cast_out"
        )
        for cast in [*casts, back]:
            cast.metadata_props.extend(node.metadata_props)
        for k, new in enumerate([*casts, node, back]):
            if k == len(casts):
                graph.node.remove(node)
            graph.node.insert(position + k, new)

    return _edit(src, dst, edit)


def add_noise(src, dst, value, scale):
    """Adds fresh uniform noise in [-scale, scale] to `value` on every run (an unseeded
    RandomUniformLike: the node disagrees with itself from run to run). The new nodes carry the
    node's metadata, so the noise belongs to the same PyTorch layer."""

    def edit(graph):
        node = producer(graph, value)
        raw = f"{value}_raw"
        node.output[0] = raw
        position = list(graph.node).index(node)
        noise = helper.make_node(
            "RandomUniformLike", [raw], [f"{value}_noise"], low=-scale, high=scale,
            name=f"{node.name}_noise",
        )  # fmt: skip
        add = helper.make_node("Add", [raw, f"{value}_noise"], [value], name=f"{node.name}_add")
        for new in (noise, add):
            new.metadata_props.extend(node.metadata_props)  # the node's PyTorch scope
        graph.node.insert(position + 1, noise)
        graph.node.insert(position + 2, add)

    return _edit(src, dst, edit)


def _with_cache(graph, prefix: str):
    """Nodes computing, in int64, 1 where the cache the file is given holds tokens, else 0 (the
    length of the first cache input, `past_key_values_0_key`, above zero): a fault multiplied
    by it is in the cached path only, never in the prefill."""
    past = next(i.name for i in graph.input if i.name.startswith("past_key_values_0_key"))
    for name, value in ((f"{prefix}_two", 2), (f"{prefix}_zero", 0), (f"{prefix}_one", 1)):
        graph.initializer.append(numpy_helper.from_array(np.array(value, dtype=np.int64), name))
    return [
        helper.make_node("Shape", [past], [f"{prefix}_shape"]),
        helper.make_node("Gather", [f"{prefix}_shape", f"{prefix}_two"], [f"{prefix}_len"], axis=0),
        helper.make_node("Greater", [f"{prefix}_len", f"{prefix}_zero"], [f"{prefix}_has"]),
        helper.make_node("Cast", [f"{prefix}_has"], [f"{prefix}_cached"], to=TensorProto.INT64),
    ]


def _feed(graph, nodes, graph_input: str, replaced: str):
    """Every reader of `graph_input` reads `replaced` instead, made by `nodes` put first."""
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name == graph_input:
                node.input[k] = replaced
    for k, node in enumerate(nodes):
        graph.node.insert(k, node)


def positions_off_with_cache(src, dst):
    """A decoder's file whose position ids are one too far where it is given a cache: the
    rotary table is read for the wrong positions at every step after the prefill."""

    def edit(graph):
        nodes = _with_cache(graph, "po")
        nodes.append(helper.make_node("Add", ["position_ids", "po_cached"], ["po_positions"]))
        _feed(graph, nodes, "position_ids", "po_positions")

    return _edit(src, dst, edit)


def mask_short_with_cache(src, dst):
    """A decoder's file whose attention mask loses its first position where it is given a
    cache (a mask one token short, padded): the first token is hidden at every step after
    the prefill."""

    def edit(graph):
        nodes = _with_cache(graph, "ms")
        nodes += [
            helper.make_node("Shape", ["attention_mask"], ["ms_mask_shape"]),
            helper.make_node("Gather", ["ms_mask_shape", "ms_one"], ["ms_mask_len"], axis=0),
            helper.make_node("Range", ["ms_zero", "ms_mask_len", "ms_one"], ["ms_range"]),
            helper.make_node("Equal", ["ms_range", "ms_zero"], ["ms_first"]),
            helper.make_node("Cast", ["ms_first"], ["ms_first_i"], to=TensorProto.INT64),
            helper.make_node("Mul", ["ms_first_i", "ms_cached"], ["ms_drop"]),
            helper.make_node("Sub", ["ms_one", "ms_drop"], ["ms_keep"]),
            helper.make_node("Mul", ["attention_mask", "ms_keep"], ["ms_mask"]),
        ]
        _feed(graph, nodes, "attention_mask", "ms_mask")

    return _edit(src, dst, edit)
