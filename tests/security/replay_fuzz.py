"""A fuzzer for replay's allow-list: every op replay admits (`opdiff.ops.replay_refusal` says "")
is called through replay's own path (`rebuild_call`, then `Call.run` under the replay guards) with
random and adversarial arguments a hostile dump can hold: huge, negative and zero sizes and
strides, out-of-range and negative index tensors, wrong dtypes, mismatched shapes, empty and
0-dim tensors. Each result is read back in full, as a compare reads it, so an out-of-bounds view
is touched. A kernel that trusts its arguments shows as the child's death by a signal (SIGSEGV,
glibc's SIGABRT on a corrupted heap: the child runs with MALLOC_CHECK_=3 and, where glibc
needs it for that, libc_malloc_debug preloaded) and an unbounded
result as an allocation the address-space limit refused.

    python replay_fuzz.py PROGRESS SEED START STOP     # fuzz targets[START:STOP], one per line

The child writes "op" before each op and "done" at the end to PROGRESS (the parent names the op
that killed it), plus a line "alloc: op ..." for each allocation refused by the OS (an op whose
result replay did not bound before making it) and "maxrss: KB" at the end.
"""
from __future__ import annotations

import json
import random
import resource
import sys
from typing import Any

import torch

NAMESPACES = ("Torch.", "Tensor.", "Functional.", "Torch.linalg.", "Torch.fft.", "Torch.special.",
              "VF.")
BIG = [1 << 31, 1 << 40, 1 << 62, -(1 << 40), -(1 << 62)]
INTS = [0, 1, 2, 3, -1, -2, 4, 7] + BIG
INT_LISTS = [[], [2], [2, 3], [1, 1], [3, 3], [0], [1, 2, 3, 4], [-1, 4], [1 << 40, 1],
             [2, 1 << 31], [1 << 62, 1 << 62], [-(1 << 40), 2], [4, 16], [0, 0, 0, 0], [1, -3],
             [2, 2, 2], [1 << 20, 1 << 20], [3, 1], [16, 1], [1, 1 << 40], [2, 2], [4, 4],
             [1 << 33], [-5], [1, 1, 1]]
FLOATS = [0.0, 1.0, -1.0, 0.5, 1e30, -1e30, float("nan"), float("inf"), 3.0, 1e-30]
DTYPES = ["torch.float32", "torch.float64", "torch.int64", "torch.bool", "torch.float16",
          "torch.int32", "torch.uint8", "torch.complex64", "torch.bfloat16"]


def tensor_pool(rng: random.Random) -> dict[str, torch.Tensor]:
    """Tiny tensors of every kind an argument may be: floats of many ranks, index tensors with
    values in and far out of range, bools, empty and 0-dim tensors, complex."""
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    f = lambda *s: torch.randn(*s, generator=g)     # noqa: E731
    return {
        "f23": f(2, 3), "f4": f(4), "f1234": f(1, 2, 3, 4), "f2345": f(2, 3, 4, 5),
        "f1144": f(1, 1, 4, 4), "f0d": f(()), "f03": f(0, 3), "f33": f(3, 3).double(),
        "f416": f(4, 16), "f12345": f(1, 2, 3, 4, 5), "f222": f(2, 2, 2), "h23": f(2, 3).half(),
        "i23": torch.randint(0, 3, (2, 3), generator=g),
        "i4": torch.tensor([0, 1, 2, 3]),
        "ibig": torch.tensor([1 << 40, 5, -(1 << 40), 3]),
        "ineg": torch.tensor([-1, -7, 2, -100]),
        "i1144": torch.tensor([[[[0, 99999, -5, 1 << 35]] * 4]]),
        "i2345": torch.randint(-1000, 1000, (2, 3, 4, 5), generator=g),
        "i32": torch.tensor([2, 1 << 30, -3], dtype=torch.int32),
        "i0d": torch.tensor(1 << 40), "ilen": torch.tensor([1 << 20, 3]),
        "b23": torch.rand(2, 3, generator=g) > 0.5, "b4": torch.tensor([True, False, True, True]),
        "c4": torch.randn(4, dtype=torch.complex64, generator=g), "u8": torch.tensor([255, 0, 7],
                                                                                      dtype=torch.uint8),
    }


