"""A PyTorch module against its own ONNX export, layer by layer.

    cmp = compare_torch("my_module.py:build_model", "model.onnx", output_path="./out")
    for row in cmp.result.rows: row.module, row.result      # "layer1.0.conv", "pass"

`build_model()` returns a module, or (module, example_inputs). The module runs in eval mode with
a forward hook per submodule; each module's output is paired with the ONNX tensor where the
module's region of the graph ends. The region comes from the exporter: dynamo exports carry
`pkg.torch.onnx.name_scopes` on every node, TorchScript exports encode the scope in node names
(`/layer1/layer1.0/conv/Conv`). When the exporter folded a BatchNorm into the preceding Conv,
the Conv's ONNX output is compared with the BatchNorm module's output, not the Conv's.
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ..store.frames import is_internal
from ..store import schema
from ..store.schema import Kind, Location, Phase, Role
from .deps import OnnxError, require
from .dumping import OnnxDump
from .graph import GraphIndex
from .inputs import PreparedInputs, prepare_inputs
from .matching import RULE_BATCHNORM, RULE_NAME, RULE_TORCH, Matching, TensorPair
from .model_compare import annotate, dump_side, finish, output_folder, write_outputs
from .policy import MsitPolicy, MsitThresholds
from .runner import RuntimeOptions, load_model, run_model
from .scoring import LIVE_SOURCES, TITLE, ModelComparison, Side, locate, score

log = logging.getLogger("opdiff")

_BATCHNORMS = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d")
_CONVS = ("Conv1d", "Conv2d", "Conv3d", "Linear")


def load_builder(spec: str):
    """Import `file.py:function`, call it; return (module, example_inputs or None)."""
    import torch

    path, sep, func = spec.rpartition(":")
    if not sep or not path or not func:
        raise OnnxError(f"--torch '{spec}' is not FILE.py:FUNCTION; example: --torch my_model.py:build_model")
    file = Path(path)
    if not file.is_file():
        raise OnnxError(f"--torch: {file} does not exist")
    name = f"opdiff_user_{abs(hash(str(file.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(name, file)
    if module_spec is None or module_spec.loader is None:
        raise OnnxError(f"--torch: {file} cannot be imported as a Python module; give a .py file")
    user = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = user
    try:
        module_spec.loader.exec_module(user)
    except Exception as exc:
        raise OnnxError(f"--torch: importing {file} failed: {type(exc).__name__}: {exc}") from None
    builder = getattr(user, func, None)
    if not callable(builder):
        raise OnnxError(f"--torch: {file} has no function '{func}'")
    try:
        built = builder()
    except Exception as exc:
        raise OnnxError(f"--torch: {func}() raised {type(exc).__name__}: {exc}") from None
    example = None
    if isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], torch.nn.Module):
        built, example = built
        example = example if isinstance(example, (tuple, list)) else (example,)
    if not isinstance(built, torch.nn.Module):
        raise OnnxError(f"--torch: {func}() returned {type(built).__name__}; return an nn.Module "
                        f"or (module, example_inputs)")
    return built, example


@dataclass
class ModuleCall:
    path: str                  # "" for the root module
    cls: str
    output: Optional[np.ndarray]
    calls: int = 1
    input_ids: tuple = ()
    output_id: Optional[int] = None
    location: Optional[Location] = None

    @property
    def op(self) -> str:
        """The module call's op as capture writes it: `Module.{path}.{Class}`."""
        return schema.module_op(self.path, self.cls)

    @property
    def record_name(self) -> str:
        return schema.record_name(self.op, Phase.FORWARD, 0, Kind.MODULE)

    @property
    def tensor_name(self) -> str:
        return schema.tensor_name(self.record_name, Role.OUTPUT, 0)


