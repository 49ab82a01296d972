"""Kernel capture behind one interface: what a source learns of a kernel is a `KernelInfo`, and
one recorder records its calls whatever the backend. The C++ source runs in tests/compile and
test_records_unchanged; the Triton source has not run on a GPU (kernel_triton.py), so here it
runs as far as a CPU allows: its seam on this torch's real launcher class, patched and put
back, and a launch recorded through a CPU stand-in of that class."""
from __future__ import annotations

import json
import math
import types
from pathlib import Path

import pytest
import torch

import opdiff
from opdiff.capture.kernel_catalog import KernelCatalog, role
from opdiff.capture.kernel_modules import match_lines, scheduled
from opdiff.capture.kernel_recorder import KernelRecorder
from opdiff.capture.kernel_triton import NO_PROGRAM, TritonSource, launcher_name, launcher_params


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(path.rglob("records.jsonl"))
            for line in f.read_text().splitlines() if line]


def test_both_backends_name_their_arguments_roles_alike():
    cpp = ["in_ptr0", "in_ptr1", "in_out_ptr0", "out_ptr0", "ks0"]
    triton = ["in_out_ptr0", "in_ptr0", "out_ptr1", "xnumel", "r0_numel"]
    assert [role(p) for p in cpp] == ["in", "in", "in_out", "out", ""]
    assert [role(p) for p in triton] == ["in_out", "in", "out", "", ""]


def test_a_catalog_binds_a_collected_program_or_says_why_there_is_none():
    catalog = KernelCatalog()
    program = {"steps": [{"op": "Aten.add", "args": [{"ref": "input", "index": "in_ptr1"},
                                                      {"ref": "input", "index": "in_ptr0"}],
                          "kwargs": {}}],
               "outputs": [{"output": "out_ptr0", "value": {"ref": "step", "index": 0}}]}
    catalog.generated("/tmp/w.py", {"cpp_fused_add_0": program})
    info = catalog.info("cpp_fused_add_0", "cpp", "/tmp/w.py", ["in_ptr0", "in_ptr1", "out_ptr0"])
    assert info.roles == ("in", "in", "out")
    assert info.program["steps"][0]["args"] == [{"ref": "input", "index": 1}, {"ref": "input", "index": 0}]
    assert info.program["outputs"] == [{"output": 0, "value": {"ref": "step", "index": 0}}]
    other = catalog.info("cpp_fused_mul_1", "cpp", "/tmp/w.py", ["in_ptr0", "out_ptr0"])
    assert "did not generate" in other.program["unmapped"]


def test_triton_call_lines_get_the_modules_of_their_kernels():
    """A Triton wrapper calls each kernel through its launcher (`name.run(`): the i-th
    definition of a kernel is its i-th launch line, as for C++ kernels' calls."""
    wrapper = "\n".join([
        "def call(args):",
        "    arg0_1, arg1_1 = args",
        "    buf0 = empty_strided_cuda((4, 16), (16, 1), torch.float32)",
        "    extern_kernels.mm(arg0_1, arg1_1, out=buf0)",
        "    triton_poi_fused_gelu_0.run(buf0, 64, stream=stream0)",
        "    triton_per_fused_native_layer_norm_1.run(buf0, buf1, 4, 16, stream=stream0)",
        "    triton_poi_fused_gelu_0.run(buf1, 64, stream=stream0)",
        "    return (buf1, )",
    ])
    calls = [("extern", "", ["fc1"]), ("kernel", "triton_poi_fused_gelu_0", ["act1"]),
             ("kernel", "triton_per_fused_native_layer_norm_1", ["norm"]),
             ("kernel", "triton_poi_fused_gelu_0", ["act2"])]
    assert match_lines(wrapper, calls) == {4: ["fc1"], 5: ["act1"], 6: ["norm"], 7: ["act2"]}

    class Marker:       # (Triton's node schedule holds reduction markers beside its nodes)
        pass

    class Node:
        def get_nodes(self):
            return [self]
    node = Node()
    assert scheduled([Marker(), node, Marker()]) == [node]


