"""Rewrites an ONNX file as an exporter that records no module scope would write it: node names
`node_N`, no node metadata, intermediate values `v_N` (inputs, outputs and weights keep their
names). Used to show that layers are still paired, by their values."""

import onnx


def strip_scopes(src, dst) -> None:
    model = onnx.load(str(src))
    graph = model.graph
    keep = {i.name for i in graph.input} | {o.name for o in graph.output}
    keep |= {t.name for t in graph.initializer}
    renamed: dict[str, str] = {}
    for k, node in enumerate(graph.node):
        node.name = f"node_{k}"
        del node.metadata_props[:]
        for j, out in enumerate(node.output):
            if out and out not in keep:
                renamed[out] = f"v_{k}_{j}"
                node.output[j] = renamed[out]
        for j, name in enumerate(node.input):
            node.input[j] = renamed.get(name, name)
    del graph.value_info[:]
    onnx.save(model, str(dst))