def run_torch(module, args: list) -> list:
    """Run module(*args) once with a forward hook on every submodule; ModuleCall per module, in
    completion order. Hooks are removed however the forward ends."""
    import torch

    calls: dict = {}
    keep = []      # outputs stay referenced so ids stay unique during the run
    handles = []
    order = []

    def pre_hook(path):
        def hook(mod, inputs):
            call = calls.get(path)
            if call is not None:
                call.calls += 1
                return
            calls[path] = ModuleCall(path, type(mod).__name__, None,
                                     input_ids=tuple(id(x) for x in inputs if isinstance(x, torch.Tensor)),
                                     location=_user_frame())
        return hook

    def post_hook(path):
        def hook(mod, inputs, output):
            call = calls[path]
            if call.calls > 1 or call.output is not None:
                return
            if isinstance(output, torch.Tensor):
                keep.append(output)
                call.output_id = id(output)
                call.output = output.detach().to("cpu").numpy().copy() if output.dtype != torch.bfloat16 \
                    else output.detach().float().cpu().numpy()
            order.append(path)
        return hook

    for path, sub in module.named_modules():
        handles.append(sub.register_forward_pre_hook(pre_hook(path)))
        handles.append(sub.register_forward_hook(post_hook(path)))
    try:
        with torch.no_grad():
            module(*args)
    except Exception as exc:
        raise OnnxError(f"--torch: the module's forward raised {type(exc).__name__}: {exc}") from None
    finally:
        for h in handles:
            h.remove()
    return [calls[p] for p in order]


def _user_frame() -> Optional[Location]:
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not is_internal(frame.filename):
            LIVE_SOURCES.add(frame.filename)    # this process runs it: its lines may be shown
            return Location(frame.filename, frame.lineno or 0, (frame.line or "").strip(), frame.name)
    return None


def match_modules(t: GraphIndex, available, calls: list, module_paths: set) -> Matching:
    """Pair each module's output with the ONNX tensor where its region of the graph ends."""
    matching = Matching()
    owner = {}                              # node id -> module path
    for node in t.nodes:
        path = _known_path(t.module_of(node), module_paths)
        if path is not None:
            owner[id(node)] = path
    by_path = {c.path: c for c in calls}
    by_output = {c.output_id: c for c in calls if c.output_id is not None}
    exits = {c.path: _exit_tensor(t, owner, c.path, available) for c in calls}
    # TorchScript exports fold an eval BatchNorm into the Conv before it: the BN has no node.
    folded_into = {}
    for c in calls:
        if c.cls in _BATCHNORMS and exits.get(c.path) is None and len(c.input_ids) == 1:
            conv = by_output.get(c.input_ids[0])
            if conv is not None and conv.cls in _CONVS and exits.get(conv.path):
                folded_into[conv.path] = c.path
    candidates = []
    for c in calls:
        if c.path == "" or c.output is None:
            continue
        if c.calls > 1:
            matching.unmatched_golden.append((c.tensor_name, f"module {c.path} runs {c.calls} times; "
                                                             f"its ONNX nodes cannot be told apart"))
            continue
        if c.path in folded_into:
            matching.unmatched_golden.append((c.tensor_name, f"the exporter folded {folded_into[c.path]} "
                                                             f"into this {c.cls}; compared after the BatchNorm"))
            continue
        rule, tensor = RULE_TORCH, exits.get(c.path)
        if tensor is None:
            conv = next((k for k, v in folded_into.items() if v == c.path), None)
            tensor, rule = (exits[conv], RULE_BATCHNORM) if conv else (None, rule)
        if tensor is None:
            follower = next((b for b in calls if b.cls in _BATCHNORMS and c.output_id in b.input_ids
                             and exits.get(b.path)), None)
            why = (f"the exporter fused this {c.cls} with {follower.path}; compared after the BatchNorm"
                   if follower is not None else
                   f"no ONNX node carries module {c.path} (fused or folded by the exporter)")
            matching.unmatched_golden.append((c.tensor_name, why))
            continue
        if np.size(available[tensor]) != c.output.size:
            matching.unmatched_golden.append((c.tensor_name, f"module output {list(c.output.shape)} does "
                                                             f"not fit ONNX tensor {tensor} "
                                                             f"{list(np.shape(available[tensor]))}"))
            continue
        node = t.producer[tensor]
        candidates.append((t.position(node), -c.path.count("."), c, tensor, rule))
    root = by_path.get("")
    if root is not None and root.output is not None and len(t.outputs) == 1 and t.outputs[0] in available:
        node = t.producer.get(t.outputs[0])
        candidates.append((t.position(node) if node is not None else len(t.nodes), 1, root,
                           t.outputs[0], RULE_NAME))
    used = set()
    for pos, _, c, tensor, rule in sorted(candidates, key=lambda x: (x[0], x[1])):
        used.add(tensor)
        location = t.location_of(t.producer[tensor]) if tensor in t.producer else None
        if location is None or is_internal(location.file):
            location = c.location
        matching.pairs.append(TensorPair(c.tensor_name, tensor, rule, Role.OUTPUT, pos, c.record_name,
                                         c.cls, c.path or "(model)", location))
    for node in t.nodes:
        for name in node.output:
            if name and name in available and name not in used:
                why = ("inside a module's region (not its output)" if id(node) in owner else
                       "written by a functional call, not by a submodule")
                matching.unmatched_target.append((name, why))
    return matching


