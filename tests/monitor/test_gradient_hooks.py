"""Output-gradient norms are right wherever a module runs: inside the watched model's forward
(whose gradient pre-hooks are registered together when that forward returns), outside it (a
child called directly: registered at once), and in a checkpointed region recomputed during the
backward (whose forward outputs are recorded once, not again when recomputed); and no autograd
node is held once the forward has returned."""
from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import opdiff
from opdiff.trend import read_run


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(16, 32)
        self.act = torch.nn.Tanh()
        self.last = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.last(self.act(self.first(x)))


def _norm64(tensors) -> float:
    return float(sum(t.double().pow(2).sum() for t in tensors) ** 0.5)


def _watch_grads(model: torch.nn.Module, seen: dict) -> None:
    """Keep every output gradient of each child, as autograd computed it (a reference)."""
    def keep(module, args, out, name):
        if out.requires_grad:
            out.register_hook(lambda g: seen.setdefault(name, []).append(g.detach().clone()))
    for name, m in model.named_children():
        m.register_forward_hook(lambda mod, a, out, name=name: keep(mod, a, out, name))


def _recorded(path, name: str) -> float:
    return read_run(path).ranks[0].series(f"{name}:bwd_norm")[0]


def test_a_child_called_inside_and_outside_the_models_forward_gets_both_gradients(tmp_path):
    torch.manual_seed(0)
    model = Net()
    seen: dict = {}
    _watch_grads(model, seen)
    x, extra = torch.randn(4, 16), torch.randn(3, 32)
    with opdiff.Monitor(model, tmp_path, update_norm=False) as mon:
        # model.last runs twice: in the model's forward, and once more called directly.
        loss = model(x).square().sum() + model.last(extra).pow(3).sum()
        loss.backward()
        mon.step(loss)
    assert len(seen["last"]) == 2
    for name in ("first", "act", "last"):
        assert _recorded(tmp_path, name) == pytest.approx(_norm64(seen[name]), rel=1e-6), name


@pytest.mark.parametrize("reentrant", [True, False])
def test_a_checkpointed_model_records_each_output_and_its_gradient_once(tmp_path, reentrant):
    torch.manual_seed(0)
    model = Net()
    seen: dict = {}
    _watch_grads(model, seen)
    x = torch.randn(4, 16, requires_grad=True)
    with opdiff.Monitor(model, tmp_path, update_norm=False) as mon:
        loss = checkpoint(model, x, use_reentrant=reentrant).square().sum()
        loss.backward()
        mon.step(loss)
    stream = read_run(tmp_path).ranks[0]
    for name in ("first", "act", "last"):
        # The gradient that autograd used (the recomputed outputs' ones when reentrant).
        assert _recorded(tmp_path, name) == pytest.approx(_norm64(seen[name][-1:]), rel=1e-6), name
    # and each forward output once: not again when a non-reentrant checkpoint recomputes it
    with torch.no_grad():
        h = model.act(model.first(x))
        outputs = {"first": model.first(x), "act": h, "last": model.last(h)}
    for name, out in outputs.items():
        assert stream.series(f"{name}:fwd_norm")[0] == pytest.approx(_norm64([out]), rel=1e-6), name


class SideBranch(Net):
    """Runs a watched child on a branch it then throws away."""

    def forward(self, x):
        self.first(x * 2)                       # autograd saves x * 2 for this output's node
        return super().forward(x)


def test_no_autograd_node_is_held_once_the_forward_returns(tmp_path):
    model = SideBranch()
    saved = []
    model.first.register_forward_hook(lambda m, args, out: saved.append(weakref.ref(args[0])))
    mon = opdiff.Monitor(model, tmp_path, update_norm=False)
    out = model(torch.randn(4, 16))
    assert saved[0]() is None           # the branch's node, and what it saved, are gone
    assert mon._modules._deferred == []
    ref = weakref.ref(out)
    del out
    assert ref() is None
    mon.close()


class Raises(Net):
    def forward(self, x):
        self.first(x)
        raise ValueError("the model gives up after its first layer")


def test_a_forward_that_raises_leaves_nothing_pending(tmp_path):
    model = Raises()
    mon = opdiff.Monitor(model, tmp_path, update_norm=False)
    with pytest.raises(ValueError):
        model(torch.randn(4, 16))
    assert mon._modules._deferred == [] and mon._modules._depth == 0
    out = model.last(model.act(model.first(torch.randn(4, 16))))    # called directly
    out.sum().backward()
    mon.step()
    mon.close()
    assert _recorded(tmp_path, "first") > 0 and _recorded(tmp_path, "last") > 0


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_a_backward_with_create_graph_is_recorded_and_left_as_it_was(tmp_path):
    """With create_graph=True autograd runs the hooks with gradients on (the monitor turns them
    off for its norms): the norms are right and the gradients come out as without it."""
    torch.manual_seed(0)
    model, twin = Net(), Net()
    twin.load_state_dict(model.state_dict())
    seen: dict = {}
    _watch_grads(model, seen)
    x = torch.randn(4, 16)
    with opdiff.Monitor(model, tmp_path, update_norm=False) as mon:
        model(x).square().sum().backward(create_graph=True)
        mon.step()
    twin(x).square().sum().backward(create_graph=True)
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p.grad, q.grad) and p.grad.requires_grad == q.grad.requires_grad
    for name in ("first", "act", "last"):
        assert _recorded(tmp_path, name) == pytest.approx(_norm64(seen[name]), rel=1e-6), name
