"""One-sided regions (comparison/region_onesided.py): ops only one run executes, between paired
tensors, judged as one through the target's dataflow.

A bare block whose target run calls `.contiguous()` on the transposed projection before the
`reshape` both runs call (the golden run's reshape copies on its own): the target-only
`contiguous` and its backward have no twin. Proven through the dataflow (the paired `transpose`
makes what it reads, the paired `reshape` reads what it makes), they are a region: healthy, it
passes and its rows are covered, not unmatched; a 2% fault in it (forward or backward) names it.
The same op on golden's side alone is not proven (the target's dataflow does not see it) and
stays unmatched."""
from __future__ import annotations

import json

import pytest
import torch

import opdiff
from opdiff import schemas
from opdiff.comparison.rejudge import rejudge

from regionkit import block_dump

CONTIGUOUS = "Tensor.contiguous"


class Copied(torch.nn.Module):
    """A projection, transposed; `.contiguous()` on one run only (`extra`); reshaped back."""

    def __init__(self, extra: bool) -> None:
        super().__init__()
        self.extra = extra
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.a(x).view(2, 5, 2, 8).transpose(1, 2)
        if self.extra:
            h = h.contiguous()
        return self.b(h.reshape(2, 5, 16))


def _dump(tmp_path, name, extra, task, fault=None, phase="forward"):
    return block_dump(tmp_path / name, extra, fault=fault, phase=phase, task=task, make=Copied)


def _rows(result, op):
    return [r for r in result.rows if r.op_name.startswith(f"{op}.")]


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_healthy_target_only_op_is_a_region_that_passes(tmp_path, task):
    result = opdiff.compare(_dump(tmp_path, "extra", True, task), _dump(tmp_path, "plain", False,
                                                                         task), progress=False)
    assert result.first_divergence is None, result.first_divergence
    assert result.counts["unmatched"] == 0, [r.target_name for r in result.rows
                                             if r.result == "unmatched"]
    rows = _rows(result, CONTIGUOUS)
    assert {r.phase for r in rows} == {"forward", "backward"}
    assert all(r.region and r.result == "pass" and "not judged" not in r.reason
               for r in rows), rows
    # judged through the tensors of the paired ops around it, in both phases
    marked = {(side, region.phase, name) for facts in result.facts for region in facts.regions
              for side, names in (("in", region.inputs), ("out", region.outputs))
              for name in names}
    assert ("in", "forward", "Tensor.transpose.0.forward.output.0") in marked, marked
    assert ("out", "forward", "Tensor.reshape.0.forward.input.0") in marked, marked
    assert ("in", "backward", "Tensor.reshape.0.backward.output.0") in marked, marked
    assert ("out", "backward", "Tensor.transpose.0.backward.input.0") in marked, marked


@pytest.mark.parametrize("phase", ["forward", "backward"])
@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_fault_in_a_target_only_op_names_its_region(tmp_path, task, phase):
    golden = _dump(tmp_path, "plain", False, task)
    result = opdiff.compare(_dump(tmp_path, "bad", True, task, CONTIGUOUS, phase), golden,
                            tmp_path / "out", progress=False, replay="off")
    first = result.first_divergence
    assert first is not None and first.origin == "region" and first.phase == phase, first
    assert [o["op"] for o in first.region["target_ops"]] == [CONTIGUOUS]
    assert first.region["golden_ops"] == []
    assert first.reason.startswith(f"region ({phase}; target: `{CONTIGUOUS}` at "), first.reason
    assert "; golden: no op): only the target run executes ops here, judged as one" \
        in first.reason, first.reason
    assert "local error in this region" in first.reason
    assert not [r for r in result.rows if r.result == "unmatched"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    schemas.validate("compare-summary", summary)        # (an empty side is a list like any)
    assert summary["first_divergence"]["region"]["golden_ops"] == []
    again = rejudge(result, {}).first_divergence
    assert again is not None and (again.name, again.reason) == (first.name, first.reason)


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_golden_only_op_is_not_proven_and_stays_unmatched(tmp_path, task):
    # the target's dataflow does not see golden's tensors: a 2% fault in golden's
    # `.contiguous()` is never covered as if it agreed
    result = opdiff.compare(_dump(tmp_path, "plain", False, task),
                            _dump(tmp_path, "bad", True, task, CONTIGUOUS), progress=False,
                            replay="off")
    rows = _rows(result, CONTIGUOUS)
    assert rows and all(r.result == "unmatched" and not r.region for r in rows), rows
    assert result.first_divergence is None or result.first_divergence.origin != "region"


def _hooked_dump(path, hooked: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    if hooked:      # a forward hook the golden run does not have: an op of the target alone
        model[1].register_forward_hook(lambda module, args, out: out * 1.05)
    with opdiff.dump(model, str(path), level="mix", task="tensor"):
        model(torch.randn(8, 12)).pow(2).mean().backward()
    return path


def test_a_target_only_op_that_changes_the_value_is_named_though_replay_reproduces_it(tmp_path):
    # replay re-runs the target's `* 1.05` exactly: it checks the target's arithmetic, not that
    # its ops compute what golden's (none) do; the boundary's comparison judges that (this
    # region was cleared as "computed right" and the verdict was "no op is to blame")
    result = opdiff.compare(_hooked_dump(tmp_path / "hooked", True),
                            _hooked_dump(tmp_path / "plain", False), progress=False)
    first = result.first_divergence
    assert first is not None and first.origin == "region", result.verdict
    assert [o["op"] for o in first.region["target_ops"]] == ["Tensor.__mul__"]
    assert "local error in this region" in first.reason and "1.05" in first.location.code
