"""A region's boundary tensors: what it reads from outside and what it hands on (`regions.py`).

Found among the measured rows of one pair of dumps: through the dump's dataflow
(`Boundaries.by_dataflow`; backward through its forward calls, `region_gradients.py`), or,
without it, at the innermost paired module call holding the region (`Boundaries.by_module`).

Upstream (`upstream=True`, eager against a compiled run): a forward region may read a tensor
that another region made and no paired op reads (Inductor's residual stream: the kernel that
adds a layer's output to the residual and normalises it reads the residual its predecessor's
kernel made, or recomputes it from the embedding kernel's output; eager's `add`s are in the
regions too). Such a tensor is not compared, so it is judged from what it was made of: the
inputs of the op that made it, measured where they were made, traced back through the ops of
earlier forward regions whose own boundary was found (judged regions: an op no region judges,
an unmatched one, is never traced through) until every one is compared (a parameter, a buffer,
the model's input, a paired op's output). The region is then judged as the computation from
those tensors to its outputs; the ops traced through are `Region.through`, named in its verdict
(a difference they made in the tensor they hand it, and in no tensor their region hands on
compared, would show as this region's; a chain replay from its saved inputs, with tensor dumps,
tells the two apart).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, TYPE_CHECKING, Union, cast

from ..store.records import iter_tensors
from ..store.schema import Kind, Phase, Record, RecordName, Role
from .compiled_modules import by_inductor
from .graph import RunGraph
from .region_gradients import Gradients

if TYPE_CHECKING:
    from .regions import Region     # (regions.py imports this module)

# (row index, Measurement, t dtype, g dtype); `region_onesided` tries a boundary with stand-ins
Entry = tuple[int, Any, Optional[str], Optional[str]]


class Boundaries:
    """Finds each region's boundary tensors among the measured rows of one pair of dumps.

    measured: target tensor name -> its measured row entry (rows of paired ops);
    module_entries: module call name -> (input entries, output entries) of paired module calls;
    golden: golden's records, for a backward region of golden's ops alone (`Region.twins`);
    graph: the target's (`graph.RunGraph` of `target`), when the caller has it.
    """

    def __init__(self, target: list[Record], dataflow: bool, measured: Mapping[str, Entry],
                 module_entries: dict[str, tuple[list[Entry], list[Entry]]],
                 golden: Optional[list[Record]] = None, upstream: bool = False,
                 graph: Optional[RunGraph] = None) -> None:
        self.target, self.dataflow, self.golden = target, dataflow, golden or []
        self.upstream = upstream and dataflow       # (see the module docstring)
        self.regional: set[Optional[int]] = set()     # seqs of judged forward regions' target ops
        self.traced: list[str] = []         # ops `_read` traced through (`upstream`)
        self.sources: dict[Optional[int], Optional[tuple[dict[int, Entry], list[str], list[str]]]] = {}
        self.measured, self.module_entries = measured, module_entries
        # seq -> record, of `graph` (the target's, when the caller has it: `graph.RunGraph`)
        self.by_seq = cast("dict[Optional[int], Record]",
                           (graph or RunGraph(target)).by_seq if dataflow else {})
        self.leaf_names = {(r.get("leaf"), r.get("tensor")): r["name"] for r in target
                           if r["kind"] == Kind.LEAF}
        self.gradients: Optional[Gradients] = None     # made for the first backward region
        # backward region number -> the gradients entering it (`Gradients.boundary`)
        self.arriving: dict[int, dict[str, tuple[str, str]]] = {}
        self.calls: dict[int, list[Record]] = {}        # ... and its forward calls
        self.unproven_by_dataflow: dict[int, str] = {}  # ... or why the dataflow does not prove it
        self.inside: Optional[dict[str, list[int]]] = None   # module call -> indices of its ops
        # backward regions judged like forward ones, through the dataflow Inductor's compiled
        # backward carries between its calls (capture/sink.py): their numbers
        self.flows: set[int] = set()
        # (producer seq, slot) of a backward call's output -> (input name, shape) of its readers
        self.read_at: Optional[dict[tuple[int, ...], list[tuple[str, Optional[list[int]]]]]] = None
        self.read_by: dict[Optional[int], set[Optional[int]]] = {}     # backward call's seq -> seqs of its readers

    def consumers(self, regions: list[Region]) -> dict[int, dict[str, str]]:
        """region number -> {consumer's input tensor name: the region's output tensor it reads};
        a backward region's: {where a gradient it makes arrives: that gradient}."""
        self.flows = {r.number for r in regions if self._flows(r)}
        for r in regions:
            r.feeds_backward = self._feeds_backward(r)
        if not self.dataflow or not regions:
            return {}
        out: dict[int, dict[str, str]] = {}
        for r in regions:
            if r.phase == Phase.BACKWARD and r.number not in self.flows:
                if self.gradients is None:
                    self.gradients = Gradients(self.target, self.by_seq)
                if r.target:
                    found = self.gradients.boundary([self.target[i] for i in r.target],
                                                    self.measured)
                else:       # golden's ops alone, through the target's twins of their calls
                    found = self.gradients.boundary([self.golden[i] for i in r.golden],
                                                    self.measured,
                                                    [self.target[i] for i in r.twins])
                if isinstance(found, str):
                    self.unproven_by_dataflow[r.number] = found
                else:
                    self.arriving[r.number], out[r.number], self.calls[r.number] = found
                    if not r.target:    # (it made no target tensor: each is measured as is)
                        out[r.number] = {n: n for n in out[r.number]}
        regions = [r for r in regions if r.phase != Phase.BACKWARD or r.number in self.flows]
        if not regions:
            return out
        region_of = {self.target[i]["seq"]: r.number for r in regions for i in r.target}
        backward = {self.target[i]["seq"] for r in regions if r.phase == Phase.BACKWARD
                    for i in r.target}
        inside = {i for r in regions for i in r.target}
        for k, rec in enumerate(self.target):
            # (against a compiled run a backward op pairs with eager's through its forward op
            # only, and one of two alike, the o_proj weight gradient's `mm`, may meet the
            # other's twin: a forward region's output is measured where forward ops read it;
            # a backward region's where Inductor's backward calls read it, or the ops after
            # the backward (an optimizer's step reading the parameters' gradients it made))
            if k in inside:
                continue
            reads_backward = self.upstream and rec["phase"] == Phase.BACKWARD
            for name, role, desc in iter_tensors(rec):
                producer = desc.get("producer")
                if role == Role.INPUT and producer and producer[0] in region_of and \
                        (producer[0] in backward or not reads_backward):
                    made = self.by_seq.get(producer[0])
                    out.setdefault(region_of[producer[0]], {})[name] = \
                        f"{made['name']}.output.{producer[1]}" if made else name
        return out

    def by_dataflow(self, region: Region, consumers: dict[str, str]
                    ) -> Optional[tuple[list[Entry], list[Entry]]]:
        """(inputs, outputs) through the dump's dataflow, or None where it does not reach."""
        if not self.dataflow:
            return None
        if region.phase == Phase.BACKWARD and region.number not in self.flows:
            return self._backward(region, consumers)
        self.traced = []
        read = self._read([self.target[i] for i in region.target])
        outputs = {e[0]: e for e in (self.measured.get(n) for n in consumers) if e is not None}
        if region.number in self.flows and (read is None or not outputs):
            self.unproven_by_dataflow[region.number] = (
                "a tensor its kernels read is not compared with golden" if read is None else
                "no op compared with golden's reads what it makes (gradients of parameters, "
                "which L2 does not record, are left: record the optimizer's step in the same "
                "window, whose ops read them, to have it judged)")
        if read is None:
            return None
        inputs, unpaired = read
        if not outputs or not inputs:
            return None
        region.unpaired_leaves = unpaired
        region.through = list(dict.fromkeys(self.traced))
        if self.upstream:       # (its ops made tensors a later region may be judged through)
            self.regional.update(self.target[i]["seq"] for i in region.target)
        return list(inputs.values()), list(outputs.values())

    def _flows(self, region: Region) -> bool:
        """Whether a backward region's target ops are calls of Inductor's compiled backward
        whose inputs name the backward calls that made them (dumps since capture records
        that dataflow): it is judged like a forward region, at the tensors its kernels read
        and hand on; its `forward` is the compiled function's, no op's of its own."""
        if not self.upstream or region.phase != Phase.BACKWARD or not region.target:
            return False
        ops = [self.target[i] for i in region.target]
        if not any(by_inductor(r) for r in ops):
            return False
        if self.read_at is None:    # (made once: who reads each backward call's outputs)
            self.read_at = {}
            for rec in self.target:
                for name, role, desc in iter_tensors(rec):
                    made = self.by_seq.get((desc.get("producer") or (None,))[0])
                    if role != Role.OUTPUT and made is not None and \
                            made["phase"] == Phase.BACKWARD:
                        self.read_at.setdefault(tuple(desc["producer"]), []).append(
                            (name, desc.get("shape")))
                        self.read_by.setdefault(made["seq"], set()).add(rec["seq"])
        return bool(self.read_at)

    def _feeds_backward(self, region: Region) -> bool:
        """Whether a backward region of Inductor's compiled backward may hand what it makes to
        recorded ops: not where the backward's dataflow is recorded and no op outside it reads
        its outputs (its results go to parameters' gradients only)."""
        if region.phase != Phase.BACKWARD or not any(
                by_inductor(self.target[i]) for i in region.target):
            return False
        if region.number not in self.flows:
            return True
        seqs = {self.target[i]["seq"] for i in region.target}
        return any(self.read_by.get(seq, set()) - seqs for seq in seqs)

    def _read_elsewhere(self, producer: tuple[int, int], made: Optional[Record]) -> Optional[Entry]:
        """A backward call's output no row measures as made, measured where a paired op reads
        it whole (another view of the same elements: the gradient kernel's output an `mm`
        reads transposed), or None."""
        if made is None or made["phase"] != Phase.BACKWARD or not self.read_at:
            return None
        size = _elements(next((d.get("shape") for n, role, d in iter_tensors(made)
                               if role == Role.OUTPUT and n.endswith(f".output.{producer[1]}")),
                              None))
        for name, shape in self.read_at.get(tuple(producer), ()):
            entry = self.measured.get(name)
            if entry is not None and size is not None and _elements(shape) == size:
                return entry
        return None

    def _backward(self, region: Region, consumers: dict[str, str]
                  ) -> Optional[tuple[list[Entry], list[Entry]]]:
        """A backward region's (inputs, outputs): the gradients entering it and, since its
        backward formulas read them, the tensors its forward calls read and made (measured where
        they were made and where they are read), as an op's backward is judged with its forward
        call's tensors (`blame.linked`); the gradients leaving it."""
        arriving, calls = self.arriving.get(region.number), self.calls.get(region.number, [])
        if not arriving or not consumers or self.gradients is None:
            return None
        read = self._read(calls)
        if read is None:
            self.unproven_by_dataflow[region.number] = (
                "a tensor its forward calls read is not compared with golden, so its gradients "
                "cannot be told apart from what that tensor carries")
            return None
        inputs, region.unpaired_leaves = read
        for name in [*self.gradients.read_outside(calls), *arriving]:
            entry = self.measured.get(name)
            if entry is not None:
                inputs[entry[0]] = entry
        return list(inputs.values()), [self.measured[n] for n in consumers]

    def _read(self, records: list[Record]) -> Optional[tuple[dict[int, Entry], list[str]]]:
        """({row: entry} of the tensors `records` read from outside them, measured where they
        were made; the FQNs of parameters without a golden partner, left out), or None where
        one is not measured (made by an unpaired op)."""
        seqs = {r["seq"] for r in records}
        inputs: dict[int, Entry] = {}
        unpaired: list[str] = []
        for rec in records:
            for _, role, desc in iter_tensors(rec):
                if role == Role.OUTPUT:
                    continue
                producer, leaf = desc.get("producer"), desc.get("leaf")
                if producer and producer[0] in seqs:
                    continue
                if producer:
                    maker = self.by_seq.get(producer[0])
                    if maker is not None and _constant(maker):
                        continue    # (a buffer Inductor allocates: `zeros`, read nothing)
                    name = f"{maker['name']}.output.{producer[1]}" if maker else None
                elif leaf in ("parameter", "buffer", "input"):
                    rec_name = self.leaf_names.get((leaf, desc.get("fqn")))
                    name = f"{rec_name}.output.0" if rec_name else None
                else:
                    continue        # made outside the recorded ops: nothing to measure it by
                entry = self.measured.get(name) if name else None
                if entry is None and producer:
                    entry = self._read_elsewhere(producer, self.by_seq.get(producer[0]))
                if entry is None and name and leaf in ("parameter", "buffer"):
                    # golden holds it in other shapes (three q/k/v weights against one fused
                    # qkv weight): not compared; the verdict says so (`region_reason`)
                    unpaired.append(str(desc.get("fqn")))
                    continue
                if entry is None and producer and producer[0] in self.regional:
                    source = self._source(producer[0])
                    if source is not None:      # (what made it, compared: module docstring)
                        inputs.update(source[0])
                        unpaired += source[1]
                        self.traced += source[2]
                        continue
                if entry is None:
                    return None     # fed by an unpaired op (another region): not by dataflow
                inputs[entry[0]] = entry
        return inputs, list(dict.fromkeys(unpaired))

    def _source(self, seq: int) -> Optional[tuple[dict[int, Entry], list[str], list[str]]]:
        """What the forward region op `seq` made its outputs of, all compared (`_read` of it,
        tracing on): (its input entries, unpaired parameters, the ops traced through, itself
        first), or None where one of them is not compared."""
        if seq not in self.sources:
            self.sources[seq] = None        # (the dataflow runs forward: no cycle; guarded)
            made = self.by_seq.get(seq)
            outer, self.traced = self.traced, []
            read = self._read([made]) if made is not None and (
                made["phase"] == Phase.FORWARD or self.read_at) else None
            if read is not None and made is not None:
                self.sources[seq] = (read[0], read[1], [made["name"], *self.traced])
            self.traced = outer
        return self.sources[seq]

    def entering(self, region: Region) -> dict[str, tuple[str, str, str]]:
        """The tensors entering a region through the dump's dataflow, by the name they are
        measured under -> (the op of the region that reads it first, the input it reads it as:
        "0", "attn_mask", "0.1" for a list's second tensor, the FQN of a parameter or buffer
        or ""): what its verdict calls them (`region_verdict`). {} without dataflow, and for
        a backward region the op that receives each gradient, and "grad_output" (or
        "grad_output.1" for its second output's), and its forward calls' tensors (their
        outputs as "output")."""
        if not self.dataflow:
            return {}
        if region.phase == Phase.BACKWARD and region.number not in self.flows:
            out = {n: (op, key, "") for n, (op, key) in self.arriving.get(region.number, {}).items()}
            calls = self.calls.get(region.number, [])
            for tensor, reader in self._readers(calls).items():
                out.setdefault(tensor, reader)
            if self.gradients is not None:
                for tensor, (op, key) in self.gradients.read_outside(calls).items():
                    out.setdefault(tensor, (op, key, ""))
            return out
        out = self._readers([self.target[i] for i in region.target])
        if region.through:      # (what the ops traced through read: `upstream`)
            by_name = {self.target[i]["name"]: self.target[i] for i in self.regional_ops()}
            traced = [by_name[n] for n in region.through if n in by_name]
            for tensor, reader in self._readers(traced).items():
                out.setdefault(tensor, reader)
        return out

    def regional_ops(self) -> list[int]:
        """Indices of the judged forward regions' target ops `upstream` may trace through."""
        return [i for i, r in enumerate(self.target) if r["seq"] in self.regional]

    def _readers(self, records: list[Record]) -> dict[str, tuple[str, str, str]]:
        """`entering` of the ops `records`."""
        seqs = {r["seq"] for r in records}
        out: dict[str, tuple[str, str, str]] = {}
        for rec in records:
            prefix = f"{rec['name']}.input."
            for name, role, desc in iter_tensors(rec):
                producer, leaf = desc.get("producer"), desc.get("leaf")
                if role == Role.OUTPUT or (producer and producer[0] in seqs):
                    continue
                made = self.by_seq.get(producer[0]) if producer else None
                if made is not None and producer:
                    tensor = f"{made['name']}.output.{producer[1]}"
                elif not producer and leaf in ("parameter", "buffer", "input"):
                    leaf_record = self.leaf_names.get((leaf, desc.get("fqn")))
                    if leaf_record is None:
                        continue
                    tensor = f"{leaf_record}.output.0"
                else:
                    continue
                fqn = str(desc.get("fqn") or "") if leaf in ("parameter", "buffer") else ""
                key = name[len(prefix):] if name.startswith(prefix) else name
                out.setdefault(tensor, (str(rec["op"]), key, fqn))
        return out

    def by_module(self, region: Region) -> Optional[tuple[list[Entry], list[Entry]]]:
        """(inputs, outputs) of the innermost paired module call holding the region. Its
        inputs also hold the outputs of the paired ops of its phase inside that call that ran
        before the region's first op (q's projection before SDPA): a difference they made
        enters the region without passing the call's inputs, and is not the region's. A
        backward region's inputs also hold its module's forward call's inputs and outputs:
        its backward formulas read the activations that call made, so a difference made
        before the region in the forward (q's projection) reaches the gradients it hands back
        while the gradient it receives agrees, as for an op's backward (`blame.linked`); it is
        not judged where that forward call is not paired, nor is a region of one side's ops
        alone (`region_onesided.py`): the call may hold the other side's work elsewhere."""
        if region.module is None or not region.target or not region.golden:
            return None     # (one side's ops alone: the call holds other work too)
        name = region.module
        if region.phase == Phase.BACKWARD:
            parsed = RecordName.parse(name)
            name = parsed.with_phase(Phase.BACKWARD).text if parsed is not None else name
        found = self.module_entries.get(name)
        if found is None or not found[1]:
            return None
        inputs = {e[0]: e for e in (*found[0], *self._made_before(region))}
        if region.phase == Phase.BACKWARD:
            forward = self.module_entries.get(region.module)
            if forward is None:
                return None
            inputs.update((e[0], e) for e in (*forward[0], *forward[1]))
        return list(inputs.values()), found[1]

    def _made_before(self, region: Region) -> list[Entry]:
        """The measured outputs of the ops of the region's phase inside its module call
        (named by its forward call, as backward ops name theirs) that ran before its first op."""
        if self.inside is None:
            parents = {r["name"]: r["module"] for r in self.target if r["kind"] == Kind.MODULE}
            self.inside = {}
            for i, rec in enumerate(self.target):
                if rec["kind"] in Kind.OPS:
                    for call in common_chain(rec.get("module"), parents):
                        self.inside.setdefault(call, []).append(i)
        first = min(region.target)
        out: list[Entry] = []
        for i in self.inside.get(region.module or "", ()):
            rec = self.target[i]
            if i >= first:
                break
            if rec["phase"] != region.phase:
                continue
            for tensor, role, _ in iter_tensors(rec):
                entry = self.measured.get(tensor) if role == Role.OUTPUT else None
                if entry is not None:
                    out.append(entry)
        return out

    def unproven(self, region: Region) -> str:
        """Why a backward region has no boundary (neither `by_dataflow` nor `by_module`), in
        words; "" for a forward region (its rows say its boundary tensors are not paired)."""
        if region.phase != Phase.BACKWARD:
            return ""
        where = f"`{region.where}`" if region.where else "the model"
        if region.module is None:
            module = "its ops run in no one module call"
        elif self.module_entries.get(RecordName.parse(region.module).with_phase(  # type: ignore[union-attr]
                Phase.BACKWARD).text) is None:
            module = f"the backward of its module call {where} is not paired with golden's"
        elif self.module_entries.get(region.module) is None:
            module = (f"the forward of its module call {where}, whose activations its "
                      f"gradients read, is not paired with golden's")
        else:
            module = f"its module call {where} hands back no gradient (its inputs need none)"
        flow = self.unproven_by_dataflow.get(region.number) if self.dataflow else \
            "the dump has no dataflow"
        return f"{flow}, and {module}" if flow else module


def _elements(shape: Union[list[int], tuple[int, ...], None]) -> Optional[int]:
    if not isinstance(shape, (list, tuple)):
        return None
    size = 1
    for n in shape:
        size *= int(n)
    return size


def _constant(record: Record) -> bool:
    """Whether an op made its output of no tensor (an allocation: `zeros`, `empty`)."""
    return record["kind"] in Kind.OPS and not any(
        role != Role.OUTPUT for _, role, _ in iter_tensors(record))


def common_chain(module: Optional[str], parents: dict[str, Optional[str]]) -> list[str]:
    """`module` (a module call name) and every module call holding it, innermost first."""
    chain: list[str] = []
    while module and module not in chain:
        chain.append(module)
        module = parents.get(module)
    return chain


__all__ = ["Boundaries", "Entry", "common_chain"]
