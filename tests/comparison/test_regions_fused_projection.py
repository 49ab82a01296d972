"""A fused op against its composite, where the parameters differ in shape between the runs.

Golden projects q, k and v with three `Linear` modules (`q_proj`, `k_proj`, `v_proj`), the
target with one fused `qkv_proj` holding the same weights, then `.split`. Neither the projection
calls nor the parameters pair, so the ops between x and the paired `q @ k.T` form one region
whose parameters have no golden partner. A 2% fault in the fused linear used to get "no op is
to blame" (the region was silently not judged); it must name the region, or say
"inconclusive: ...". The same for a fused SwiGLU made with `torch.library.custom_op` against
`silu(a) * b`. Healthy pairs name nothing.

With a mapping file's `concat:` line (`qkv_proj: [q_proj, k_proj, v_proj]`) golden's three
projections are joined into one call against the fused one: its output, parameters and
gradients are compared, a fault in the fused linear names the region inside that call, and a
wrongly loaded fused weight is named as the parameter it is.
"""
from __future__ import annotations

import json
import shutil
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator

import pytest
import torch
import torch.nn.functional as F

import opdiff
from opdiff.cli import main
from opdiff.report.console import verdict_line
from opdiff.testing import inject_fault

TASKS = ("tensor", "statistics")


class SplitAttention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(8, 8)
        self.k_proj = torch.nn.Linear(8, 8)
        self.v_proj = torch.nn.Linear(8, 8)
        self.o = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self.o(torch.softmax(q @ k.T, -1) @ v)


class FusedAttention(torch.nn.Module):
    def __init__(self, src: SplitAttention) -> None:
        super().__init__()
        self.qkv_proj = torch.nn.Linear(8, 24)
        self.o = torch.nn.Linear(8, 8)
        with torch.no_grad():
            self.qkv_proj.weight.copy_(torch.cat([src.q_proj.weight, src.k_proj.weight,
                                                  src.v_proj.weight]))
            self.qkv_proj.bias.copy_(torch.cat([src.q_proj.bias, src.k_proj.bias,
                                                src.v_proj.bias]))
            self.o.load_state_dict(src.o.state_dict())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split(8, -1)
        return self.o(torch.softmax(q @ k.T, -1) @ v)


class Model(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module, name: str = "attn") -> None:
        super().__init__()
        self.name = name
        self.add_module(name, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.name)(x)


SWIGLU_SCALE = [1.0]        # the fused kernel's fault (1.0: healthy)


@torch.library.custom_op("opdiff_fusedproj_test::swiglu", mutates_args=())
def fused_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(a) * b * SWIGLU_SCALE[0]


@fused_swiglu.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(a)


def _swiglu_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _swiglu_backward(ctx, grad: torch.Tensor):
    a, b = ctx.saved_tensors
    s = torch.sigmoid(a)
    return (grad * b * s * (1 + a * (1 - s)) * SWIGLU_SCALE[0],
            grad * F.silu(a) * SWIGLU_SCALE[0])


fused_swiglu.register_autograd(_swiglu_backward, setup_context=_swiglu_context)


class MLP(torch.nn.Module):
    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.fused = fused
        self.gate = torch.nn.Linear(8, 16)
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.gate(x), self.up(x)
        return self.down(fused_swiglu(a, b) if self.fused else F.silu(a) * b)


def _dump(model: torch.nn.Module, path: Path, task: str, fault: bool, linear: bool,
          weight: bool = False, later: bool = False) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    model.zero_grad(set_to_none=True)       # (each model is dumped several times)
    torch.manual_seed(1)
    x = torch.randn(4, 8)
    planted = inject_fault(op="Functional.linear", call=0, scale=1.02) if fault and linear \
        else nullcontext()
    if weight:      # one element of the fused weight loaded wrongly (in k_proj's rows)
        planted = _perturbed(model.attn.qkv_proj.weight)    # type: ignore[union-attr]
    if later:       # the linear after the fused op: `o` after qkv_proj, `down` after swiglu
        planted = inject_fault(op="Functional.linear", call=1 if linear else 2, scale=1.02)
    SWIGLU_SCALE[0] = 1.02 if fault and not linear else 1.0
    try:
        with planted:
            with opdiff.dump(model, str(path), level="mix", task=task):
                model(x).sum().backward()
    finally:
        SWIGLU_SCALE[0] = 1.0
    if (fault and linear and not weight) or later:
        assert planted.hits == 1        # type: ignore[attr-defined]
    return path


