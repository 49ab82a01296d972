"""Pair golden and target tensors of two ONNX graphs by name, through the renames converters make.

    matching = match_graphs(GraphIndex(golden), GraphIndex(target), golden_run.tensors, target_run.tensors)
    for pair in matching.pairs: pair.golden, pair.target, pair.rule
    matching.unmatched_golden, matching.unmatched_target      # [(tensor, reason)]

Layers, tried in order for every golden tensor (never by position):

1. QDQ: the target holds `X_DequantizeLinear_Output` (what the next op really reads).
   When the golden X is a ReLU/Clip output and the target's X is written by something else,
   the quantizer folded the activation into QuantizeLinear: the target's X is the
   *pre-activation* value and only the dequantized tensor compares.
2. The exact name, unless the two tensors mean different things (the folded activation above,
   or a BatchNorm that the target folded into the Conv that writes X).
3. `X_QuantizeLinear_Input`: the quantizer renamed a value that feeds a graph output's Q/DQ.

Tensors inside a region the target fused away have no counterpart; they are reported as
unmatched with the reason, and the region is compared at its boundary.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..store.schema import Location, Role
from .graph import GraphIndex

ACTIVATIONS = ("Relu", "Clip")
QDQ_SUFFIXES = ("_DequantizeLinear_Output", "_DequantizeLinear_Output_1")

RULE_NAME = "name"
RULE_DEQUANTIZED = "dequantized (QDQ)"
RULE_FOLDED_ACTIVATION = "activation folded into QuantizeLinear"
RULE_PRE_QUANTIZE = "value before QuantizeLinear"
RULE_BATCHNORM = "BatchNorm folded into Conv"
RULE_TORCH = "exporter metadata"


@dataclass(frozen=True)
class TensorPair:
    """One golden tensor and the target tensor that holds the same value."""
    golden: str
    target: str
    rule: str                 # one of the RULE_* names: how the pair was found
    role: str                 # a store.schema.Role
    order: int                # position in golden topological order (inputs: -1)
    golden_node: Optional[str] = None
    golden_op: str = ""
    module: Optional[str] = None   # PyTorch module path, when known
    location: Optional[Location] = None   # the user's source line, when the exporter recorded it


@dataclass
class Matching:
    pairs: list = field(default_factory=list)
    unmatched_golden: list = field(default_factory=list)   # [(tensor, reason)]
    unmatched_target: list = field(default_factory=list)

    def rules(self) -> dict:
        counts: dict = {}
        for p in self.pairs:
            counts[p.rule] = counts.get(p.rule, 0) + 1
        return counts


def golden_tensors(g: GraphIndex, available) -> list:
    """(tensor, role, order, node) for every golden tensor worth comparing, in topological order."""
    out = [(name, Role.INPUT, -1, None) for name in g.inputs if name in available]
    seen = set(g.inputs)
    for node in g.nodes:
        pos = g.position(node)
        for name in node.input:
            if name in g.initializers and name not in seen and name in available:
                seen.add(name)
                out.append((name, Role.PARAMETERS, pos, node))
        for name in node.output:
            if name and name not in seen and name in available:
                seen.add(name)
                out.append((name, Role.PARAMETERS if node.op_type == "Constant" else Role.OUTPUT, pos, node))
    return out


def match_graphs(g: GraphIndex, t: GraphIndex, golden_available, target_available) -> Matching:
    """Pair every golden tensor with a target tensor (see the module docstring for the rules)."""
    matching = Matching()
    redirect, folded_away = _batchnorm_folds(g, t, target_available)
    used = set()
    for name, role, order, node in golden_tensors(g, golden_available):
        node_name = g.display_name(node) if node is not None and name not in g.initializers else None
        op = "Input" if role == Role.INPUT else "Initializer" if name in g.initializers else node.op_type
        module = g.module_of(node) if node is not None else None
        location = g.location_of(node) if node is not None else None

        # called at once, in this iteration: the loop's names are the ones meant
        def pair(target: str, rule: str):
            used.add(target)
            matching.pairs.append(TensorPair(name, target, rule, role, order, node_name, op,  # noqa: B023
                                              module, location))  # noqa: B023

        if name in redirect:
            pair(redirect[name], RULE_BATCHNORM)
            continue
        if name in folded_away:
            matching.unmatched_golden.append((name, "the target folded the following BatchNorm into "
                                                    "this Conv; compared after the BatchNorm"))
            continue
        if role == Role.INPUT and name in target_available:
            pair(name, RULE_NAME)
            continue
        folded_activation = (g.producer_op(name) in ACTIVATIONS and name in t.producer
                             and t.producer_op(name) not in ACTIVATIONS + ("DequantizeLinear",))
        dequantized = next((name + s for s in QDQ_SUFFIXES if name + s in target_available), None)
        if dequantized:
            pair(dequantized, RULE_FOLDED_ACTIVATION if folded_activation else RULE_DEQUANTIZED)
        elif folded_activation:
            matching.unmatched_golden.append((name, f"the target's '{name}' is written by "
                                                    f"{t.producer_op(name)} (activation folded away) "
                                                    f"and has no dequantized output"))
        elif name in target_available:
            pair(name, RULE_NAME)
        elif name + "_QuantizeLinear_Input" in target_available:
            pair(name + "_QuantizeLinear_Input", RULE_PRE_QUANTIZE)
        else:
            matching.unmatched_golden.append((name, _why_missing(g, name, matching)))
    matching.unmatched_target = _unmatched_target(t, g, target_available, used)
    return matching


def _batchnorm_folds(g: GraphIndex, t: GraphIndex, target_available):
    """Golden Conv -> BatchNorm chains whose BatchNorm the target folded into the Conv.

    Returns ({golden BN output: target Conv output}, {golden Conv outputs with no counterpart}).
    """
    redirect, folded = {}, set()
    for x, users in g.consumers.items():
        if g.producer_op(x) != "Conv" or len(users) != 1 or users[0].op_type != "BatchNormalization":
            continue
        y = users[0].output[0]
        if x in target_available and t.producer_op(x) == "Conv" and y not in target_available \
                and not any(u.op_type == "BatchNormalization" for u in t.consumers.get(x, [])):
            redirect[y] = x
            folded.add(x)
    return redirect, folded


def _why_missing(g: GraphIndex, name: str, matching: Matching) -> str:
    users = g.consumers.get(name, [])
    if users and all(u.op_type in ACTIVATIONS for u in users):
        return "fused with the following activation in the target; compared at the activation's output"
    return "no tensor of this name in the target (fused or renamed by the conversion)"


def _unmatched_target(t: GraphIndex, g: GraphIndex, available, used) -> list:
    out = []
    for node in t.nodes:
        for name in node.output:
            if not name or name in used or name not in available:
                continue
            if node.op_type == "QuantizeLinear":
                reason = "quantized (integer) representation; compared after DequantizeLinear"
            elif node.op_type == "DequantizeLinear" and all(i in t.initializers for i in node.input):
                reason = "dequantized constant with no float counterpart of this name"
            elif name in g.producer and g.producer_op(name) in ACTIVATIONS:
                reason = f"pre-activation value written by {node.op_type}: the quantizer folded the " \
                         f"golden's {g.producer_op(name)} into QuantizeLinear"
            elif any(name + s in used for s in QDQ_SUFFIXES) or \
                    (name.endswith("_QuantizeLinear_Input") and name[:-len("_QuantizeLinear_Input")] in used):
                reason = "value before QuantizeLinear; its dequantized copy is the one compared"
            elif name.endswith(QDQ_SUFFIXES) and node.op_type == "DequantizeLinear":
                reason = "dequantized copy of a tensor compared under its own name"
            else:
                reason = "no golden tensor of this name"
            out.append((name, reason))
    return out
