"""Make the exported controller graph's two parts skippable (export side; needs the ``onnx`` package).

The controller graph computes the text tower (token ids → ``text_emb``) and the head (embeddings, indices,
features → ``p_keep``, ``utility``). This rewrite puts each part inside an ``If`` node, so that one graph
serves three ways, with unchanged inputs and outputs:

- all inputs real: the whole decision in one run, as before;
- ``cand_idx`` empty (K = 0): the tower only; ``p_keep`` and ``utility`` come back empty;
- ``input_ids`` empty (N = 0): the head only, on embeddings passed as ``cached_emb``; ``text_emb`` is empty.

The Gate uses the last two to encode a decision's new texts as groups at once (one thread each) and then
run the head alone (metadata ``parts=tower,head``). The arithmetic of each part is unchanged. Export applies
this after dynamic quantisation, which does not quantise matrix products inside ``If`` branches.
"""

from __future__ import annotations

from branchgate.inference.metadata import PARTS  # noqa: F401  (the metadata value this rewrite earns)


def _ancestors(graph, outputs: list[str], stop: set[str]) -> set[int]:
    """Indices of the nodes that ``outputs`` depend on, not looking through tensors in ``stop``."""
    producer = {name: i for i, node in enumerate(graph.node) for name in node.output}
    needed, todo = set(), [n for n in outputs if n not in stop]
    while todo:
        name = todo.pop()
        i = producer.get(name)
        if i is None or i in needed:
            continue
        needed.add(i)
        node = graph.node[i]
        todo.extend(n for n in list(node.input) + _subgraph_inputs(node) if n and n not in stop)
    return needed


def _subgraph_inputs(node) -> list[str]:
    """Outer-scope names read by a node's subgraphs (none in the exported controller, kept for safety)."""
    names = []
    for attr in node.attribute:
        for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            for n in g.node:
                names.extend(n.input)
    return names


def _empty(name: str, shape: list[int], helper, TensorProto):
    """A node giving an empty float tensor of ``shape`` (one axis 0)."""
    return helper.make_node(
        "Constant", [], [name], value=helper.make_tensor(name + "_value", TensorProto.FLOAT, shape, [])
    )


def skippable_parts(
    model,
    dim: int,
    tower_input: str = "input_ids",
    tower_output: str = "text_emb",
    head_input: str = "cand_idx",
    head_outputs=("p_keep", "utility"),
):
    """Return a copy of ``model`` whose tower and head run only when ``tower_input`` / ``head_input`` have
    rows (see the module docstring); a skipped tower gives ``text_emb`` of shape [0, dim], a skipped head
    empty outputs. Raises ``ValueError`` when the graph is not split that way."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    outputs = {o.name: o for o in graph.output}
    missing = [n for n in (tower_output, *head_outputs) if n not in outputs]
    if missing:
        raise ValueError(f"graph has no output(s) {missing}")
    tower = _ancestors(graph, [tower_output], set())
    head = _ancestors(graph, list(head_outputs), {tower_output})
    shared = tower & head
    # Only constants may be shared: anything else would run in both parts or leak the tower into the head.
    if any(graph.node[i].op_type != "Constant" for i in shared):
        raise ValueError("tower and head share computed tensors; cannot separate them")
    uses = {}
    for i, node in enumerate(graph.node):
        for name in list(node.input) + _subgraph_inputs(node):
            uses.setdefault(name, set()).add(i)
    inits = {init.name: init for init in graph.initializer}

    def branch(name: str, members: set[int], outs: list[str]):
        nodes = [graph.node[i] for i in sorted(members - shared)]
        own = {n for n, users in uses.items() if n in inits and users <= members - shared}
        body = helper.make_graph(nodes, name, [], [outputs[o] for o in outs], [inits[n] for n in sorted(own)])
        return body, own

    def empty(name: str, shapes: dict[str, list[int]]):
        return helper.make_graph(
            [_empty(o, shape, helper, TensorProto) for o, shape in shapes.items()],
            name,
            [],
            [outputs[o] for o in shapes],
        )

    def condition(prefix: str, source: str) -> list:
        return [
            helper.make_node("Shape", [source], [f"{prefix}_rows"], start=0, end=1),
            helper.make_node(
                "Constant",
                [],
                [f"{prefix}_zero"],
                value=helper.make_tensor(f"{prefix}_zero_value", TensorProto.INT64, [1], [0]),
            ),
            helper.make_node("Greater", [f"{prefix}_rows", f"{prefix}_zero"], [f"{prefix}_run"]),
        ]

    tower_body, tower_own = branch("tower", tower, [tower_output])
    head_body, head_own = branch("head", head, list(head_outputs))
    nodes = [graph.node[i] for i in sorted(shared)]
    nodes += condition("parts_tower", tower_input)
    nodes.append(
        helper.make_node(
            "If",
            ["parts_tower_run"],
            [tower_output],
            name="tower_part",
            then_branch=tower_body,
            else_branch=empty("no_tower", {tower_output: [0, int(dim)]}),
        )
    )
    nodes += condition("parts_head", head_input)
    nodes.append(
        helper.make_node(
            "If",
            ["parts_head_run"],
            list(head_outputs),
            name="head_part",
            then_branch=head_body,
            else_branch=empty("no_head", {o: [0] for o in head_outputs}),
        )
    )
    keep = [init for init in graph.initializer if init.name not in tower_own | head_own and init.name in uses]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(keep)
    del graph.value_info[:]  # shape hints of tensors that now live inside the branches
    onnx.checker.check_model(model)
    return model
