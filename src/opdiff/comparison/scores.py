"""From a compare's rows to what the blame rules judge: an op's score (`blame.OpScore`).

Written once, for both places that do it: the compare (`pair.py`), as it measures each tensor,
and `rejudge`, from the rows a compare saved.

    score = op_score(op_facts(row), op="Functional.linear", paired=True)
    add_row(score, index, row, measurement)     # an output, or an input (a leaf's origin kept)

The facts of an op (`OP_FACTS`) are the fields every row of its tensors carries besides the
tensor's own: its record name, phase, kind, position, module, call stack, number arguments
that differ, what a leaf record names, random generators' fingerprints.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from ..store.schema import Kind, Role
from .blame import OpScore
from .metric_table import Measurement
from .result import TensorRow

# The TensorRow fields that describe the row's op rather than its tensor.
OP_FACTS = ("op_name", "phase", "kind", "index", "module", "stack", "forward",
            "differing_numbers", "dtype_limits", "leaf", "leaf_tensor", "reader", "leaf_strict",
            "rng")

# (row index, measurement, target dtype, golden dtype): a measured tensor of an OpScore
Entry = tuple[int, Measurement, Optional[str], Optional[str]]


def op_facts(row: TensorRow) -> dict[str, Any]:
    """The facts of `row`'s op ({OP_FACTS name: value}), as every row of the op carries them."""
    return {name: getattr(row, name) for name in OP_FACTS}


def op_score(facts: Mapping[str, Any], *, op: str, paired: bool) -> OpScore:
    """The score of one op call, no tensor added yet (`add_row` adds them). facts: its
    `OP_FACTS` (`op_facts(row)`, or what the compare puts in each of the op's rows); op: the op
    ("Functional.linear"); paired: whether golden ran the op too (else replay alone judges it)."""
    stack = facts["stack"]
    return OpScore(name=facts["op_name"], op=op, phase=facts["phase"], kind=facts["kind"],
                   module=facts["module"], forward=facts["forward"], seq=facts["index"],
                   location=stack[0] if stack else None, paired=paired,
                   arg_diffs=list(facts["differing_numbers"]),
                   const_diffs=list(facts["dtype_limits"]), leaf=facts["leaf"],
                   fqn=facts["leaf_tensor"], reader=facts["reader"],
                   leaf_strict=facts["leaf_strict"], rng=tuple(facts["rng"]))


def counts_as_output(row: TensorRow) -> bool:
    """Whether the blame rules weigh `row` as an output of its op (a parameter's gradient is
    its op's output too), else as an input."""
    return row.role == Role.OUTPUT or (row.role == Role.PARAMETERS and row.kind == Kind.PARAM_GRAD)


def add_row(score: OpScore, index: int, row: TensorRow, m: Measurement) -> Entry:
    """Adds the measured row `index` (measured as `m`) to its op's score: among its outputs or
    its inputs, and an input that is a leaf with its origin (`TensorRow.leaf_input`). Returns
    the entry added."""
    entry: Entry = (index, m, row.target_dtype, row.golden_dtype)
    output = counts_as_output(row)
    (score.outputs if output else score.inputs).append(entry)
    if row.leaf_input and not output:
        score.leaf_inputs[index] = row.leaf_input
    return entry


__all__ = ["OP_FACTS", "Entry", "op_facts", "op_score", "counts_as_output", "add_row"]
