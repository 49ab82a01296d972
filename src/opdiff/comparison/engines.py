"""Where a compare's step/rank pairs run: `compare(engine=...)`.

    import opdiff
    from opdiff.comparison.engines import RayEngine
    opdiff.compare("./dump/npu", "./dump/gpu", engine=RayEngine(address="auto", shard_mb=256))

`LocalEngine()` (the default, also spelled engine="local") compares the pairs in a process pool
on this machine (`runs.run_pairs`); `RayEngine(address, pins, shard_mb)` (engine="ray": its
defaults) makes each pair a Ray task (`ray_engine.run_pairs_ray`). Each checks its own arguments
when it is made, with one line (an `OpdiffError`, exit 2 from the CLI); both give the same
result, row for row.
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Optional, Union

from ..errors import ConfigError
from .options import CompareOptions
from .result import CompareResult
from .runs import Pair, run_pairs


class Engine:
    """Runs a compare's step/rank pairs; `LocalEngine` or `RayEngine`."""
    name: ClassVar[str]

    def check(self, *, mapping: bool = False) -> None:
        """Raise an OpdiffError (one line) when this engine cannot compare with these options
        (mapping: a mapping file is given). Called before any dump is read."""

    def run(self, pairs: list[Pair], options: CompareOptions, *,
            tick: Optional[Callable[[int], None]] = None,
            on_pair: Optional[Callable[[Pair], None]] = None) -> list[CompareResult]:
        """Every (target, golden) pair compared as `options` say; results in the order of
        `pairs` (see `runs.run_pairs` for the arguments)."""
        raise NotImplementedError


@dataclass(frozen=True)
class LocalEngine(Engine):
    """Compare the pairs on this machine: one pair in this process, several in a process pool
    (one process per pair, at most one per core). The default engine."""
    name: ClassVar[str] = "local"

    def run(self, pairs: list[Pair], options: CompareOptions, *,
            tick: Optional[Callable[[int], None]] = None,
            on_pair: Optional[Callable[[Pair], None]] = None) -> list[CompareResult]:
        return run_pairs(pairs, options, tick=tick, on_pair=on_pair)


@dataclass(frozen=True)
class RayEngine(Engine):
    """Compare each step/rank pair as a Ray task (`pip install opdiff[ray]`); the same result
    as the local engine.

    address: the cluster ("auto", "host:6379", "ray://host:10001"); None: a local one for the
        compare (or the one this process joined already).
    pins: {path prefix: Ray custom resource}: pairs whose target dump lies under the prefix run
        on the node offering that resource (`ray start --resources='{"dumpA": 1}'`).
    shard_mb: a pair whose saved tensors hold more than this many MiB is measured in shards of
        about that size, each its own Ray task; None: one task per pair.

    A mapping file (`compare(mapping=...)`) goes to every pair task; with shard_mb it is
    refused, since shards are planned by aligning the dumps without it.
    """
    name: ClassVar[str] = "ray"
    address: Optional[str] = None
    pins: Mapping[str, str] = field(default_factory=dict)
    shard_mb: Optional[float] = None

    def __post_init__(self) -> None:
        from .ray_engine import host_port

        host_port(self.address)             # its form; whether anything listens: at run time
        if not isinstance(self.pins, Mapping):
            raise ConfigError(f"RayEngine pins must be a mapping {{path prefix: Ray resource}}, "
                              f"not {self.pins!r}")
        pins = {}
        for prefix, resource in self.pins.items():
            if not isinstance(prefix, (str, os.PathLike)) or not os.fspath(prefix) or \
                    not isinstance(resource, str) or not resource:
                raise ConfigError(f"RayEngine pins: {prefix!r}: {resource!r} is not a path "
                                  f"prefix and the name of a Ray custom resource")
            pins[os.fspath(prefix)] = resource
        object.__setattr__(self, "pins", pins)
        mb = self.shard_mb
        if mb is not None and (isinstance(mb, bool) or not isinstance(mb, (int, float))
                               or not mb > 0 or not math.isfinite(mb)):
            raise ConfigError(f"RayEngine shard_mb must be a positive number of MiB (or None: "
                              f"one task per pair), not {mb!r}")

    def check(self, *, mapping: bool = False) -> None:
        if mapping and self.shard_mb is not None:
            raise ConfigError("a mapping file cannot be combined with shard_mb yet (engine ray: "
                              "shards are planned without the mapping); leave shard_mb out to "
                              "compare each pair in one task")

    def run(self, pairs: list[Pair], options: CompareOptions, *,
            tick: Optional[Callable[[int], None]] = None,
            on_pair: Optional[Callable[[Pair], None]] = None) -> list[CompareResult]:
        self.check(mapping=options.mapping is not None)
        from .plans import made_by_plan
        if any(made_by_plan(d) for pair in pairs for d in pair):
            raise ConfigError("ranks laid out otherwise on the two sides are merged into one run "
                              "in this process, which engine ray cannot send to its tasks yet; "
                              "compare with the local engine")
        from .ray_engine import run_pairs_ray

        return run_pairs_ray(pairs, options, address=self.address, pins=self.pins,
                             tick=tick, on_pair=on_pair,
                             shard_bytes=int(self.shard_mb * 2**20) if self.shard_mb else None)


# compare()'s keyword arguments before engine objects (DeprecationWarning; RayEngine's names)
OLD_RAY_ARGUMENTS = {"ray_address": "address", "ray_pins": "pins", "ray_shard_mb": "shard_mb"}


def engine_for(engine: Union[str, Engine], **old: Any) -> Engine:
    """The Engine `compare(engine=...)` names: an Engine as it is, "local" `LocalEngine()`,
    "ray" `RayEngine()`. `old`: compare's deprecated ray_address, ray_pins and ray_shard_mb
    (None: not given), taken with engine="ray" only, with a DeprecationWarning."""
    given = {k: v for k, v in old.items() if v is not None}
    unknown = set(old) - set(OLD_RAY_ARGUMENTS)
    if unknown:
        raise TypeError(f"engine_for() got unexpected arguments {sorted(unknown)}")
    said = " and ".join(given)
    if isinstance(engine, Engine):
        if given:
            raise ConfigError(f"{said} cannot be given with engine={engine!r}: pass them to "
                              f"RayEngine(...) as {', '.join(OLD_RAY_ARGUMENTS[k] for k in given)}")
        return engine
    if engine == "local":
        if given:
            raise ConfigError(f"{said} {'is' if len(given) == 1 else 'are'} for the Ray engine, "
                              f"not engine='local'; pass engine=RayEngine(...)")
        return LocalEngine()
    if engine == "ray":
        if given:
            warnings.warn(f"compare({', '.join(f'{k}=' for k in given)}) is deprecated and goes "
                          f"in the next release: pass engine=RayEngine("
                          f"{', '.join(f'{OLD_RAY_ARGUMENTS[k]}=' for k in given)})",
                          DeprecationWarning, stacklevel=3)
        return RayEngine(**{OLD_RAY_ARGUMENTS[k]: v for k, v in given.items()})
    raise ConfigError(f"engine must be 'local', 'ray', LocalEngine() or RayEngine(...), not "
                      f"{engine!r}")


__all__ = ["Engine", "LocalEngine", "RayEngine", "engine_for", "OLD_RAY_ARGUMENTS"]
