"""A backward region's boundary through its forward calls' dataflow.

Backward records carry no dataflow of their own, but each names its forward call
(`"forward"`), and its tensors mirror that call's: a backward record's input j is the gradient
of its forward call's output j, its output i the gradient of the call's tensor argument i
(`capture/backward.py`). The forward dataflow then says where each gradient comes from and where
it goes. For a backward region (SDPA's backward against eager attention's matmul, softmax and
matmul backwards), with F the forward calls of its target ops:

- a gradient **entering** it is that of an output of F that ops outside F read: each such
  reader C hands its share back as its backward record's output (`C.backward.output.i`, i the
  argument C read the tensor as); every share is measured there, and the region's input is
  their sum. An output read both inside and outside F is refused: the share from outside alone
  was not recorded where the region reads it;
- a gradient **leaving** it is that of a tensor F reads from outside: made by an op P outside
  F, it arrives whole at P's backward record (`P.backward.input.j`, j the output slot) when no
  op outside F reads that tensor too; a parameter's arrives whole at its `parameters_grad`
  record when only F reads the parameter. A tensor also read outside F, a model input's
  gradient (recorded nowhere else) or a gradient whose record has no partner leaves the region
  without this boundary: `region_boundaries.Boundaries.by_module` is tried next.

This is what makes a bare attention block's backward judged where its module call has no input
gradient to compare (its input does not require grad). The measured names map to the tensors
the region made (`regions.made_tensor`), so a replayed culprit (`replay/backchain.py`, which
judges the region's own `...backward.output.i`) names its row.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional, Union

from ..store.records import iter_tensors, producer_of
from ..store.schema import Kind, Phase, Record, RecordName, Role, module_path


if TYPE_CHECKING:
    from .region_boundaries import Entry     # (it imports this module)



class Gradients:
    """The forward dataflow of one dump, read for backward regions (built once per pair)."""

    def __init__(self, records: list[Record], by_seq: dict[Optional[int], Record]) -> None:
        self.by_seq = by_seq                              # seq -> record (the dump's)
        self.by_name: dict[str, Record] = {}              # forward op calls by name
        self.backward_of: dict[str, Record] = {}          # forward call name -> backward record
        self.readers: dict[tuple[Optional[int], str], list[str]] = {}   # (seq, slot) -> reading records
        self.param_readers: dict[str, list[str]] = {}     # parameter FQN -> reading records
        self.param_grads: dict[str, str] = {}             # parameter FQN -> its gradient's name
        for rec in records:
            kind, phase = rec["kind"], rec["phase"]
            if kind == Kind.PARAM_GRAD:
                self._param_grads(rec)
            if kind not in Kind.OPS:
                continue
            link = rec.get("forward")
            if phase == Phase.BACKWARD and isinstance(link, str):
                self.backward_of.setdefault(link, rec)
            if phase != Phase.FORWARD:
                continue
            self.by_name[rec["name"]] = rec
            for _, role, desc in iter_tensors(rec):
                if role != Role.INPUT:
                    continue
                producer = producer_of(desc)
                if producer is not None:
                    self.readers.setdefault(producer, []).append(rec["name"])
                elif desc.get("leaf") == "parameter" and isinstance(desc.get("fqn"), str):
                    self.param_readers.setdefault(desc["fqn"], []).append(rec["name"])

    def _param_grads(self, rec: Record) -> None:
        parsed = RecordName.parse(rec["name"])
        path = module_path(parsed.op) if parsed is not None else None
        if path is None:
            return
        for name, _, _ in iter_tensors(rec):
            local = name[len(rec["name"]) + 1:]
            self.param_grads.setdefault(f"{path}.{local}".lstrip("."), name)

    def boundary(self, members: list[Record], measured: Mapping[str, Entry],
                 twins: Optional[list[Record]] = None
                 ) -> Union[tuple[dict[str, tuple[str, str]], dict[str, str], list[Record]], str]:
        """({measured name of a gradient entering: (the region's op that receives it, what it
        receives it as: "grad_output", "grad_output.1")}, {measured name of a gradient leaving:
        the region's tensor}, its forward calls) of a backward region whose target ops are
        `members`; where the
        dataflow does not prove it (see the module docstring), why not, in words. `measured`:
        the names measured against golden (a container). `twins`: the forward calls of
        `members`, one each, where they are not this dump's (golden's backward records of a
        forward op both runs ran and only golden recorded a backward for: the target's calls
        of that op, `region_onesided.py`)."""
        calls: list[tuple[Record, Record]] = []
        for k, b in enumerate(members):
            link = b.get("forward")
            f = (twins[k] if k < len(twins) else None) if twins is not None else \
                self.by_name.get(link) if isinstance(link, str) else None
            if f is None or f["phase"] != Phase.FORWARD or f.get("op") != b.get("op"):
                return f"`{b['name']}` names no forward call of its op in the dump"
            calls.append((b, f))
        inside = {f["name"] for _, f in calls}
        entering: dict[str, tuple[str, str]] = {}
        leaving: dict[str, str] = {}
        try:
            for b, f in calls:
                self._entering(b, f, inside, measured, entering)
                self._leaving(b, f, inside, measured, leaving)
        except Unproven as exc:
            return str(exc)
        if not entering or not leaving:
            return f"no gradient {'enters' if not entering else 'leaves'} it through a paired op"
        return entering, leaving, [f for _, f in calls]

    def read_outside(self, calls: list[Record]) -> dict[str, tuple[str, str]]:
        """{the name of an input of an op outside `calls` that reads what `calls` made (where a
        forward region's output is measured): (the op that made it, "output" or "output.1")}."""
        inside = {f["name"] for f in calls}
        out: dict[str, tuple[str, str]] = {}
        for f in calls:
            cut = len(f["name"]) + len(".output.")
            slots = [n[cut:] for n, role, _ in iter_tensors(f) if role == Role.OUTPUT]
            for slot in slots:
                key = "output" if len(slots) == 1 else f"output.{slot}"
                for reader in self.readers.get((f.get("seq"), slot), []):
                    if reader in inside:
                        continue
                    for name, r_role, d in iter_tensors(self.by_name[reader]):
                        if r_role == Role.INPUT and producer_of(d) == (f.get("seq"), slot):
                            out.setdefault(name, (str(f["op"]), key))
        return out

    def _entering(self, b: Record, f: Record, inside: set[str], measured: Mapping[str, Entry],
                  out: dict[str, tuple[str, str]]) -> None:
        """The shares of the gradients arriving at `b` from outside the region."""
        arriving = b.get("inputs")
        if not isinstance(arriving, list):
            raise Unproven(f"`{b['name']}` lists no gradients it receives")
        cut = len(f["name"]) + len(".output.")
        slots = [n[cut:] for n, role, _ in iter_tensors(f) if role == Role.OUTPUT]
        for slot, g in zip(slots, arriving):
            key = "grad_output" if len(slots) == 1 else f"grad_output.{slot}"
            if not _is_tensor(g):
                continue
            tensor = f"{f['name']}.output.{slot}"
            readers = self.readers.get((f.get("seq"), slot), [])
            outside = [r for r in readers if r not in inside]
            if not outside:
                if readers:
                    continue        # made and read inside: the region's own gradient
                raise Unproven(f"no recorded op reads `{tensor}`: where its gradient comes "
                               f"from is not known")
            if len(outside) != len(readers):
                raise Unproven(f"`{tensor}` is read inside it and outside it (`{outside[0]}`): "
                               f"the gradient from outside alone is not recorded")
            for reader in dict.fromkeys(outside):
                for name in self._shares(self.by_name[reader], (f.get("seq"), slot), tensor,
                                         measured):
                    out.setdefault(name, (str(b["op"]), key))

    def _shares(self, reader: Record, producer: tuple[Optional[int], str], tensor: str,
                measured: Mapping[str, Entry]) -> list[str]:
        """The gradients `reader`'s backward record hands back for the arguments it read
        `producer`'s tensor as."""
        back = self.backward_of.get(reader["name"])
        sent = back.get("outputs") if back is not None else None
        if back is None or not isinstance(sent, list):
            raise Unproven(f"`{reader['name']}` reads `{tensor}` and has no backward record")
        args = [d for _, role, d in iter_tensors(reader) if role == Role.INPUT]
        names = []
        for i, d in enumerate(args):
            if producer_of(d) != producer:
                continue
            name = f"{back['name']}.output.{i}"
            if i >= len(sent) or not _is_tensor(sent[i]):
                raise Unproven(f"`{back['name']}` records no gradient for `{tensor}`")
            if name not in measured:
                raise Unproven(f"`{name}`, a gradient entering it, is not compared with golden")
            names.append(name)
        return names

    def _leaving(self, b: Record, f: Record, inside: set[str], measured: Mapping[str, Entry],
                 out: dict[str, str]) -> None:
        """Where the gradients `b` makes for the region's inputs arrive whole."""
        sent = b.get("outputs")
        if not isinstance(sent, list):
            raise Unproven(f"`{b['name']}` lists no gradients it makes")
        args = [(n, d) for n, role, d in iter_tensors(f) if role == Role.INPUT]
        for i, ((arg, d), g) in enumerate(zip(args, sent)):
            if not _is_tensor(g):
                continue
            producer = producer_of(d)
            if producer is not None:
                maker = self.by_seq.get(producer[0])
                if maker is not None and maker["name"] in inside:
                    continue        # made inside: the region's own gradient
                name = self._arrives(maker, producer, inside)
            elif d.get("leaf") == "parameter" and isinstance(d.get("fqn"), str):
                name = self._parameter(d["fqn"], inside)
            else:
                what = "a model input" if d.get("leaf") == "input" else "a tensor no recorded op made"
                raise Unproven(f"`{arg}` is {what}: the gradient it gets is recorded nowhere "
                               f"else")
            if name not in measured:
                raise Unproven(f"`{name}`, the gradient leaving it for `{arg}`, is not compared "
                               f"with golden")
            out.setdefault(name, f"{b['name']}.output.{i}")

    def _arrives(self, maker: Optional[Record], producer: tuple[Optional[int], str], inside: set[str]
                 ) -> str:
        """The backward input of `maker` where the gradient of its output arrives whole."""
        if maker is None:
            raise Unproven(f"a tensor it reads was made by no record in the dump ({producer[0]})")
        tensor = f"{maker['name']}.output.{producer[1]}"
        outside = [r for r in self.readers.get(producer, []) if r not in inside]
        if outside:
            raise Unproven(f"`{tensor}` is read inside it and outside it (`{outside[0]}`): the "
                           f"gradient it makes is summed with another before it is recorded")
        back = self.backward_of.get(maker["name"])
        arriving = back.get("inputs") if back is not None else None
        slot = producer[1]
        if back is None or not isinstance(arriving, list) or not slot.isdigit() \
                or int(slot) >= len(arriving) or not _is_tensor(arriving[int(slot)]):
            raise Unproven(f"`{maker['name']}` has no backward record receiving the gradient "
                           f"of `{tensor}`")
        return f"{back['name']}.input.{slot}"

    def _parameter(self, fqn: str, inside: set[str]) -> str:
        """The recorded gradient of a parameter only the region reads."""
        outside = [r for r in self.param_readers.get(fqn, []) if r not in inside]
        if outside:
            raise Unproven(f"parameter `{fqn}` is read inside it and outside it "
                           f"(`{outside[0]}`): its gradient is a sum")
        name = self.param_grads.get(fqn)
        if name is None:
            raise Unproven(f"the gradient of parameter `{fqn}` is not recorded")
        return name


class Unproven(Exception):
    """Why a backward region's boundary is not proven by the dataflow (its message)."""


def _is_tensor(desc: Any) -> bool:
    return isinstance(desc, dict) and desc.get("type") == "tensor"


__all__ = ["Gradients"]