def test_the_launchers_seam_is_patched_and_put_back_on_this_torch():
    heuristics = pytest.importorskip("torch._inductor.runtime.triton_heuristics")
    original = heuristics.CachingAutotuner.__dict__["run"]
    source = TritonSource(KernelCatalog(), KernelRecorder(None))
    source.start()          # (imported above: patched now)
    try:
        assert heuristics.CachingAutotuner.__dict__["run"] is not original
    finally:
        source.stop()
    assert heuristics.CachingAutotuner.__dict__["run"] is original


class _Launcher:
    """A CPU stand-in of Inductor's `CachingAutotuner`: the attributes TritonSource reads, and a
    `run` that computes what `triton_poi_fused_add_mul_0` would (out = (a + b) * 2)."""

    def __init__(self):
        self.triton_meta = {"signature": {"in_ptr0": "*fp32", "in_ptr1": "*fp32",
                                          "out_ptr0": "*fp32", "xnumel": "i32"}}
        self.inductor_meta = {"kernel_name": "triton_poi_fused_add_mul_0"}
        self.launches = 0

    def run(self, a, b, out, xnumel, stream=None, benchmark_run=False):
        self.launches += 1
        torch.mul(a + b, 2, out=out)


def test_a_triton_launch_is_recorded_like_a_cpp_kernels_call(tmp_path):
    """Through the stand-in launcher, in a real dump at L2: one kernel record with its inputs
    before and its output after the launch, the wrapper's file and line; the autotuner's
    benchmark runs are not recorded; the launch computes what it computes without opdiff."""
    heuristics = types.SimpleNamespace(CachingAutotuner=_Launcher)
    original = _Launcher.__dict__["run"]
    launcher = _Launcher()
    assert launcher_name(launcher) == "triton_poi_fused_add_mul_0"
    assert launcher_params(launcher) == ["in_ptr0", "in_ptr1", "out_ptr0", "xnumel"]
    torch.manual_seed(0)
    a, b = torch.randn(4, 16), torch.randn(4, 16)
    model = torch.nn.Linear(2, 2)
    dbg = opdiff.PrecisionDebugger(dump_path=str(tmp_path), level="L2")
    source = TritonSource(KernelCatalog(), KernelRecorder(dbg.session))
    source.hook(heuristics)
    try:
        dbg.start(model)
        out = torch.empty(4, 16)
        launcher.run(a, b, out, 64, stream=0)
        launcher.run(a, b, torch.empty(4, 16), 64, stream=0, benchmark_run=True)
        dbg.stop()
        dbg.step()
    finally:
        source.stop()
    assert _Launcher.__dict__["run"] is original
    assert launcher.launches == 2 and torch.equal(out, (a + b) * 2)
    kernels = [r for r in _records(tmp_path) if r["kind"] == "kernel"]
    assert [r["name"] for r in kernels] == ["Inductor.triton_poi_fused_add_mul_0.0.forward"]
    rec = kernels[0]
    assert rec["compiled"]["graph"] == Path(__file__).name and rec["compiled"]["backend"] == "inductor"
    assert rec["compiled"]["node"] == "triton_poi_fused_add_mul_0"
    assert [d["shape"] for d in rec["inputs"]] == [[4, 16], [4, 16]] and len(rec["outputs"]) == 1
    want = (a.double() + b.double()) * 2
    assert rec["outputs"][0]["stats"]["max"] == pytest.approx(out.max().item())
    assert math.isclose(rec["outputs"][0]["stats"]["norm"], want.norm().item(), rel_tol=1e-5)
    assert rec["inputs"][0]["stats"]["mean"] == pytest.approx(a.double().mean().item(), rel=1e-6)
    assert "program" not in rec             # (a statistics dump carries none)
    assert source.info(launcher, __file__).program == {"unmapped": NO_PROGRAM}
