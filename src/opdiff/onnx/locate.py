"""Is the first failing node wrong itself, or does it only inherit error? Run it alone and see.

    check = check_node_locally(target_model, t_index, "/fc1/Gemm_output_0", feeds_from_golden,
                               golden_value, target_tensors, options, MsitPolicy())
    check.local_error      # True: the node is wrong on the golden's own inputs
    check.sentence         # what to tell the user

The node is cut out of the target model as a one-node graph (its initializers kept), fed the
golden's values of its inputs (cast to the target's dtypes) and run with the target's runtime
options. This is msit's `-single` idea without a vendor compiler.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .deps import OnnxError, require
from .graph import GraphIndex
from .msit_csv import msit_values
from .policy import MsitPolicy
from .runner import RuntimeOptions, make_session, run_session
from ..comparison.result import ERROR

log = logging.getLogger("opdiff")


@dataclass
class LocalCheck:
    node: str
    local_error: Optional[bool]        # None when the node could not be run alone
    sentence: str
    metrics: dict = field(default_factory=dict)            # msit's column names (onnx_details.json)
    fed_from_target: list = field(default_factory=list)   # inputs with no golden value


def check_node_locally(model, t: GraphIndex, tensor: str, golden_inputs: dict, golden_value: np.ndarray,
                       target_tensors: dict, options: RuntimeOptions,
                       policy: MsitPolicy) -> LocalCheck:
    """Run the target node that writes `tensor` on golden inputs; compare with `golden_value`.

    golden_inputs: {target tensor name: golden array} for the node's inputs that have a golden
    counterpart; the others are fed the target's own values (and listed in fed_from_target).
    """
    onnx, _ = require()
    node = t.producer.get(tensor)
    if node is None:
        return LocalCheck(tensor, None, f"'{tensor}' is not written by a node; nothing to run alone")
    name = t.display_name(node)
    feeds: dict = {}
    inputs: list = []
    inits: list = []
    fed_from_target: list = []
    for x in node.input:
        if not x or x in feeds or any(i.name == x for i in inits):
            continue
        if x in t.initializers:
            inits.append(t.initializers[x])
            continue
        own = target_tensors.get(x)
        value = golden_inputs.get(x)
        if value is None:
            value = own
            fed_from_target.append(x)
        elif own is not None:
            value = np.asarray(value).astype(own.dtype).reshape(own.shape)
        if value is None:
            return LocalCheck(name, None, f"input '{x}' of {name} was not dumped; cannot run it alone")
        feeds[x] = value
        elem = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
        inputs.append(onnx.helper.make_tensor_value_info(x, elem, list(value.shape)))
    outputs = [onnx.ValueInfoProto(name=o) for o in node.output if o]
    for o in outputs:
        if o.name in target_tensors:
            elem = onnx.helper.np_dtype_to_tensor_dtype(target_tensors[o.name].dtype)
            o.CopyFrom(onnx.helper.make_tensor_value_info(o.name, elem, None))
    graph = onnx.helper.make_graph([node], f"opdiff_local_{name}", inputs, outputs, initializer=inits)
    single = onnx.helper.make_model(graph, opset_imports=list(model.opset_import))
    single.ir_version = model.ir_version
    try:
        value = run_session(make_session(single, options), feeds, [tensor])[tensor]
    except OnnxError as exc:
        log.info("opdiff: running %s alone failed: %s", name, exc)
        return LocalCheck(name, None, f"{name} could not be run alone ({exc})", fed_from_target=fed_from_target)
    m, verdict = policy.judge_arrays(value, golden_value)
    metrics = {**m.metrics, **m.extra} if m is not None else {}
    cos, red = metrics.get("Cosine"), metrics.get("RelEuclideanDistance")
    shown = f"cosine {cos:.6g}, RED {red:.3g}" \
        if cos is not None and not np.isnan(cos) and red is not None else verdict.reason
    if verdict.result == ERROR and fed_from_target:
        # (it ran on the target's own values of those inputs: failing tells nothing about it)
        return LocalCheck(name, None, (
            f"{name} could not be checked alone: input(s) {', '.join(fed_from_target)} have no "
            f"golden value (with --torch the PyTorch side has module outputs only), so it ran on "
            f"the target's own values and still fails ({shown}); whether the error is made by "
            f"this node or carried in by those inputs cannot be told"),
            msit_values(metrics), fed_from_target)
    if verdict.result == ERROR:
        sentence = (f"run alone on the golden's inputs, {name} still fails ({shown}): "
                    f"the error is made by this node itself")
    else:
        sentence = (f"run alone on the golden's inputs, {name} agrees with the golden ({shown}): "
                    f"it only inherits error from its inputs (accumulated error)")
    if fed_from_target:
        sentence += f"; input(s) {', '.join(fed_from_target)} had no golden value and kept the target's"
    return LocalCheck(name, verdict.result == ERROR, sentence, msit_values(metrics), fed_from_target)
