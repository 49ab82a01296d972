"""Statistics of CUDA tensors: device staging gives host staging's numbers for the same values,
and bf16/fp16 statistics reduced on the device agree with float64 references on the CPU."""
from __future__ import annotations

import pytest
import torch

from opdiff.capture import stats as stats_mod
from opdiff.store import decoded_stats

pytestmark = pytest.mark.cuda


def _small_cases(device) -> dict:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(5, 7, generator=g) * 3
    with_nan = base.clone().index_fill_(1, torch.tensor([2]), float("nan"))
    with_inf = base.clone()
    with_inf[0, 0], with_inf[4, 6] = float("inf"), float("-inf")
    cases = {
        "float32": base, "float64": base.double() / 7, "bfloat16": base.bfloat16(),
        "float16": base.half(), "float16_near_max": torch.tensor([6.0e4, -6.5e4, 1.0]).half(),
        "bfloat16_with_nan": with_nan.bfloat16(), "float16_with_inf": with_inf.half(),
        "float32_all_nan": torch.full((3,), float("nan")),
        "int64_large": torch.tensor([2 ** 40, -(2 ** 41), 7, 0]), "int32": torch.arange(-6, 9, dtype=torch.int32),
        "bool": torch.tensor([True, False, True, True]), "zero_dim": torch.tensor(-2.75),
        "bf16_matrix": torch.randn(64, 100, generator=g).bfloat16(),
    }
    return {k: v.to(device) for k, v in cases.items()}


def test_device_staging_gives_host_staging_statistics_for_the_same_values():
    """Small CUDA tensors go through device_stage.DeviceStaging (copied into a buffer on the GPU,
    reduced on the host at flush); the same values on the CPU through host staging must get the
    same numbers, and the values are those of the moment each tensor was described."""
    on_gpu = _small_cases("cuda")
    on_cpu = {k: v.cpu().contiguous() for k, v in on_gpu.items()}
    assert all(v.numel() <= stats_mod._SMALL for v in on_gpu.values())
    device_batch, host_batch = stats_mod.StatsBatch(), stats_mod.StatsBatch()
    d_gpu = {k: {} for k in on_gpu}
    d_cpu = {k: {} for k in on_cpu}
    for k in on_gpu:
        device_batch.add(d_gpu[k], on_gpu[k])
        host_batch.add(d_cpu[k], on_cpu[k])
    assert device_batch._staging, "small CUDA tensors were not staged on the device"
    for v in on_gpu.values():              # written over on the GPU after being described
        if v.is_floating_point():
            v.mul_(-3)
    device_batch.resolve()
    host_batch.resolve()
    for k in on_gpu:
        got, want = decoded_stats(d_gpu[k]), decoded_stats(d_cpu[k])
        assert got.keys() == want.keys(), k
        for key in got:
            a, b = got[key], want[key]
            same = (a != a and b != b) or a == b or a == pytest.approx(b, rel=1e-12)
            assert same, f"{k} {key}: device staging {a} vs host staging {b}"


def _large(dtype, seed, plant=True):
    g = torch.Generator().manual_seed(seed)
    t = (1000 + torch.randn(1 << 20, generator=g) * 50)
    if plant:
        t[7], t[2000], t[5] = float("nan"), float("inf"), float("-inf")
    return t.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_statistics_on_device_match_float64(dtype, close_stats):
    """bf16/fp16 statistics reduced on the GPU: max/min and the inf/NaN counts exact, mean and
    norm within float32 accumulation (1e-5), far inside the dtype's own rounding (bf16: 4e-3):
    a reduction done in the tensor's own dtype, or a sum overflowing fp16, fails here."""
    cases = {
        "large": _large(dtype, 1),
        "large_finite": _large(dtype, 2, plant=False),
        # each term fits fp16, the sum of squares does not: must not come back inf
        "fp16_sum_overflows": torch.full((1 << 16,), 6.0e4).to(dtype),
        "small": torch.randn(40, 50, generator=torch.Generator().manual_seed(3)).to(dtype),
        "non_contiguous": _large(dtype, 4, plant=False).view(1024, 1024).t()[::2],
    }
    batch = stats_mod.StatsBatch()
    descs = {k: {} for k in cases}
    for k, t in cases.items():
        batch.add(descs[k], t.cuda())
    batch.resolve()
    for k, t in cases.items():
        desc = {"dtype": str(dtype).replace("torch.", ""), "shape": list(t.shape), **descs[k]}
        close_stats(desc, t, rel=1e-5, what=f"{dtype} {k}")


def test_statistics_of_a_dump_on_cuda_match_the_saved_tensors(tmp_path, records, close_stats):
    """End to end: a bf16-autocast step on the GPU dumped with task="tensor"; every described
    output's statistics agree with its saved tensor reduced in float64 on the CPU."""
    import opdiff
    from opdiff.store import open_dump
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8)).cuda()
    x = torch.randn(32, 64, device="cuda")
    with opdiff.dump(model, tmp_path / "d", level="mix", task="tensor"):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
        out.float().pow(2).mean().backward()
    path = tmp_path / "d" / "step0" / "rank0"
    dump = open_dump(path)
    checked = 0
    for rec in records(path).values():
        for desc in rec.get("outputs") or []:
            if isinstance(desc, dict) and desc.get("key") and desc.get("stats"):
                close_stats(desc, dump.tensor(desc["key"]), rel=1e-5, what=rec["name"])
                checked += 1
    assert checked >= 5, checked
