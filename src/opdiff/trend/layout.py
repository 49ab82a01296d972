"""Where each column of a stream sits in the order a training step computes it.

    slots = causal_order(stream)     # [Slot], forward first, then backward, gradients, optimizer
    slots[0].column, slots[0].phase, slots[0].label     # "embed:fwd_norm", "forward", ...

Within a step: modules in the order they returned in the forward, then the loss; modules in the
order their gradients arrived in the backward; parameter gradients (last layer first) and the
global gradient norm; then what optimizer.step() produced: updates, optimizer state, parameters.
The first place two runs part, or inf/NaN appears, is the first slot in this order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..monitor.stream import split_column

PHASES = ("forward", "backward", "parameters", "optimizer")

QUANTITY_LABELS = {
    "fwd_norm": "forward output norm",
    "fwd_max": "forward output max |x|",
    "fwd_nan": "NaN in the forward output",
    "fwd_inf": "inf in the forward output",
    "bwd_norm": "output gradient norm",
    "bwd_nan": "NaN in the output gradient",
    "bwd_inf": "inf in the output gradient",
    "norm": "parameter norm",
    "grad_norm": "gradient norm",
    "update_norm": "update norm",
    "loss": "loss",
}
COUNT_QUANTITIES = ("fwd_nan", "fwd_inf", "bwd_nan", "bwd_inf")
# Not numbers of the model: never a divergence or an alert.
IGNORED_COLUMNS = ("step_time", "loss_scale", "lr")


def quantity_label(quantity: str) -> str:
    if quantity in QUANTITY_LABELS:
        return QUANTITY_LABELS[quantity]
    if quantity.endswith("_norm"):
        return f"optimizer state {quantity[:-5]} norm"
    return quantity


@dataclass(frozen=True)
class Slot:
    """One column placed in the step's causal order."""

    column: str
    name: str               # module, parameter, "loss" or "grad_norm"
    quantity: str
    phase: str
    position: int

    @property
    def label(self) -> str:
        if self.name == "grad_norm" and self.quantity == "grad_norm" and self.column == "grad_norm":
            return "global gradient norm"
        return quantity_label(self.quantity)

    @property
    def is_count(self) -> bool:
        return self.quantity in COUNT_QUANTITIES

    @property
    def module(self) -> str:
        """What a user would call the place: the module, "loss", "optimizer", or a
        parameter's module for its gradient."""
        if self.phase == "optimizer":
            return "optimizer"
        if self.phase == "parameters" and self.column != "grad_norm":
            return self.name.rpartition(".")[0] or self.name
        return self.name


class AtSlot:
    """What a finding at one Slot (an Alert, a Departure) says of its place: its module and
    phase, and the summary.json fields every finding has."""

    step: int
    slot: Slot
    rank: int

    @property
    def module(self) -> str:
        return self.slot.module

    @property
    def phase(self) -> str:
        return self.slot.phase

    def place_dict(self, reason: str) -> dict:
        """{"step", "module", "quantity", "phase", "reason", "rank", "column"}."""
        return {"step": self.step, "module": self.module, "quantity": self.slot.label,
                "phase": self.phase, "reason": reason, "rank": self.rank,
                "column": self.slot.column}


def owning_module(parameter: str) -> str:
    return parameter.rpartition(".")[0]


def causal_order(stream) -> list:
    """Every column of `stream` that describes the model, as Slots in causal order."""
    by_name: dict = {}
    for col in stream.columns:
        name, quantity = split_column(col)
        if name is not None:
            by_name.setdefault(name, []).append(quantity)
    slots: list = []
    placed: set = set()

    def add(col: str, name: str, quantity: str, phase: str) -> None:
        if col in placed or not stream.has(col):
            return
        placed.add(col)
        slots.append(Slot(col, name, quantity, phase, len(slots)))

    modules = stream.modules
    for m in modules:
        for q in ("fwd_norm", "fwd_max", "fwd_nan", "fwd_inf"):
            add(f"{m}:{q}", m, q, "forward")
    add("loss", "loss", "loss", "forward")
    for m in stream.backward_order + modules[::-1]:
        for q in ("bwd_norm", "bwd_nan", "bwd_inf"):
            add(f"{m}:{q}", m, q, "backward")
    params = stream.parameters
    for p in params[::-1]:
        add(f"{p}:grad_norm", p, "grad_norm", "parameters")
    add("grad_norm", "grad_norm", "grad_norm", "parameters")
    for p in params:
        add(f"{p}:update_norm", p, "update_norm", "optimizer")
        for q in by_name.get(p, ()):
            if q.endswith("_norm") and q not in ("grad_norm", "update_norm"):
                add(f"{p}:{q}", p, q, "optimizer")
        add(f"{p}:norm", p, "norm", "optimizer")
    # Columns the meta does not place (a module first called later, a renamed parameter).
    for col in stream.columns:
        if col in placed or col in IGNORED_COLUMNS:
            continue
        name, quantity = split_column(col)
        if name is None:
            continue
        phase = ("forward" if quantity.startswith("fwd_") else
                 "backward" if quantity.startswith("bwd_") else
                 "parameters" if quantity == "grad_norm" else "optimizer")
        add(col, name, quantity, phase)
    return slots


def phase_rank(phase: str) -> int:
    return PHASES.index(phase) if phase in PHASES else len(PHASES)


def module_type(stream, name: str) -> Optional[str]:
    return stream.module_types.get(name)
