"""Write one ONNX Runtime run as an opdiff dump (format v1), so compare and report can read it.

    path = write_onnx_dump(out / "golden", GraphIndex(model), run, model_path="golden.onnx", side="golden")

Records have kind "node", op = the ONNX op type, name = the node name (or `{op}_{i}` when the
node has none), seq in topological order; seq 0 holds the graph inputs. Each tensor descriptor
carries its ONNX tensor name under "tensor" and is saved under that key, initializers of every
dtype included.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import numpy as np

from ..store import DumpWriter
from ..store import layout
from ..store.layout import rank_dir
from ..store.records import encode_float
from ..store.schema import Kind, Phase
from .graph import GraphIndex

log = logging.getLogger("opdiff")

SHARD_BYTES = 64 << 20


def stats_of(array: np.ndarray) -> dict:
    """max/min/mean/norm over all values in float64, and nan/inf counts (strict-JSON safe)."""
    if array.size == 0 or array.dtype.kind not in "biuf":
        return {}
    x = array.astype(np.float64, copy=False)
    with np.errstate(all="ignore"):
        return {"max": encode_float(float(x.max())), "min": encode_float(float(x.min())),
                "mean": encode_float(float(x.mean())), "norm": encode_float(float(np.linalg.norm(x))),
                "nan": int(np.isnan(x).sum()), "inf": int(np.isinf(x).sum())}


def describe(name: str, array: Optional[np.ndarray], saved: set) -> dict:
    if array is None:
        return {"type": "object", "value": f"<{name}: not computed>", "tensor": name}
    desc = {"type": "tensor", "dtype": str(array.dtype), "shape": list(array.shape), "device": "cpu",
            "requires_grad": False, "stats": stats_of(array), "tensor": name}
    if name in saved:
        desc["key"] = name
    return desc


class OnnxDump:
    """Writes records and tensors of one side; tensors are saved once, however many nodes read them."""

    def __init__(self, root: Path, meta: dict, save_tensors: bool = True):
        self.directory = rank_dir(root, 0, 0)
        self.writer = DumpWriter(self.directory, meta)
        self.save_tensors = save_tensors
        self.saved: set = set()
        self.seq = 0
        self._batch: dict = {}
        self._batch_bytes = 0
        self._shards = 0

    def _save(self, name: str, array: Optional[np.ndarray]) -> None:
        if not self.save_tensors or array is None or name in self.saved or array.dtype.kind not in "biuf":
            return
        self.saved.add(name)
        self._batch[name] = np.ascontiguousarray(array)
        self._batch_bytes += array.nbytes
        if self._batch_bytes >= SHARD_BYTES:
            self._write_shard()

    def _write_shard(self) -> None:
        """Tensors go straight from numpy to a safetensors shard (same layout the reader expects):
        no torch import, which would cost more than the whole ONNX compare."""
        if not self._batch:
            return
        from safetensors.numpy import save_file

        tdir = self.directory / layout.TENSORS
        tdir.mkdir(parents=True, exist_ok=True)
        final = tdir / f"onnx_{self._shards:05d}.safetensors"
        tmp = final.with_suffix(".tmp")
        save_file(self._batch, str(tmp))
        tmp.replace(final)
        self._shards += 1
        self._batch, self._batch_bytes = {}, 0

    def record(self, name: str, op: str, inputs: list, outputs: list, tensors: dict,
               module: Optional[str] = None, location=None, kind: str = Kind.NODE) -> None:
        for t in list(inputs) + list(outputs):
            if t:
                self._save(t, tensors.get(t))
        stack = None
        if location is not None:
            stack = self.writer.stack_id(((location.file, location.line, location.function, location.code),))
        self.writer.write({
            "seq": self.seq, "name": name, "op": op, "kind": kind, "phase": Phase.FORWARD,
            "module": module, "stack": stack,
            "inputs": [describe(t, tensors.get(t), self.saved) if t else {"type": "none"} for t in inputs],
            "outputs": [describe(t, tensors.get(t), self.saved) for t in outputs],
        })
        self.seq += 1

    def close(self) -> Path:
        self._write_shard()
        self.writer.close()
        return self.directory


def write_onnx_dump(root: Path, g: GraphIndex, tensors: dict, meta: dict, save_tensors: bool = True) -> Path:
    """Dump one run: a record for the graph inputs, then one per node in topological order."""
    dump = OnnxDump(root, meta, save_tensors)
    dump.record("graph_inputs", "Input", [], list(g.inputs), tensors)
    for node in g.nodes:
        dump.record(g.display_name(node), node.op_type, list(node.input), [o for o in node.output if o],
                    tensors, module=g.module_of(node), location=g.location_of(node))
    return dump.close()
