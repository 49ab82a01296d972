"""Model inputs from `.npy`, `.npz` and `.bin` files, or random with a seed.

    prepared = prepare_inputs(model, "a.npy,b.bin", input_shapes=parse_input_shapes("b:1,128"))
    prepared.feeds      # {input name: np.ndarray} ready for ONNX Runtime
    prepared.notes      # what was done to make the data fit, in words (shown to the user)

Files are only read. A batch that differs from the model's fixed batch is cut or repeated, and
the note says so; dynamic dimensions take their size from the data, `--input-shape`, or 1.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .deps import OnnxError
from .graph import GraphIndex, TensorInfo

log = logging.getLogger("opdiff")

FLOAT_RANGE = (-1.0, 1.0)
DEFAULT_INT_HIGH = 2      # 0/1: valid for masks, token type ids and most index-like inputs


@dataclass
class PreparedInputs:
    """Inputs for one comparison: the arrays, where each came from, and what was adjusted."""
    feeds: dict
    sources: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


def model_inputs(model) -> list[TensorInfo]:
    """The graph inputs that are not initializers, with element type and (possibly symbolic) shape."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        shape = None
        if t.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                          for d in t.shape.dim)
        out.append(TensorInfo(vi.name, t.elem_type, shape))
    return out


def parse_input_shapes(text: Optional[str]) -> dict:
    """`"x:1,3,224,224;mask:1,128"` -> {"x": (1, 3, 224, 224), "mask": (1, 128)}."""
    shapes: dict = {}
    if not text:
        return shapes
    for part in text.replace(" ", "").split(";"):
        if not part:
            continue
        name, sep, dims = part.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.split(",") if d != "")
        except ValueError:
            raise OnnxError(f"--input-shape '{part}' is not NAME:D0,D1,...; "
                            f"example: --input-shape 'input:1,3,224,224'") from None
    return shapes


def numpy_dtype(elem_type: int):
    import onnx

    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "an unknown type"
        raise OnnxError(f"model input of type {name} is not supported for input data; "
                        f"give the model a float/int/bool input") from None


def prepare_inputs(model, files: "str | Sequence[str] | None" = None, *, input_shapes=None,
                   seed: int = 0) -> PreparedInputs:
    """Read or generate one array per model input (see the module docstring)."""
    infos = model_inputs(model)
    input_shapes = dict(input_shapes or {})
    unknown = sorted(set(input_shapes) - {i.name for i in infos})
    if unknown:
        raise OnnxError(f"--input-shape names {', '.join(unknown)}, but the model's inputs are "
                        f"{', '.join(i.name for i in infos)}")
    prepared = PreparedInputs(feeds={})
    paths = _split_files(files)
    if not paths:
        _random_inputs(model, infos, input_shapes, seed, prepared)
        return prepared
    arrays = _read_files(paths, infos, input_shapes)
    for info in infos:
        source, array = arrays[info.name]
        prepared.sources[info.name] = source
        prepared.feeds[info.name] = _fit(info, array, input_shapes.get(info.name), source, prepared.notes)
    return prepared


def _split_files(files) -> list[str]:
    if files is None:
        return []
    if isinstance(files, (str, os.PathLike)):
        files = str(files).split(",")
    return [str(f).strip() for f in files if str(f).strip()]


