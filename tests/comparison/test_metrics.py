"""Metrics against an independent numpy implementation of msprobe's formulas."""
import math
import os

import numpy as np
import pytest
import torch

from opdiff.comparison.metrics import measure, stats_measure, tensor_metrics
from opdiff.comparison.result import METRICS


def msprobe_reference(n: np.ndarray, b: np.ndarray) -> dict:
    """msprobe's definitions (its compare's `get_relative_err` and cosine), written out directly in numpy."""
    n = n.reshape(-1).astype(np.float64)
    b = b.reshape(-1).astype(np.float64)
    eps = np.finfo(np.float64).eps
    nz, bz = n.copy(), b.copy()
    zero = bz == 0
    bz[zero] += eps
    nz[zero] += eps
    rel = np.abs((nz - bz) / bz)
    cos = n.dot(b) / (np.linalg.norm(n) * np.linalg.norm(b))
    return {"Cosine": cos, "MaxAbsErr": np.max(np.abs(n - b)), "MaxRelativeErr": np.max(rel),
            "One Thousandth Err Ratio": np.mean(rel < 0.001),
            "Five Thousandths Err Ratio": np.mean(rel < 0.005)}


@pytest.mark.parametrize("n", [7, 1000, 200_003])   # 200_003 spans several streaming chunks
def test_agrees_with_msprobe_formulas(n):
    rng = np.random.default_rng(n)
    g = rng.standard_normal(n).astype(np.float32)
    g[:: 17] = 0.0                                    # golden zeros take msprobe's eps path
    t = (g * (1 + rng.normal(0, 3e-3, n))).astype(np.float32)
    t[:: 34] = 1e-3                                   # target nonzero where golden is zero
    got = tensor_metrics(torch.from_numpy(t), g)      # torch and numpy inputs both work
    ref = msprobe_reference(t, g)
    for key, value in ref.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
    assert set(got) == set(METRICS)


def test_identical_tensors_score_perfectly():
    x = torch.randn(64, 3, generator=torch.Generator().manual_seed(2))
    m = tensor_metrics(x, x.clone())
    assert m["Cosine"] == 1.0 and m["MaxAbsErr"] == 0.0 and m["RMSE"] == 0.0
    assert m["One Thousandth Err Ratio"] == 1.0 and m["KLD"] == 0.0


def test_scale_fault_shows_in_error_and_scale_error():
    g = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    m = measure(g * 1.01, g)                     # float32 rounding of g*1.01 moves digits ~1e-7
    assert m.error == pytest.approx(0.01 / 1.01, rel=1e-5)
    assert m.scale_error == pytest.approx(0.01, rel=1e-5)
    assert m.metrics["RelEuclideanDistance"] == pytest.approx(0.01, rel=1e-5)
    assert m.metrics["MaxRelativeErr"] == pytest.approx(0.01, rel=1e-4)
    assert m.metrics["One Thousandth Err Ratio"] == 0.0


def test_bf16_rounding_is_random_not_systematic():
    g = torch.randn(100_000, generator=torch.Generator().manual_seed(1))
    m = measure(g.bfloat16(), g)
    assert 5e-4 < m.error < 3e-3            # about 0.4 of bf16's unit roundoff 2^-8
    assert abs(m.scale_error) < 1e-4        # unbiased rounding averages out


def test_nan_inf_at_same_positions_are_not_errors():
    g = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 2.0])
    t = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 2.0 + 1e-6])
    m = measure(t, g)
    assert not m.nonfinite_mismatch
    assert math.isfinite(m.error) and m.error < 1e-6
    assert m.metrics["MaxAbsErr"] == pytest.approx(1e-6, rel=0.2)


def test_nan_at_different_positions_is_reported():
    g = torch.tensor([1.0, 2.0, 3.0])
    t = torch.tensor([1.0, float("nan"), 3.0])
    m = measure(t, g)
    assert m.nonfinite_mismatch == 1
    assert math.isnan(m.metrics["Cosine"]) and "inf/NaN" in m.message
    assert measure(torch.tensor([1.0, float("inf")]), torch.tensor([1.0, -float("inf")])).nonfinite_mismatch


def test_zero_and_constant_tensors_give_no_nan_error():
    z = torch.zeros(100)
    assert measure(z, z.clone()).error == 0.0
    c = torch.full((100,), 3.0)
    m = measure(c + 1e-3, c)
    assert math.isfinite(m.metrics["KLD"]) and math.isfinite(m.error) and m.error > 0
    only_target = measure(torch.ones(10), torch.zeros(10))
    assert only_target.error == 1.0 and math.isnan(only_target.metrics["Cosine"])


