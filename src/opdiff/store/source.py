"""What every dump opdiff reads looks like (`DumpSource`), and the registry of formats that
`opdiff.store.adapters.discover` finds dumps with.

A dump is one step of one rank, whatever tool wrote it. The comparison, replay and overflow stages
ask it only these questions, so none of them ever checks which tool that was:

    for dump in discover("./dump/npu"):
        dump.record_count()             # cheap: for a progress total
        for record in dump.records():   # opdiff records (see opdiff.store.schema.Record)
            ...
        if dump.holds_tensors:          # its own saved tensors: replay can re-run its ops
            ...

A foreign format is one adapter module that implements `DumpSource` and one `DumpFormat`
registered in `opdiff.store.adapters` (or by a plugin, with `register_format`)::

    register_format(DumpFormat(
        name="mytool", describe="a mytool dump (index.json)",
        detect=lambda file: file.name == "index.json",   # cheap: the file's name only
        open=lambda file: MyToolDump.open(file.parent),   # raises DumpError if it is not one
        data_dirs=lambda hits: {"tensors_mytool"}))       # not walked: they hold only tensors
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol, runtime_checkable

from .schema import Record


@runtime_checkable
class DumpSource(Protocol):
    """One step of one rank of a dump, of any format, read as opdiff records."""

    path: Path                  # the step/rank directory (or the index file of a one-file format)
    meta: dict[str, Any]        # opdiff's meta.json, or what a foreign dump says about itself
    step: Optional[int]
    rank: Optional[int]
    format: str                 # the tool's name, for people ("opdiff", "msprobe", ...)

    def records(self) -> Iterator[Record]:
        """Op records in execution order (`opdiff.store.schema.Record`), each complete: an
        adapter passes every record it yields through `opdiff.store.schema.complete`, so the
        stages index its fields and never re-apply a default."""
        ...

    def tensor(self, key: str) -> Any:
        """The saved tensor a descriptor's `key` names (a CPU torch.Tensor), or None."""
        ...

    def tensor_keys(self) -> list[str]:
        """Keys of every tensor `tensor()` can load."""
        ...

    def stack(self, stack_id: Optional[int]) -> list[dict[str, Any]]:
        """Frames ({"file", "line", "function", "code"}, innermost user frame first; opdiff's
        own dumps may add "context", the lines around the innermost one) of a record's `stack`
        id; [] when unknown. Untrusted: a report never reads the files they name."""
        ...

    @property
    def holds_tensors(self) -> bool:
        """The dump holds its own saved tensors, complete and in their recorded dtypes, for the
        inputs of the ops it records: replay can re-run them. False when it cannot promise that
        (statistics dumps; foreign dumps whose tensors are partial or re-typed)."""
        ...

    def record_count(self) -> int:
        """How many records `records()` yields, counted cheaply (without building them);
        0 when the dump cannot tell."""
        ...


@dataclass(frozen=True)
class DumpFormat:
    """How `discover` finds and opens one dump format."""

    name: str
    describe: str                                   # for "expected ..." messages
    detect: Callable[[Path], bool]                  # is this file a dump index of the format?
    open: Callable[[Path], DumpSource]              # open the dump of that index file
    # A directory holding an index holds nothing more below (opdiff's step/rank directories).
    leaf: bool = True
    # Directory names that hold only tensors, never an index: not walked (given the index
    # files found in that directory).
    data_dirs: Callable[[list[str]], Iterable[str]] = lambda hits: ()
    # Other tools' files share the index's name (any `.pkl`): one that does not open is skipped.
    shared_name: bool = False


_FORMATS: list[DumpFormat] = []


def register_format(fmt: DumpFormat) -> None:
    """Add a format to what `discover` reads (again under the same name: replaced in place).
    Formats are tried in registration order; the first whose index a directory holds wins."""
    for i, known in enumerate(_FORMATS):
        if known.name == fmt.name:
            _FORMATS[i] = fmt
            return
    _FORMATS.append(fmt)


def formats() -> tuple[DumpFormat, ...]:
    """The registered formats, in the order they are tried."""
    return tuple(_FORMATS)


__all__ = ["DumpSource", "DumpFormat", "register_format", "formats"]