def _known_path(path: Optional[str], module_paths: set) -> Optional[str]:
    """The longest prefix of an exporter scope that names a real submodule."""
    while path:
        if path in module_paths:
            return path
        path = path.rpartition(".")[0]
    return None


def _exit_tensor(t: GraphIndex, owner: dict, path: str, available) -> Optional[str]:
    """The last tensor written inside the module's region and read outside it (or a graph output)."""
    inside = lambda node: owner.get(id(node)) is not None and \
        (owner[id(node)] == path or owner[id(node)].startswith(path + "."))   # noqa: E731
    best = None
    for node in t.nodes:
        if not inside(node):
            continue
        for name in node.output:
            if not name or name not in available:
                continue
            leaves = name in t.outputs or any(not inside(u) for u in t.consumers.get(name, []))
            if leaves:
                best = name
    return best


def compare_torch(builder: str, target, *, inputs=None, output_path=None,
                  target_options: Optional[RuntimeOptions] = None, input_shapes=None, seed: int = 0,
                  thresholds: Optional[MsitThresholds] = None, save_tensors: bool = True) -> ModelComparison:
    """PyTorch module (golden) against an ONNX model (target), every matched layer named by module."""
    require()
    import torch

    clock = {"start": time.perf_counter()}
    target_options = target_options or RuntimeOptions()
    policy = MsitPolicy(thresholds)
    module, example = load_builder(builder)
    t_model = load_model(target)
    notes = []
    if module.training:
        module.eval()
        notes.append("the PyTorch module was put in eval mode (exports are made in eval mode)")
    names = [i.name for i in t_model.graph.input if i.name not in {x.name for x in t_model.graph.initializer}]
    if inputs is None and example is not None:
        if len(example) != len(names):
            raise OnnxError(f"build function returned {len(example)} example input(s) but the ONNX model "
                            f"takes {len(names)} ({', '.join(names)})")
        prepared = PreparedInputs(
            feeds={n: torch.as_tensor(x).detach().cpu().numpy() for n, x in zip(names, example)},
            sources={n: "example_inputs" for n in names},
            notes=["inputs: the example inputs returned by the build function"])
    else:
        prepared = prepare_inputs(t_model, inputs, input_shapes=input_shapes, seed=seed)
    notes += prepared.notes
    clock["load"] = time.perf_counter()
    calls = run_torch(module, [torch.from_numpy(np.array(prepared.feeds[n])) for n in names])
    t_run = run_model(t_model, target, prepared.feeds, target_options)
    clock["run"] = time.perf_counter()
    t = GraphIndex(t_model)
    matching = match_modules(t, t_run.tensors, calls, {p for p, _ in module.named_modules()})
    golden_tensors = {c.tensor_name: c.output for c in calls if c.output is not None}
    golden = Side(f"{builder} (PyTorch {torch.__version__}, eval)", golden_tensors, None)
    target_side = Side(f"{target} ({target_options.describe()})", t_run.tensors, t_run.observer, t)
    cmp = score(golden, target_side, matching, policy, notes)
    cmp.local_check = locate(cmp, t_model, t, golden, target_side, target_options, policy)
    clock["compare"] = time.perf_counter()
    with contextlib.ExitStack() as held:   # OUT is held from the dumps to the reports
        if output_path is not None:
            keep = [builder.rpartition(":")[0], target, *prepared.sources.values()]
            out, root, stamp = output_folder(held, output_path, keep)
            meta = {"tool": TITLE, "inputs": prepared.sources}
            dump = OnnxDump(root / "golden", {**meta, "side": "golden", "model": builder,
                                              "runtime": f"PyTorch {torch.__version__}"}, save_tensors)
            for c in calls:
                if c.output is not None:
                    dump.record(c.record_name, c.op, [], [c.tensor_name], golden_tensors,
                                module=c.path or None, location=c.location, kind=Kind.MODULE)
            cmp.dumps["golden"] = str(dump.close())
            cmp.dumps["target"] = dump_side(root, "target", t, t_run, target, target_options, meta,
                                            save_tensors)
            clock["dump"] = time.perf_counter()
        finish(cmp, clock)
        annotate(cmp)
        if output_path is not None:
            write_outputs(cmp, out, stamp)
    return cmp
