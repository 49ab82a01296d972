"""The mapping file (`--map`, `compare(mapping=)`, comparison/mapping.py) on real dumps: a target
whose attention module is called `npu_attn` where the golden's is `self_attn`, a fault planted
in the renamed module's tanh."""
from __future__ import annotations

import json
import pickle
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

import opdiff
from opdiff.cli import main
from opdiff.comparison.mapping import Mapping, MappingError, load
from opdiff.store.schema import complete
from opdiff.testing import inject_fault


class Attn(torch.nn.Module):
    def __init__(self, extra: bool) -> None:
        super().__init__()
        self.q, self.o, self.extra = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), extra

    def forward(self, x):
        h = torch.tanh(self.q(x))
        if self.extra:              # a layout op the golden run does not have
            h = h.clone()
        return self.o(h)


class Block(torch.nn.Module):
    def __init__(self, attn: str, extra: bool = False) -> None:
        super().__init__()
        self.attn = attn
        setattr(self, attn, Attn(extra))
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(torch.relu(getattr(self, self.attn)(x)))


def _dump(path: Path, attn: str, fault: bool = False, extra: bool = False) -> Path:
    torch.manual_seed(0)
    model = Block(attn, extra).eval()
    x = torch.randn(4, 8)
    planted = inject_fault(op="Torch.tanh", call=0, scale=1.02) if fault else nullcontext()
    with planted:
        with opdiff.dump(model, str(path), level="mix", task="tensor"):
            model(x).sum().backward()
    return path


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mapping")
    _dump(root / "gpu", "self_attn")
    _dump(root / "npu", "npu_attn", fault=True)
    _dump(root / "npu_clone", "npu_attn", extra=True)
    return root


def _write(tmp_path: Path, text: str, name: str = "pairs.yaml") -> Path:
    f = tmp_path / name
    f.write_text(text)
    return f


def _names(result) -> set[str]:
    return {r.op_name for r in result.rows}


def test_rename_pairs_the_renamed_module_and_names_the_fault(dumps, tmp_path):
    bare = opdiff.compare(dumps / "npu", dumps / "gpu", progress=False)
    # without the map: the renamed module's records have no twin, and no innocent op is blamed
    assert bare.counts["unmatched"] > 0
    assert bare.first_divergence is None or bare.first_divergence.name == "Torch.tanh.0.forward"
    f = _write(tmp_path, "modules:\n  npu_attn: self_attn\n")
    mapped = opdiff.compare(dumps / "npu", dumps / "gpu", tmp_path / "out", progress=False,
                            mapping=f)
    assert mapped.counts["unmatched"] == 0
    assert mapped.first_divergence is not None
    assert mapped.first_divergence.name == "Torch.tanh.0.forward"
    # rows keep the target's recorded names; the module rows now pair
    assert any("npu_attn" in n and n.startswith("Module.") for n in _names(mapped))
    assert not [n for n in mapped.notes if "mapping" in n]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["first_divergence"]["name"] == "Torch.tanh.0.forward"


