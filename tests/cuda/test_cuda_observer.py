"""The observer guarantee on CUDA: three optimizer steps with opdiff on leave parameters,
buffers, losses and gradients bitwise equal to the same steps without it, and the CUDA (and
CPU) generators where they would be."""
from __future__ import annotations

import pytest
import torch

import opdiff

pytestmark = pytest.mark.cuda

STEPS = 3


def _bits(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().clone()


def _train(case, debugger=None):
    """STEPS steps on CUDA, with the user's own GPU randomness in the loop (noise, dropout)."""
    model, inputs, loss_fn = case.build()
    model = model.cuda().train()
    x = inputs[0].cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(1234)           # seeds the CUDA generator too
    losses, grads = [], []
    for _ in range(STEPS):
        if debugger is not None:
            debugger.start(model)
        noise = torch.randn(x.shape, device="cuda") * 1e-3
        loss = loss_fn(model(x + noise))
        loss.backward()
        grads.append([_bits(p.grad) for p in model.parameters()])
        opt.step()
        opt.zero_grad(set_to_none=True)
        if debugger is not None:
            debugger.stop()
            debugger.step()
        losses.append(_bits(loss))
    torch.cuda.synchronize()
    state = {k: _bits(v) for k, v in model.state_dict().items()}
    return state, grads, losses, torch.cuda.get_rng_state(), torch.get_rng_state()


@pytest.fixture
def deterministic():
    """Deterministic kernels (cuDNN's, and torch's where it has them), so that two runs without
    opdiff are bitwise equal too; the test checks that they are before judging opdiff."""
    saved = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[:2]
    torch.use_deterministic_algorithms(saved[2], warn_only=saved[3])


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)


@pytest.mark.parametrize("family", ["cnn", "lstm", "transformer"])
@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_training_on_cuda_is_bitwise_unchanged(family, task, model_cases, deterministic, tmp_path):
    case = model_cases[family]
    ref = _train(case)
    again = _train(case)
    assert _same(ref[2], again[2]) and all(torch.equal(ref[0][k], again[0][k]) for k in ref[0]), \
        f"{family}: two runs without opdiff already differ on this GPU (nondeterministic kernels)"
    dbg = opdiff.PrecisionDebugger(dump_path=str(tmp_path / "dump"), task=task, level="mix")
    state, grads, losses, cuda_rng, cpu_rng = _train(case, dbg)
    assert _same(losses, ref[2]), "losses changed"
    for step, (g, rg) in enumerate(zip(grads, ref[1])):
        assert _same(g, rg), f"gradients changed at step {step}"
    changed = [k for k in ref[0] if not torch.equal(state[k], ref[0][k])]
    assert not changed, f"parameters/buffers changed: {changed}"
    assert torch.equal(cuda_rng, ref[3]), "the CUDA generator was advanced"
    assert torch.equal(cpu_rng, ref[4]), "the CPU generator was advanced"
    assert (tmp_path / "dump" / f"step{STEPS - 1}" / "rank0").is_dir()