def _read_files(paths: list[str], infos: list[TensorInfo], input_shapes: dict) -> dict:
    """{input name: (source, array)}; .bin files are read flat and shaped later."""
    for p in paths:
        if not Path(p).is_file():
            raise OnnxError(f"input file {p} does not exist")
        if Path(p).suffix.lower() not in (".npy", ".npz", ".bin"):
            raise OnnxError(f"input file {p}: use .npy, .npz or .bin (raw, dtype from the model)")
    if len(paths) == 1 and paths[0].lower().endswith(".npz"):
        return _read_npz(paths[0], infos)
    if len(paths) != len(infos):
        raise OnnxError(f"{len(paths)} input file(s) given for {len(infos)} model input(s) "
                        f"({', '.join(i.name for i in infos)}); give one per input, comma-separated, "
                        f"in that order")
    out = {}
    for path, info in zip(paths, infos):
        suffix = Path(path).suffix.lower()
        if suffix == ".npy":
            out[info.name] = (path, _load_npy(path))
        elif suffix == ".bin":
            out[info.name] = (path, _load_bin(path, info, input_shapes.get(info.name)))
        else:
            arrays = _read_npz(path, [info])
            out[info.name] = arrays[info.name]
    return out


def _load_npy(path: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise OnnxError(f"{path} is not a readable .npy array ({exc}); save it with numpy.save") from None


def _read_npz(path: str, infos: list[TensorInfo]) -> dict:
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (ValueError, OSError) as exc:
        raise OnnxError(f"{path} is not a readable .npz archive ({exc})") from None
    names = [i.name for i in infos]
    if all(n in data for n in names):
        return {n: (f"{path}[{n}]", data[n]) for n in names}
    # np.savez(path, a, b) names arrays arr_0, arr_1, ...: that order is the user's stated order.
    positional = [f"arr_{i}" for i in range(len(names))]
    if sorted(data) == positional:
        return {n: (f"{path}[{k}]", data[k]) for n, k in zip(names, positional)}
    raise OnnxError(f"{path} holds {', '.join(sorted(data)) or 'nothing'}; name its arrays after the "
                    f"model inputs ({', '.join(names)}), e.g. np.savez(path, **{{name: array}})")


def _load_bin(path: str, info: TensorInfo, given_shape) -> np.ndarray:
    dtype = numpy_dtype(info.elem_type)
    size = os.path.getsize(path)
    if size % dtype.itemsize:
        raise OnnxError(f"{path}: {size} bytes is not a whole number of {dtype} values "
                        f"(input '{info.name}' is {dtype})")
    flat = np.fromfile(path, dtype=dtype)
    shape = given_shape or info.shape
    if shape is None:
        raise OnnxError(f"{path}: the model does not give the shape of '{info.name}'; "
                        f"use --input-shape '{info.name}:D0,D1,...'")
    sample = shape[1:]
    if any(not isinstance(d, int) or d <= 0 for d in sample):
        raise OnnxError(f"{path}: input '{info.name}' has dynamic dimensions {list(shape)}; a raw "
                        f".bin has no shape, so give it: --input-shape '{info.name}:D0,D1,...'")
    per_sample = int(np.prod(sample, dtype=np.int64)) if sample else 1
    if len(shape) == 0:
        if flat.size != 1:
            raise OnnxError(f"{path}: input '{info.name}' is a scalar but the file holds {flat.size} values")
        return flat.reshape(())
    if flat.size % per_sample or flat.size == 0:
        raise OnnxError(f"{path}: {flat.size} {dtype} values do not fill whole samples of shape "
                        f"{list(sample)} for input '{info.name}'")
    return flat.reshape((flat.size // per_sample, *sample))


def _fit(info: TensorInfo, array: np.ndarray, given_shape, source: str, notes: list) -> np.ndarray:
    """Cast and reshape one array to what the model accepts; every change goes into notes."""
    dtype = numpy_dtype(info.elem_type)
    if array.dtype != dtype:
        same_kind = (array.dtype.kind in "f" and dtype.kind == "f") or \
                    (array.dtype.kind in "iu" and dtype.kind in "iu") or \
                    (array.dtype.kind == "b" and dtype.kind == "b")
        if not same_kind:
            raise OnnxError(f"{source} holds {array.dtype} but input '{info.name}' is {dtype}; "
                            f"save the data as {dtype}")
        notes.append(f"{info.name}: cast {array.dtype} from {source} to the model's {dtype}")
        array = array.astype(dtype)
    want = given_shape or info.shape
    if want is None:
        return array
    if array.ndim == len(want) - 1 and len(want) >= 1 and \
            _dims_agree(array.shape, want[1:]):
        array = array[None]
        notes.append(f"{info.name}: {source} has no batch axis; added one")
    if array.ndim != len(want):
        raise OnnxError(f"{source} has shape {list(array.shape)} but input '{info.name}' expects "
                        f"{_show(want)}")
    if not _dims_agree(array.shape[1:], want[1:]):
        raise OnnxError(f"{source} has shape {list(array.shape)} but input '{info.name}' expects "
                        f"{_show(want)} (only the batch dimension may differ)")
    dynamic = [f"{d}={n}" for d, n in zip(want, array.shape) if not isinstance(d, int) or d <= 0]
    if dynamic:
        notes.append(f"{info.name}: dynamic dimension(s) {', '.join(dynamic)} taken from {source}")
    batch = want[0] if want else None
    if isinstance(batch, int) and batch > 0 and array.shape[0] != batch:
        have = array.shape[0]
        if have > batch:
            notes.append(f"{info.name}: {source} holds {have} samples, the model takes {batch}; "
                         f"used the first {batch}")
            array = array[:batch]
        else:
            reps = -(-batch // have)
            notes.append(f"{info.name}: {source} holds {have} sample(s), the model takes {batch}; "
                         f"repeated them to fill the batch")
            array = np.concatenate([array] * reps, axis=0)[:batch]
    return np.ascontiguousarray(array)


def _dims_agree(have, want) -> bool:
    return len(have) == len(want) and all(not isinstance(w, int) or w <= 0 or h == w
                                          for h, w in zip(have, want))


def _show(shape) -> str:
    return "[" + ", ".join(str(d) if d not in (None, "") else "?" for d in shape) + "]"


def _random_inputs(model, infos, input_shapes, seed, prepared: PreparedInputs) -> None:
    rng = np.random.default_rng(seed)
    index = GraphIndex(model)
    for info in infos:
        shape = input_shapes.get(info.name) or info.shape
        if shape is None:
            raise OnnxError(f"input '{info.name}' has no declared shape; give it with "
                            f"--input-shape '{info.name}:D0,D1,...' or pass data with -i")
        dynamic = [i for i, d in enumerate(shape) if not isinstance(d, int) or d <= 0]
        if dynamic:
            prepared.notes.append(f"{info.name}: dynamic dimension(s) {_show(shape)} set to 1; "
                                  f"use --input-shape to choose")
            shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in shape)
        dtype = numpy_dtype(info.elem_type)
        if dtype.kind == "f":
            array = rng.uniform(*FLOAT_RANGE, size=shape).astype(dtype)
            what = f"uniform [{FLOAT_RANGE[0]}, {FLOAT_RANGE[1]})"
        elif dtype.kind in "iu":
            high = _index_limit(index, info.name) or DEFAULT_INT_HIGH
            array = rng.integers(0, high, size=shape).astype(dtype)
            what = f"integers in [0, {high})"
        elif dtype.kind == "b":
            array = rng.random(size=shape) < 0.5
            what = "random booleans"
        else:
            raise OnnxError(f"cannot generate random data of type {dtype} for input '{info.name}'; "
                            f"pass it with -i")
        prepared.feeds[info.name] = array
        prepared.sources[info.name] = f"random(seed={seed})"
        prepared.notes.append(f"{info.name}: random {what}, shape {list(shape)}, seed {seed}")


def _index_limit(index: GraphIndex, name: str) -> Optional[int]:
    """Upper bound for an integer input used as Gather indices into a constant table (token ids)."""
    limits = []
    for node in index.consumers.get(name, []):
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name:
            table = index.initializers.get(node.input[0])
            if table is not None and len(table.dims):
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                limits.append(int(table.dims[axis]))
    return min(limits) if limits else None