def test_scalars_and_empty_tensors():
    m = tensor_metrics(torch.tensor(2.0), torch.tensor(2.5))
    assert m["Cosine"] is None and m["One Thousandth Err Ratio"] is None
    assert m["MaxAbsErr"] == 0.5 and m["MaxRelativeErr"] == pytest.approx(0.2)
    assert tensor_metrics(torch.ones(1), torch.ones(1))["Cosine"] is None
    assert all(v is None for v in tensor_metrics(torch.ones(0), torch.ones(0)).values())


def test_integer_and_bool_tensors():
    a = torch.tensor([1, 2, 3])
    assert measure(a, a.clone()).error == 0.0
    assert measure(torch.tensor([True, False]), torch.tensor([True, True])).error > 0


def test_statistics_only_mean_near_zero_is_not_an_alarm():
    # msprobe's diff_analyze flags batch_norm outputs whose mean is ~0; opdiff measures the mean
    # difference against the tensor's RMS instead.
    g = {"max": 3.0, "min": -3.0, "mean": 1e-7, "norm": 100.0, "nan": 0, "inf": 0}
    t = {"max": 3.001, "min": -3.0, "mean": 5e-6, "norm": 100.02, "nan": 0, "inf": 0}
    m = stats_measure(t, g, numel=10_000)
    assert m.error < 1e-3 and m.mode == "statistics"
    assert m.metrics["MeanRelativeErr"] > 10           # the naive relative diff is huge
    bad = stats_measure({**t, "nan": 3}, g, numel=10_000)
    assert bad.nonfinite_mismatch


def test_statistics_only_the_same_nan_on_both_sides_is_no_difference():
    nan = float("nan")
    same = {"max": 2.0, "min": -1.0, "mean": nan, "norm": nan, "nan": 3, "inf": 0}
    m = stats_measure(dict(same), dict(same), numel=8)
    assert not m.nonfinite_mismatch and m.error == 0.0 and m.scale_error == 0.0
    assert m.metrics["Mean diff"] == 0.0 and m.metrics["MeanRelativeErr"] == 0.0
    all_nan = {"max": nan, "min": nan, "mean": nan, "norm": nan, "nan": 8, "inf": 0}
    assert stats_measure(dict(all_nan), dict(all_nan), numel=8).error == 0.0
    assert stats_measure({**same, "max": 3.0}, same, numel=8).error > 0.1     # finite part differs
    assert stats_measure({**same, "nan": 2}, same, numel=8).nonfinite_mismatch  # counts differ


# -- every metric against a whole-tensor numpy reference, on pairs that take every path ---------

def full_reference(t: np.ndarray, g: np.ndarray) -> dict:
    """All METRICS plus error/scale_error, straight from the module docstring, in numpy float64."""
    t = t.reshape(-1).astype(np.float64)
    g = g.reshape(-1).astype(np.float64)
    eps = np.finfo(np.float64).eps
    d = t - g
    zero = g == 0
    tz, gz = np.where(zero, t + eps, t), np.where(zero, eps, g)
    rel = np.abs(tz - gz) / np.abs(gz)
    nz = ~zero
    norm_t, norm_g = np.linalg.norm(t), np.linalg.norm(g)

    def scaled(x):
        span = (x.max() - x.min()) or 1.0
        return np.maximum((x - x.min()) * (1.0 / span), 1e-8)

    p, q = scaled(t), scaled(g)
    p_n, q_n = p / p.sum(), q / q.sum()
    cosine = t.dot(g) / (norm_t * norm_g)
    return {
        "Cosine": round(cosine, 6) if cosine > 0.9999 else cosine,
        "RMSE": np.sqrt(np.mean(d * d)),
        "MAPE": 100 * np.mean(np.abs(d[nz]) / np.abs(g[nz])),
        "MaxAbsErr": np.abs(d).max(),
        "MaxRelativeErr": rel.max(),
        "MeanRelativeErr": np.where(np.abs(g) <= eps, 0.0, rel).mean(),
        "RelEuclideanDistance": np.sqrt(d.dot(d) / g.dot(g)),
        "KLD": np.sum(p_n * np.log(p_n / q_n)),
        "One Thousandth Err Ratio": np.mean(rel < 0.001),
        "Five Thousandths Err Ratio": np.mean(rel < 0.005),
        "error": np.sqrt(d.dot(d)) / max(norm_t, norm_g),
        "scale_error": (t.dot(g) - g.dot(g)) / g.dot(g),
    }


