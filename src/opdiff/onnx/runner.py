"""Run an ONNX model in ONNX Runtime with every intermediate tensor exposed, and check the cost.

    options = RuntimeOptions(optimization="disable_all")
    run = run_model(load_model("model.onnx"), "model.onnx", feeds, options)
    run.tensors["/fc1/Gemm_output_0"]      # every node output, the inputs and the initializers
    run.observer.changed                    # did exposing intermediates change the final outputs?

One session per side: all node outputs become graph outputs, typed from shape inference so
fp16 and integer tensors keep their type. Exposing a tensor can change what the runtime
computes (a fused region is split; on CPU an fp16 value is rounded where it used to stay in
fp32), so the untouched model is run too and its final outputs are compared with the exposed run.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from .deps import OnnxError, require

log = logging.getLogger("opdiff")

OPTIMIZATION_LEVELS = ("disable_all", "basic", "extended", "all")
_PROTO_LIMIT = 1_900_000_000   # protobuf cannot serialise a model past 2 GiB in one piece


@dataclass(frozen=True)
class RuntimeOptions:
    """How ONNX Runtime runs one side: execution providers and graph optimisation level."""
    providers: tuple = ("CPUExecutionProvider",)
    optimization: str = "all"          # ONNX Runtime's own default (ORT_ENABLE_ALL)
    threads: int = 0                   # 0: ONNX Runtime decides

    def describe(self) -> str:
        providers = ",".join(p.replace("ExecutionProvider", "") for p in self.providers)
        return f"onnxruntime {providers}, optimization={self.optimization}"

    def session_options(self):
        _, ort = require()
        if self.optimization not in OPTIMIZATION_LEVELS:
            raise OnnxError(f"unknown optimization level '{self.optimization}'; use one of "
                            f"{', '.join(OPTIMIZATION_LEVELS)}")
        level = {"disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                 "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                 "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                 "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[self.optimization]
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.log_severity_level = 3
        if self.threads:
            so.intra_op_num_threads = self.threads
        return so

    def checked_providers(self) -> list:
        _, ort = require()
        available = ort.get_available_providers()
        providers = [p if p.endswith("ExecutionProvider") else f"{p}ExecutionProvider"
                     for p in self.providers]
        missing = [p for p in providers if p not in available]
        if missing:
            raise OnnxError(f"execution provider {', '.join(missing)} is not available in this "
                            f"onnxruntime (available: {', '.join(available)})")
        return providers


@dataclass
class ObserverCheck:
    """Final outputs of the untouched model against the run with every intermediate exposed."""
    changed: bool
    details: list = field(default_factory=list)   # one sentence per output that differs

    def summary(self) -> str:
        if not self.changed:
            return "exposing intermediate tensors did not change the final outputs (bitwise equal)"
        return "exposing intermediate tensors changed the final outputs: " + "; ".join(self.details)


@dataclass
class ModelRun:
    """Everything one side computed, by ONNX tensor name."""
    tensors: dict                      # graph inputs, initializers and every node output
    outputs: list                      # the model's own output names
    observer: ObserverCheck
    seconds: float
    options: RuntimeOptions


def load_model(path: "str | os.PathLike"):
    """An onnx.ModelProto with its external data, or OnnxError saying what is wrong with the file."""
    onnx, _ = require()
    p = Path(path)
    if not p.is_file():
        raise OnnxError(f"model {p} does not exist")
    try:
        model = onnx.load(str(p))
    except Exception as exc:  # protobuf's DecodeError and friends
        raise OnnxError(f"{p} is not a readable ONNX model ({type(exc).__name__}: {exc})") from None
    if not model.graph.node:
        raise OnnxError(f"{p} has no nodes; is it an ONNX model?")
    return model


def instrument(model):
    """A copy of model whose graph outputs are every top-level node output, typed where known."""
    onnx, _ = require()
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    types = _inferred_types(model)
    present = {o.name for o in exposed.graph.output}
    for node in exposed.graph.node:
        for name in node.output:
            if not name or name in present:
                continue
            present.add(name)
            elem = types.get(name, 0)
            if elem:
                exposed.graph.output.append(onnx.helper.make_tensor_value_info(name, elem, None))
            else:
                exposed.graph.output.append(onnx.ValueInfoProto(name=name))
    return exposed


def _inferred_types(model) -> dict:
    onnx, _ = require()
    types = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model) if model.ByteSize() < _PROTO_LIMIT else model
    except Exception as exc:  # inference is best effort; ORT types what it can at run time
        log.info("opdiff: shape inference failed (%s); intermediate outputs stay untyped", exc)
        inferred = model
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def make_session(model_or_path, options: RuntimeOptions):
    """An InferenceSession from a path or a ModelProto (saved to a private temp dir past 2 GiB)."""
    onnx, ort = require()
    so, providers = options.session_options(), options.checked_providers()
    try:
        if isinstance(model_or_path, (str, os.PathLike)):
            return ort.InferenceSession(str(model_or_path), so, providers=providers)
        if model_or_path.ByteSize() < _PROTO_LIMIT:
            return ort.InferenceSession(model_or_path.SerializeToString(), so, providers=providers)
        with tempfile.TemporaryDirectory(prefix="opdiff_onnx_") as tmp:
            path = os.path.join(tmp, "model.onnx")
            onnx.save(model_or_path, path, save_as_external_data=True, location="model.data")
            return ort.InferenceSession(path, so, providers=providers)
    except OnnxError:
        raise
    except Exception as exc:
        raise OnnxError(f"onnxruntime cannot load the model: {str(exc).splitlines()[0]}") from None


def run_session(session, feeds: dict, names: Optional[list] = None) -> dict:
    names = names or [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    try:
        values = session.run(names, {k: v for k, v in feeds.items() if k in wanted})
    except Exception as exc:
        raise OnnxError(f"onnxruntime failed to run the model: {str(exc).splitlines()[0]}") from None
    return {n: v for n, v in zip(names, values) if isinstance(v, np.ndarray)}


def run_model(model, path, feeds: dict, options: RuntimeOptions) -> ModelRun:
    """Run the untouched model and the exposed copy; return every tensor and the observer check."""
    onnx, _ = require()
    start = time.perf_counter()
    outputs = [o.name for o in model.graph.output]
    plain = run_session(make_session(path if path else model, options), feeds, outputs)
    values = run_session(make_session(instrument(model), options), feeds)
    tensors = {name: feeds[name] for name in feeds}
    for init in model.graph.initializer:
        try:
            tensors[init.name] = onnx.numpy_helper.to_array(init)
        except Exception as exc:  # an exotic dtype numpy cannot hold: say so, keep going
            log.info("opdiff: initializer %s not readable (%s)", init.name, exc)
    tensors.update(values)
    observer = observe(plain, values, outputs)
    return ModelRun(tensors=tensors, outputs=outputs, observer=observer,
                    seconds=time.perf_counter() - start, options=options)


def observe(plain: dict, exposed: dict, outputs: list) -> ObserverCheck:
    """Compare the final outputs of the untouched run with the exposed run."""
    details = []
    for name in outputs:
        a, b = plain.get(name), exposed.get(name)
        if a is None or b is None:
            continue
        if a.shape != b.shape:
            details.append(f"{name}: shape {list(a.shape)} became {list(b.shape)}")
            continue
        if a.dtype.kind not in "fc":
            if not np.array_equal(a, b):
                details.append(f"{name}: values differ")
            continue
        fa, fb = np.isfinite(a), np.isfinite(b)
        if (fa != fb).any():
            details.append(f"{name}: {int((fa & ~fb).sum())} value(s) finite untouched but inf/NaN "
                           f"when exposed, {int((~fa & fb).sum())} the other way")
            continue
        if not np.array_equal(a, b, equal_nan=True):
            diff = np.abs(a[fa].astype(np.float64) - b[fb].astype(np.float64)).max()
            details.append(f"{name}: max abs difference {diff:.3g}")
    return ObserverCheck(changed=bool(details), details=details)