@contextmanager
def _perturbed(weight: torch.Tensor) -> Iterator[None]:
    with torch.no_grad():
        weight[10, 3] += 0.05
    try:
        yield
    finally:
        with torch.no_grad():
            weight[10, 3] -= 0.05


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused_projection")
    torch.manual_seed(0)
    split = Model(SplitAttention()).eval()
    fused = Model(FusedAttention(split.attn)).eval()   # type: ignore[arg-type]
    torch.manual_seed(0)
    composite = Model(MLP(fused=False), "mlp").eval()
    kernel = Model(MLP(fused=True), "mlp").eval()
    kernel.load_state_dict(composite.state_dict())
    made = {}
    for task in TASKS:
        made["qkv", "golden", task] = _dump(split, root / f"qg_{task}", task, False, True)
        made["swiglu", "golden", task] = _dump(composite, root / f"sg_{task}", task, False, False)
        for fault in (False, True):
            made["qkv", fault, task] = _dump(fused, root / f"qt_{task}_{fault}", task, fault, True)
            made["swiglu", fault, task] = _dump(kernel, root / f"st_{task}_{fault}", task, fault,
                                                False)
        made["qkv", "weight", task] = _dump(fused, root / f"qw_{task}", task, False, True,
                                            weight=True)
        made["qkv", "later", task] = _dump(fused, root / f"ql_{task}", task, False, True,
                                           later=True)
        made["swiglu", "later", task] = _dump(kernel, root / f"sl_{task}", task, False, False,
                                              later=True)
    return made


def _compare(dumps, case: str, fault: bool, task: str):
    return opdiff.compare(str(dumps[case, fault, task]), str(dumps[case, "golden", task]))


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("case", ["qkv", "swiglu"])
def test_healthy_fused_ops_name_nothing(dumps, case, task):
    result = _compare(dumps, case, False, task)
    assert result.first_divergence is None, result.first_divergence
    assert not verdict_line(result).startswith("inconclusive"), verdict_line(result)


@pytest.mark.parametrize("task", TASKS)
def test_a_fault_in_the_fused_projection_names_its_region(dumps, task):
    result = _compare(dumps, "qkv", True, task)
    fd = result.first_divergence
    assert fd is not None, verdict_line(result)
    assert fd.origin == "region" and fd.phase == "forward", fd
    assert fd.name.startswith("Region.")
    assert "region in `attn`" in fd.reason, fd.reason
    assert [o["op"] for o in fd.region["target_ops"]] == ["Functional.linear", "Tensor.split"]
    assert [o["op"] for o in fd.region["golden_ops"]] == ["Functional.linear"] * 3
    # the fused parameters were not compared, and the verdict says so
    assert "`attn.qkv_proj.weight`" in fd.reason and "were not compared" in fd.reason
    # the one input it was judged from, by the argument the fused linear reads it as
    assert [(i["name"], i["op"]) for i in fd.region["inputs"]] == [("input", "Functional.linear")]
    assert "no op is to blame" not in verdict_line(result)


@pytest.mark.parametrize("task", TASKS)
def test_a_fault_in_a_fused_custom_op_names_its_region(dumps, task):
    result = _compare(dumps, "swiglu", True, task)
    fd = result.first_divergence
    assert fd is not None, verdict_line(result)
    assert fd.origin == "region" and fd.phase == "forward", fd
    assert [o["op"] for o in fd.region["target_ops"]] == ["Torch.swiglu.default"], fd.region
    assert [o["op"] for o in fd.region["golden_ops"]] == ["Functional.silu", "Tensor.__mul__"]
    assert "region in `mlp`" in fd.reason and "local error in this region" in fd.reason


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("case, culprit", [("qkv", "Functional.linear.1.forward"),
                                           ("swiglu", "Functional.linear.2.forward")])