def _tensor(rng: random.Random, pool: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {"type": "tensor", "key": rng.choice(list(pool))}


def _int(rng: random.Random) -> dict[str, Any]:
    return {"type": "int", "value": rng.choice(INTS)}


def _ints(rng: random.Random) -> dict[str, Any]:
    return {"type": "list", "items": [{"type": "int", "value": v} for v in rng.choice(INT_LISTS)]}


def _float(rng: random.Random) -> dict[str, Any]:
    v = rng.choice(FLOATS)
    return {"type": "float", "value": v if v == v and abs(v) != float("inf") else str(v)}


def value(kind: str, rng: random.Random, pool: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A descriptor for an argument of schema type `kind` (adversarial one time in three: any
    kind at all)."""
    if rng.random() < 0.15:
        kind = rng.choice(["Tensor", "int", "int[]", "float", "bool", "Tensor[]", "None"])
    base = kind.replace("?", "").split("(")[0].strip()
    if kind.endswith("?") and rng.random() < 0.2:
        return {"type": "none"}
    if base in ("Tensor",):
        return _tensor(rng, pool)
    if base.startswith("Tensor[") or base.startswith("Tensor?["):
        return {"type": "list", "items": [_tensor(rng, pool) for _ in range(rng.randint(0, 3))]}
    if base in ("int", "SymInt"):
        return _int(rng)
    if base.startswith(("int[", "SymInt[")):
        return _ints(rng) if rng.random() < 0.8 else _int(rng)
    if base in ("float", "Scalar", "number", "complex"):
        return _float(rng) if rng.random() < 0.7 else _int(rng)
    if base.startswith("float["):
        return {"type": "list", "items": [_float(rng) for _ in range(rng.randint(0, 3))]}
    if base == "bool":
        return {"type": "bool", "value": rng.random() < 0.5}
    if base.startswith("bool["):
        return {"type": "list", "items": [{"type": "bool", "value": rng.random() < 0.5}
                                          for _ in range(rng.randint(0, 3))]}
    if base == "ScalarType":
        return {"type": "dtype", "value": rng.choice(DTYPES)}
    if base == "str":
        from opdiff import ops
        return {"type": "str", "value": rng.choice(sorted(ops.REPLAY_STRINGS))}
    if base == "Device":
        return {"type": "device", "value": "cpu"}
    if base == "MemoryFormat":
        return {"type": "object", "value": "torch.contiguous_format"}
    return {"type": "none"}


def targets() -> list[str]:
    """Every op name replay admits: each aten overload, and each name in the other namespaces
    for a method on `ops.REPLAY_SAFE`, that replay resolves."""
    from opdiff import ops
    from opdiff.comparison.replay.calls import NotReplayable, resolve

    found = []
    packets = sorted({n[len("aten::"):].partition(".")[0]
                      for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")})
    for packet in packets:
        if not ops.replay_refusal(f"Aten.{packet}"):
            found.append(f"Aten.{packet}")
    for method in sorted(ops.REPLAY_SAFE):
        for ns in NAMESPACES:
            try:
                resolve(ns + method)
            except NotReplayable:
                continue
            found.append(ns + method)
    return found


def schema(op: str, rng: random.Random) -> list[tuple[str, str, bool, bool]]:
    """(name, type, kwarg-only, has default) of each argument, from the schema of one of the
    aten overloads of the op's name (dumps name the packet: `Aten.add`; for other namespaces:
    the aten op of the same name), or [] when there is none."""
    found = getattr(torch.ops.aten, op.split(".")[-1] if not op.startswith("Aten.")
                    else op.split(".")[1], None)
    if not isinstance(found, torch._ops.OpOverloadPacket):
        return []
    names = [o for o in found.overloads() if "out" not in o]
    if not names:
        return []
    s = getattr(found, rng.choice(names))._schema
    return [(a.name, str(a.type), a.kwarg_only, a.has_default_value()) for a in s.arguments]


def record(op: str, rng: random.Random, pool: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A hostile record of `op`: arguments after its schema (some defaults left out), or a
    random handful when it has none."""
    args = schema(op, rng)
    inputs, kwargs = [], {}
    if args:
        keep = len(args) if rng.random() < 0.6 else rng.randint(0, len(args))
        for i, (name, kind, kwarg_only, has_default) in enumerate(args):
            if i >= keep and has_default:
                continue
            d = value(kind, rng, pool)
            if kwarg_only:
                kwargs[name] = d
            else:
                inputs.append(d)
    else:
        inputs = [value(rng.choice(["Tensor", "Tensor", "int", "int[]", "float"]), rng, pool)
                  for _ in range(rng.randint(1, 4))]
    return {"name": f"{op}.0.forward", "op": op, "inputs": inputs, "kwargs": kwargs}


def touch(value: Any) -> None:
    """Read every element of every tensor in a result (as a compare does)."""
    from opdiff.comparison.replay.calls import flat_tensors
    for t in flat_tensors([value]):
        if t.layout == torch.strided and t.device.type == "cpu":
            t.detach().clone().reshape(-1)[:1].tolist()


def fuzz(op: str, rng: random.Random, pool: dict[str, torch.Tensor], trials: int,
         log: Any) -> None:
    from opdiff.comparison.replay.calls import NotReplayable, rebuild_call
    from opdiff.comparison.replay.running import rng_guard, shielded, vjp

    for _ in range(trials):
        rec = record(op, rng, pool)
        log.write(f"call: {json.dumps(rec)}\n")
        log.flush()
        cast = torch.float64 if rng.random() < 0.5 else None
        grad = rng.random() < 0.3
        try:
            call = rebuild_call(rec, pool.get, cast)
            leaves = [t for _, t in call.tensors if t.is_floating_point()][:1] if grad else []
            for t in leaves:
                t.requires_grad_(True)
            with shielded(), rng_guard(), torch.set_grad_enabled(bool(leaves)):
                out = call.run()
            touch(out)
            from opdiff.comparison.replay.calls import flat_tensors
            outs = [o for o in flat_tensors([out]) if o.requires_grad and o.is_floating_point()]
            if leaves and outs:
                vjp([(outs[0], torch.ones_like(outs[0]))], leaves)
        except NotReplayable:
            pass
        except Exception as exc:       # the kernel's own check: what must happen
            if "can't allocate memory" in str(exc) or isinstance(exc, MemoryError):
                log.write(f"alloc: {op} {str(exc)[:200]}\n")
                log.flush()


def main(argv: list[str]) -> int:
    progress, seed, start, stop = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    aten_trials, other_trials = (int(argv[4]), int(argv[5])) if len(argv) > 5 else (12, 4)
    torch.set_num_threads(1)
    all_targets = targets()
    with open(progress, "a") as log:
        for op in all_targets[start:stop]:
            log.write(f"op: {op}\n")
            log.flush()
            rng = random.Random(f"{seed}:{op}")
            pool = tensor_pool(rng)
            fuzz(op, rng, pool, aten_trials if op.startswith("Aten.") else other_trials, log)
        log.write(f"maxrss: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\n")
        log.write("done\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def run_all(progress_dir: Any, seed: int = 0, chunk: int = 400, timeout: float = 600,
            address_space: int = 4 << 30, trials: tuple[int, int] = (12, 4)) -> dict[str, Any]:
    """Fuzz every target in child processes (chunks of `chunk` targets; after a child dies,
    a new one goes on past the op that killed it). Returns {"crashes": [(op, rc)],
    "allocs": [line], "maxrss_kb": largest, "targets": count}."""
    import ctypes.util
    import os
    import subprocess
    from pathlib import Path

    here = str(Path(__file__).resolve())
    total = len(targets())
    env = dict(os.environ, MALLOC_CHECK_="3", MALLOC_PERTURB_="165", OPDIFF_MAX_TENSOR_MB="64",
               OMP_NUM_THREADS="1")
    debug = ctypes.util.find_library("c_malloc_debug")     # glibc >= 2.34 checks only with it
    if debug:
        env["LD_PRELOAD"] = " ".join(filter(None, [debug, env.get("LD_PRELOAD")]))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    crashes, allocs, rss = [], [], 0
    start = 0
    while start < total:
        stop = min(total, start + chunk)
        progress = Path(progress_dir) / f"fuzz_{start}.log"
        proc = subprocess.run([sys.executable, here, str(progress), str(seed), str(start),
                               str(stop), str(trials[0]), str(trials[1])], env=env, preexec_fn=limit, timeout=timeout,
                              capture_output=True, text=True)
        lines = progress.read_text().splitlines() if progress.exists() else []
        allocs += [ln for ln in lines if ln.startswith("alloc: ")]
        rss = max([rss] + [int(ln.split()[1]) for ln in lines if ln.startswith("maxrss: ")])
        ran = [ln[len("op: "):] for ln in lines if ln.startswith("op: ")]
        if lines and lines[-1] == "done" and proc.returncode == 0:
            start = stop
            continue
        last = ran[-1] if ran else "?"
        calls = [ln for ln in lines if ln.startswith("call: ")]
        crashes.append((last, proc.returncode, calls[-1][len("call: "):] if calls else ""))
        start += max(1, len(ran))          # go on past the op that killed it
    return {"crashes": crashes, "allocs": allocs, "maxrss_kb": rss, "targets": total}