def test_a_path_rename_and_the_cli_flag(dumps, tmp_path, capsys):
    f = _write(tmp_path, "modules:\n  Module.npu_attn.Attn.forward.0: Module.self_attn.Attn.forward.0\n")
    assert main(["compare", str(dumps / "npu"), str(dumps / "gpu"), "--map", str(f),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Torch.tanh.0.forward" in out and " 0 unmatched" in out


def test_ignore_drops_an_extra_op_on_one_side(dumps, tmp_path):
    renames = "modules:\n  npu_attn: self_attn\n"
    bare = opdiff.compare(dumps / "npu_clone", dumps / "gpu", progress=False,
                          mapping=_write(tmp_path, renames))
    assert any(n.startswith("Tensor.clone") for n in _names(bare))
    f = _write(tmp_path, renames + "ignore:\n  - target: [Tensor.clone]\n", "ignore.yaml")
    result = opdiff.compare(dumps / "npu_clone", dumps / "gpu", progress=False, mapping=f)
    assert not any(n.startswith("Tensor.clone") for n in _names(result))
    assert result.counts["unmatched"] == 0 and result.first_divergence is None
    assert not [n for n in result.notes if "never used" in n]


def test_an_unused_line_is_reported(dumps, tmp_path, capsys):
    # `self_attn: npu_attn` names real modules but the wrong way round: it renames nothing
    f = _write(tmp_path, "modules:\n  npu_attn: self_attn\n  self_attn: npu_attn\n")
    result = opdiff.compare(dumps / "npu", dumps / "gpu", tmp_path / "out", progress=False,
                            mapping=f)
    unused = [n for n in result.notes if "never used" in n]
    assert len(unused) == 1 and f"{f}:3" in unused[0]
    assert result.counts["unmatched"] == 0      # renames never chain: line 3 undoes nothing
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert any(f"{f}:3" in n for n in summary["notes"])
    assert main(["compare", str(dumps / "npu"), str(dumps / "gpu"), "--map", str(f),
                 "--no-progress"]) == 0
    assert f"{f}:3" in capsys.readouterr().out


@pytest.mark.parametrize("text, line", [
    ("modules:\n  npu_attn: self_atn\n", 2),                       # a typo: matches nothing
    ("modules:\n  npu_attn: self_attn\n  nowhere: self_attn\n", 3),
    ("ignore:\n  - Tensor.nothing_like_this\n", 2),
    ("modules:\n  npu_attn: [self_attn\n", 3),                      # YAML syntax
    ("modules:\n  - npu_attn\n", 2),                                # not name: name
    ("renames:\n  npu_attn: self_attn\n", 2),                      # msprobe-style: not a name
    ("concat:\n  qkv_proj: [q_proj, k_proj, v_proj]\n", 2),        # no fused module here
    ("Functional.linear.9.forward.output.0: Functional.linear.0.forward.output.0\n", 1),
    ("modules:\n  npu_attn: self_attn\nextra: 1\n", 3),           # unknown section
    ("ignore:\n  - [Tensor.clone, [Torch.tanh]]\n", 2),             # a list in a list
    ("ignore:\n  target: &a [x, x]\n  golden: [*a, *a]\n", 2),     # ... through aliases
])
def test_a_bad_file_exits_2_naming_the_file_and_line(dumps, tmp_path, capsys, text, line):
    f = _write(tmp_path, text)
    assert main(["compare", str(dumps / "npu"), str(dumps / "gpu"), "--map", str(f),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert str(f) in err
    if line is not None:
        assert f"{f}:{line}:" in err
    with pytest.raises(MappingError):
        opdiff.compare(dumps / "npu", dumps / "gpu", progress=False, mapping=f)


def test_a_missing_file_and_ray_shards_are_refused(dumps, tmp_path, capsys):
    # (a mapping with one Ray task per pair runs: tests/distributed/test_ray_engine.py)
    assert main(["compare", str(dumps / "npu"), str(dumps / "gpu"), "--map",
                 str(tmp_path / "nope.yaml"), "--no-progress"]) == 2
    assert "nope.yaml" in capsys.readouterr().err
    f = _write(tmp_path, "modules:\n  npu_attn: self_attn\n")
    assert main(["compare", str(dumps / "npu"), str(dumps / "gpu"), "--map", str(f),
                 "--engine", "ray", "--shard-mb", "4", "--no-progress"]) == 2
    assert "cannot be combined with shard_mb" in capsys.readouterr().err


def test_msprobe_cell_mapping_is_accepted(dumps, tmp_path):
    f = _write(tmp_path, "# msprobe cell_mapping.yaml\nnpu_attn: self_attn\n", "cell_mapping.yaml")
    result = opdiff.compare(dumps / "npu", dumps / "gpu", progress=False, mapping=load(f))
    assert result.counts["unmatched"] == 0
    assert result.first_divergence is not None
    assert result.first_divergence.name == "Torch.tanh.0.forward"


def test_msprobe_data_mapping_is_accepted(dumps, tmp_path):
    f = _write(tmp_path, "Module.npu_attn.Attn.forward.0.output.0: "
                         "Module.self_attn.Attn.forward.0.output.0\n", "data_mapping.yaml")
    rules = load(f).rules
    assert [(r.old, r.new, r.line) for r in rules] == [("npu_attn", "self_attn", 1)]
    result = opdiff.compare(dumps / "npu", dumps / "gpu", progress=False, mapping=f)
    assert result.counts["unmatched"] == 0
    assert result.first_divergence is not None
    assert result.first_divergence.name == "Torch.tanh.0.forward"


def test_the_parsed_mapping_is_small_frozen_and_picklable(tmp_path):
    f = _write(tmp_path, "modules:\n  npu_attn: self_attn\nignore:\n  - Tensor.clone\n"
                         "  - golden: ['Torch.*']\n")
    m = load(f)
    assert pickle.loads(pickle.dumps(m)) == m
    assert [(r.kind, r.side, r.line) for r in m.rules] == [
        ("module", "both", 2), ("ignore", "both", 4), ("ignore", "golden", 5)]
    with pytest.raises(AttributeError):
        m.rules = ()        # type: ignore[misc]
    assert load(_write(tmp_path, "", "empty.yaml")) == Mapping(str(tmp_path / "empty.yaml"))


def _two_steps(path: Path, attn: str, fault: bool) -> Path:
    """Two steps (a statistics dump): `compare` runs the pairs in its process pool, so the
    parsed mapping travels to the workers pickled."""
    torch.manual_seed(0)
    model, x = Block(attn).eval(), torch.randn(4, 8)
    dbg = opdiff.PrecisionDebugger(dump_path=str(path), task="statistics", level="mix",
                                   step=[0, 1])
    for _ in range(2):
        planted = inject_fault(op="Torch.tanh", call=0, scale=1.02) if fault else nullcontext()
        with planted:
            dbg.start(model)
            model(x).sum().backward()
            dbg.stop()
            dbg.step()
    return path


@pytest.mark.slow
def test_every_pair_of_a_multi_step_dump_gets_the_mapping(tmp_path):
    golden = _two_steps(tmp_path / "gpu", "self_attn", fault=False)
    target = _two_steps(tmp_path / "npu", "npu_attn", fault=True)
    f = _write(tmp_path, "modules:\n  npu_attn: self_attn\n  self_attn: npu_attn\n")
    result = opdiff.compare(target, golden, progress=False, mapping=f)
    assert len(result.pairs) == 2
    assert result.counts["unmatched"] == 0
    assert result.first_divergence is not None
    assert result.first_divergence.name == "Torch.tanh.0.forward"
    assert result.first_divergence.step == 0
    # a line unused in every pair is said once, not once per pair
    assert [n for n in result.notes if "never used" in n] == [
        f"mapping {f}:3 (self_attn: npu_attn) was never used: nothing it names changed the pairing"]


def test_renames_swap_and_never_chain(tmp_path):
    f = _write(tmp_path, "modules:\n  a: b\n  b: a\n")
    target = [complete({"name": "Module.a.X.forward.0", "op": "Module.a.X", "kind": "module"}),
              complete({"name": "Module.b.X.forward.0", "op": "Module.b.X", "kind": "module"})]
    golden = [complete({"name": "Module.b.X.forward.0", "op": "Module.b.X", "kind": "module"}),
              complete({"name": "Module.a.X.forward.0", "op": "Module.a.X", "kind": "module"})]
    bound = load(f).bind(target, golden)
    assert [r["name"] for r in bound.view] == ["Module.b.X.forward.0", "Module.a.X.forward.0"]
    assert [r["name"] for r in target] == ["Module.a.X.forward.0", "Module.b.X.forward.0"]
    assert bound.unused == ()


def test_msprobe_cell_mapping_module_and_class_form(dumps, tmp_path):
    """msprobe's `{module_name}.{class_name}` lines (`fc2.Dense: fc2.Linear`): the module pairs,
    and so do the modules and parameters under it, which carry the path without the class."""
    f = _write(tmp_path, "npu_attn.Attn: self_attn.Attn\n", "cell_mapping.yaml")
    assert [(r.old, r.new, r.line) for r in load(f).rules] == [("npu_attn", "self_attn", 1)]
    result = opdiff.compare(dumps / "npu", dumps / "gpu", progress=False, mapping=f)
    assert result.counts["unmatched"] == 0, result.counts
    assert result.first_divergence is not None
    assert result.first_divergence.name == "Torch.tanh.0.forward"
    assert not [n for n in result.notes if "never used" in n], result.notes
    f = _write(tmp_path, "attn.NpuAttention: attn.LlamaAttention\n", "cell_mapping.yaml")
    assert [(r.old, r.new) for r in load(f).rules] == [("NpuAttention", "LlamaAttention")]


class Wrapper(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


def test_a_wrapper_on_one_side_and_the_lines_that_pair_its_parameters(dumps, tmp_path):
    """A wrapper (`inner.` in front of every path of the target) leaves module calls and ops
    paired but not the parameters and their gradients; one `modules:` line per wrapped module
    pairs them too (docs/howto/different-ops.md, Limits)."""
    torch.manual_seed(0)
    model = Wrapper(Block("self_attn")).eval()
    x = torch.randn(4, 8)
    with inject_fault(op="Torch.tanh", call=0, scale=1.02):
        with opdiff.dump(model, str(tmp_path / "wrapped"), level="mix", task="tensor"):
            model(x).sum().backward()
    bare = opdiff.compare(tmp_path / "wrapped", dumps / "gpu", progress=False)
    assert bare.first_divergence is not None
    assert bare.first_divergence.name == "Torch.tanh.0.forward"
    unmatched = {r.op_name for r in bare.rows if r.result == "unmatched"}
    assert "Parameter.inner.self_attn.q.weight.0.forward" in unmatched, unmatched
    f = _write(tmp_path, "modules:\n  inner.self_attn: self_attn\n  inner.fc: fc\n")
    mapped = opdiff.compare(tmp_path / "wrapped", dumps / "gpu", progress=False, mapping=f)
    assert mapped.first_divergence is not None
    assert mapped.first_divergence.name == "Torch.tanh.0.forward"
    assert {r.op_name for r in mapped.rows if r.result == "unmatched"} == {
        "Module.inner.Block.forward.0", "Module.inner.Block.backward.0"}