def test_a_fault_after_the_fused_op_names_that_op(dumps, case, culprit, task, tmp_path):
    """The linear after the region (`o`, `down`), 2% off: that op is named, not the region."""
    for mapping in ([None, CONCAT] if case == "qkv" else [None]):
        f = None
        if mapping:
            f = tmp_path / "pairs.yaml"
            f.write_text(mapping)
        result = opdiff.compare(str(dumps[case, "later", task]), str(dumps[case, "golden", task]),
                                progress=False, mapping=f)
        fd = result.first_divergence
        assert fd is not None and fd.origin == "op", verdict_line(result)
        assert fd.name == culprit and fd.phase == "forward", fd


def _without_dataflow(dumps, tmp_path: Path, moved: bool = False) -> Path:
    """The faulty fused dump as an older opdiff wrote it (no dataflow); `moved`: its attention
    recorded under another path too (`npu_attn`), so that no module call holds the region on
    both sides."""
    target = tmp_path / "target"
    shutil.copytree(dumps["qkv", True, "tensor"], target)
    for meta in target.rglob("meta.json"):
        data = json.loads(meta.read_text())
        data["dataflow"] = 0
        meta.write_text(json.dumps(data))
    for records in target.rglob("records.jsonl") if moved else ():
        text = records.read_text()
        records.write_text(text.replace("Module.attn.FusedAttention", "Module.npu_attn.FusedAttention"))
    return target


def test_without_dataflow_the_region_is_judged_at_the_module_call_holding_it(dumps, tmp_path):
    """FusedAttention against SplitAttention at one path, `attn`: the calls pair by path and
    call count (their input and output have the same shapes, align.same_classes), so the
    region is measured at that call and the fault is named there."""
    target = _without_dataflow(dumps, tmp_path)
    result = opdiff.compare(str(target), str(dumps["qkv", "golden", "tensor"]))
    fd = result.first_divergence
    assert fd is not None and fd.origin == "region", verdict_line(result)
    assert "region in `attn`" in fd.reason, fd.reason


def test_a_region_that_cannot_be_measured_is_inconclusive(dumps, tmp_path):
    """Without dataflow the region's boundary is the module call holding it, here `npu_attn`,
    which does not pair (golden has `attn`): nothing measures the region, and the verdict says
    "inconclusive", not "no op is to blame"."""
    target = _without_dataflow(dumps, tmp_path, moved=True)
    result = opdiff.compare(str(target), str(dumps["qkv", "golden", "tensor"]))
    line = verdict_line(result)
    assert result.first_divergence is None, result.first_divergence
    assert line.startswith("inconclusive: tensors differ, and region 0 in npu_attn"), line
    assert line in result.notes


CONCAT = "concat:\n  qkv_proj: [q_proj, k_proj, v_proj]\n"


def _mapped(dumps, case, task: str, tmp_path: Path, text: str = CONCAT):
    f = tmp_path / "pairs.yaml"
    f.write_text(text)
    return opdiff.compare(str(dumps["qkv", case, task]), str(dumps["qkv", "golden", task]),
                          progress=False, mapping=f)


def _row(result, name: str):
    rows = [r for r in result.rows if r.target_name == name]
    assert len(rows) == 1, name
    return rows[0]


@pytest.mark.parametrize("task", TASKS)
def test_concat_compares_the_fused_call_and_its_parameters(dumps, task, tmp_path):
    result = _mapped(dumps, False, task, tmp_path)
    assert result.first_divergence is None, result.first_divergence
    assert not verdict_line(result).startswith("inconclusive"), verdict_line(result)
    call = "Module.attn.qkv_proj.Linear"
    for name in (f"{call}.forward.0.output.0", f"{call}.forward.0.parameters.weight",
                 f"{call}.forward.0.parameters.bias", "Parameter.attn.qkv_proj.weight.0.forward"
                 ".output.0", f"{call}.backward.0.input.0", f"{call}.parameters_grad.0.weight"):
        row = _row(result, name)
        assert row.golden_name == name and row.result == "pass", row
        assert row.golden_shape == row.target_shape
        # the joined statistics are those of the fused tensor (the weights are the same
        # numbers, concatenated: their max and min exactly)
        for stat in ("max", "min", "mean", "norm"):
            assert row.golden_stats[stat] == pytest.approx(row.target_stats[stat], rel=1e-5,
                                                           abs=1e-7), (name, stat)
            if "parameters.weight" in name and stat in ("max", "min"):
                assert row.golden_stats[stat] == row.target_stats[stat], (name, stat)
    if task == "tensor":        # the joined golden weight is the fused one, element for element
        weight = _row(result, f"{call}.forward.0.parameters.weight")
        assert weight.mode == "tensor" and weight.metrics["MaxAbsErr"] == 0, weight.metrics
    assert not [n for n in result.notes if "mapping" in n], result.notes