def _pairs():
    rng = np.random.default_rng(7)
    n = 300_007                                   # several chunks and a ragged last one
    g = rng.standard_normal(n).astype(np.float32)
    noisy = (g * (1 + rng.normal(0, 2e-3, n))).astype(np.float32)
    yield "dense fp32", noisy, g
    relu_g = np.maximum(g, 0)                     # half the golden is 0, target 0 there too
    relu_t = np.maximum(noisy, 0)
    yield "relu: zeros on both sides", relu_t, relu_g
    leaky = relu_t.copy()
    leaky[1::50] = np.float32(3e-4)               # target nonzero where golden is 0
    leaky[3::500] = np.float32(1e-20)             # ... and so small its relative error is < 1e-3
    yield "target nonzero over golden zeros", leaky, relu_g
    tiny = g.copy()
    tiny[5::1000] = np.float32(1e-30)             # |golden| <= eps but not 0, in every chunk
    yield "tiny nonzero golden", noisy, tiny
    bf16 = torch.from_numpy(g).bfloat16().float().numpy()
    yield "bf16 rounding", bf16, g
    yield "float64", noisy.astype(np.float64) + 1e-9, g.astype(np.float64)


@pytest.mark.parametrize("case", list(_pairs()), ids=lambda c: c[0])
def test_every_metric_matches_the_numpy_reference(case):
    _, t, g = case
    m = measure(torch.from_numpy(t), torch.from_numpy(g))
    ref = full_reference(t, g)
    got = {**m.metrics, "error": m.error, "scale_error": m.scale_error}
    for key, value in ref.items():
        # Summation order differs from numpy's pairwise sums: float64 noise. KLD and
        # scale_error are small differences of O(1) sums, so their noise is absolute.
        tolerance = dict(abs=1e-12) if key in ("KLD", "scale_error") else dict(rel=1e-9, abs=1e-15)
        assert got[key] == pytest.approx(value, **tolerance), key
    assert set(m.metrics) == set(METRICS)


def test_target_nonzero_over_golden_zero_uses_msprobes_eps_formula():
    g = torch.tensor([0.0, 0.0, 0.0, 1.0])
    t = torch.tensor([0.0, 1e-20, 2.0, 1.0])
    m = measure(t, g).metrics
    eps = np.finfo(np.float64).eps
    assert m["MaxRelativeErr"] == abs((2.0 + eps) - eps) / eps           # about 9e15
    assert m["One Thousandth Err Ratio"] == 0.75    # 0/0 and 1e-20/eps (4.5e-5) count as close
    assert m["MAPE"] == 0.0                         # only the nonzero golden is counted
    assert m["MeanRelativeErr"] == 0.0              # golden zeros count 0


def test_a_helper_thread_changes_nothing(monkeypatch):
    rng = np.random.default_rng(3)
    g = torch.from_numpy(rng.standard_normal(1_000_003).astype(np.float32))
    t = torch.relu(g * (1 + 1e-3 * torch.from_numpy(rng.standard_normal(g.numel()).astype(np.float32))))
    g = torch.relu(g)
    monkeypatch.setenv("OPDIFF_COMPARE_THREADS", "1")
    one = measure(t, g)
    monkeypatch.setenv("OPDIFF_COMPARE_THREADS", "2")
    two = measure(t, g)
    assert one.metrics == two.metrics                 # bit for bit: chunks are folded in order
    assert (one.error, one.scale_error) == (two.error, two.scale_error)


def test_golden_zeros_cost_about_as_much_as_dense_data():
    # msprobe-style eps handling used to take a 5-pass path on every chunk holding a golden zero
    # (ReLU outputs: most chunks), 3.5x the dense cost.
    import time

    g = torch.randn(2_000_000, generator=torch.Generator().manual_seed(0))
    t = g * 1.001
    z, tz = torch.relu(g), torch.relu(t)

    def cpu(a, b):
        best = math.inf
        for _ in range(5):
            start = time.process_time()
            measure(a, b)
            best = min(best, time.process_time() - start)
        return best

    # (2.5x: below the 3.5x of the old path; the CPU time of a 2 M-element pass moves by 2x when
    # the other core's tests share the cache, seen failing at 2.01x in a loaded CI run)
    assert cpu(tz, z) < 2.5 * cpu(t, g)


# -- tensors reach the metrics through the store's reader: mapped per key, memory bounded --------

def _write_dump(path, tensors: dict):
    from opdiff.store import DumpWriter

    writer = DumpWriter(path, {"environment": {}})
    writer.write({"seq": 0, "name": "Torch.op.0.forward", "op": "Torch.op", "kind": "api",
                  "phase": "forward", "inputs": [], "outputs": []})
    for key, t in tensors.items():
        writer.save_tensor(key, t.clone())
    writer.close()
    from opdiff.store import open_dump

    return open_dump(path)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_reading_a_whole_dump_holds_one_tensor_at_a_time(tmp_path):
    gen = torch.Generator().manual_seed(0)
    tensors = {f"t{i}": torch.randn(1 << 20, generator=gen) for i in range(24)}   # 4 MB each
    dump = _write_dump(tmp_path / "d", tensors)
    del tensors
    dump.tensor("t0").sum()                       # first use: lazy imports, allocator warm-up
    before = _rss_mb()
    total = 0.0
    for key in dump.tensor_keys():
        total += float(dump.tensor(key).sum())    # every page of the 96 MB is read once
    grown = _rss_mb() - before
    assert math.isfinite(total)
    assert grown < 24, f"RSS grew {grown:.0f} MB reading 96 MB of tensors"


def test_saved_tensors_come_back_exactly_and_writing_them_leaves_the_file_alone(tmp_path):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, generator=gen)
    tensors = {"f32": x, "f64": x.double(), "bf16": x.bfloat16(), "f16": x.half(),
               "i64": (x * 100).long(), "i32": (x * 100).int(), "i8": (x * 10).to(torch.int8),
               "u8": (x.abs() * 10).to(torch.uint8), "bool": x > 0, "scalar": torch.tensor(2.5),
               "empty": torch.zeros(0, 4), "odd": torch.arange(3, dtype=torch.int8)}
    dump = _write_dump(tmp_path / "d", tensors)
    for key, expected in tensors.items():
        got = dump.tensor(key)
        assert got.dtype == expected.dtype and got.shape == expected.shape, key
        assert torch.equal(got, expected), key
    loaded = dump.tensor("f32")
    loaded.mul_(0)                                # a caller may modify what it gets ...
    assert torch.equal(dump.tensor("f32"), x)     # ... the dump on disk never changes
    assert dump.tensor("absent") is None


def test_a_shard_cut_short_after_opening_raises_a_plain_error(tmp_path):
    dump = _write_dump(tmp_path / "d", {"a": torch.ones(1000), "b": torch.ones(4)})
    dump.tensor_keys()                            # the index is read while the shard is whole
    (shard,) = (tmp_path / "d" / "tensors").glob("*.safetensors")
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 2000)
    # The engine turns OSError/ValueError into "compare the statistics instead" with a warning.
    with pytest.raises((OSError, ValueError)):
        dump.tensor("a")


def _hand_written_shard(path, header: dict, data: bytes):
    import json
    import struct

    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_unaligned_tensor_data_from_other_writers_reads_exactly(tmp_path):
    dump = _write_dump(tmp_path / "d", {"a": torch.ones(2)})
    values = torch.tensor([1.5, -2.25, 3.0e-20])
    header = {"u8": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},          # floats
              "f32": {"dtype": "F32", "shape": [3], "data_offsets": [3, 15]}}      # at byte 3
    _hand_written_shard(tmp_path / "d" / "tensors" / "zz_other.safetensors", header,
                        bytes([7, 8, 9]) + values.numpy().tobytes())
    from opdiff.store import open_dump

    dump = open_dump(tmp_path / "d")
    assert torch.equal(dump.tensor("f32"), values)
    assert dump.tensor("u8").tolist() == [7, 8, 9]
    assert torch.equal(dump.tensor("a"), torch.ones(2))


def test_a_shard_with_a_malformed_header_is_skipped_with_a_warning(tmp_path, caplog):
    _write_dump(tmp_path / "d", {"a": torch.ones(2)})
    _hand_written_shard(tmp_path / "d" / "tensors" / "zz_bad.safetensors",
                        {"b": {"dtype": "F32", "shape": [1]}}, b"\0" * 4)   # no data_offsets
    from opdiff.store import open_dump

    dump = open_dump(tmp_path / "d")
    with caplog.at_level("WARNING", logger="opdiff"):
        assert dump.tensor("b") is None
    assert "zz_bad" in caplog.text
    assert torch.equal(dump.tensor("a"), torch.ones(2))