@pytest.mark.parametrize("task", TASKS)
def test_concat_names_a_fault_in_the_fused_projection(dumps, task, tmp_path):
    result = _mapped(dumps, True, task, tmp_path)
    fd = result.first_divergence
    assert fd is not None, verdict_line(result)
    assert fd.origin == "region" and fd.phase == "forward", fd
    assert "region in `attn.qkv_proj`" in fd.reason, fd.reason
    assert [o["op"] for o in fd.region["target_ops"]] == ["Functional.linear"]
    assert [o["op"] for o in fd.region["golden_ops"]] == ["Functional.linear"] * 3
    assert "were not compared" not in fd.reason      # the fused parameters were compared
    # judged at the joined call: its input by its argument, its parameters by their FQNs
    assert [(i["name"], i["op"]) for i in fd.region["inputs"]] == [
        ("input.0", "Module.attn.qkv_proj.Linear.forward.0"), ("attn.qkv_proj.weight", None),
        ("attn.qkv_proj.bias", None)], fd.region["inputs"]
    assert _row(result, "Module.attn.qkv_proj.Linear.forward.0.output.0").result == "error"


@pytest.mark.parametrize("task", TASKS)
def test_concat_names_a_wrongly_loaded_fused_weight(dumps, task, tmp_path):
    result = _mapped(dumps, "weight", task, tmp_path)
    fd = result.first_divergence
    assert fd is not None, verdict_line(result)
    assert fd.origin == "parameter", fd
    assert "parameter attn.qkv_proj.weight differs" in fd.reason, fd.reason


@pytest.mark.parametrize("text, line", [
    ("concat:\n  qkv_proj: [q_proj, k_prj, v_proj]\n", 2),       # a typo in a golden part
    ("concat:\n  qkv_prj: [q_proj, k_proj, v_proj]\n", 2),       # ... in the fused module
    ("modules:\n  o: o\nconcat:\n  qkv_proj: {golden: [q_proj, k_proj, v_proj], dim: 0}\n", 4),
    ("concat:\n  qkv_proj: {golden: [q_proj, k_proj, v_proj], dim: last}\n", 2),
    ("concat:\n  qkv_proj: {modules: [q_proj, k_proj, v_proj]}\n", 2),
    ("concat:\n  qkv_proj: [q_proj]\n", 2),                       # one part joins nothing
    ("concat:\n  qkv_proj: q_proj\n", 2),
    ("concat:\n  - qkv_proj\n", 2),
    ("concat:\n  Functional.linear.0.forward: [q_proj, k_proj]\n", 2),
])
def test_a_bad_concat_line_exits_2_naming_the_file_and_line(dumps, tmp_path, capsys, text, line):
    f = tmp_path / "pairs.yaml"
    f.write_text(text)
    assert main(["compare", str(dumps["qkv", False, "statistics"]),
                 str(dumps["qkv", "golden", "statistics"]), "--map", str(f),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{f}:{line}:" in err, err


def test_a_concat_line_that_joins_nothing_is_reported(dumps, tmp_path):
    """The whole path names the same modules as the segment above it, which joined them first."""
    result = _mapped(dumps, False, "statistics", tmp_path,
                     CONCAT + "  attn.qkv_proj: [attn.q_proj, attn.k_proj, attn.v_proj]\n")
    unused = [n for n in result.notes if "never used" in n]
    assert len(unused) == 1 and "pairs.yaml:3 (concat attn.qkv_proj" in unused[0], unused
    assert result.first_divergence is None
