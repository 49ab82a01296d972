"""Shards written by opdiff's own safetensors writer read back bit for bit, with safetensors'
reader and with opdiff's."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file


def _tensors():
    g = torch.Generator().manual_seed(3)
    return {
        "f32": torch.randn(3, 4, generator=g),
        "bf16": torch.randn(5, generator=g).bfloat16(),
        "f16": torch.randn(2, 3, generator=g).half(),
        "f64": torch.randn(7, generator=g).double(),
        "i64_scalar": torch.tensor(-3),
        "empty": torch.zeros(0, 3),
        "transposed": torch.randn(4, 6, generator=g).t(),
        "bool": torch.tensor([True, False, True]),
        "u8": torch.arange(10, dtype=torch.uint8),
        "fp8": torch.randn(4, generator=g).to(torch.float8_e4m3fn),
        "odd_length": torch.randn(3, generator=g).half(),   # 6 bytes: later data stays in place
        "after_odd": torch.randn(5, generator=g),
    }


def _bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def _read_shards(directory):
    from opdiff.store.reader import _shard_entries
    got, ours = {}, {}
    for shard in sorted(directory.glob("*.safetensors")):
        got.update(load_file(str(shard)))                 # safetensors' own reader
        ours.update(_shard_entries(shard))                # and opdiff's
        header_len = int.from_bytes(shard.read_bytes()[:8], "little")
        assert (8 + header_len) % 8 == 0                  # data starts 8-byte aligned
    assert set(got) == set(ours)
    assert not list(directory.glob("*.tmp"))
    return got


@pytest.mark.parametrize("complex_too", [False, True])
def test_written_shard_reads_back_exactly(tmp_path, complex_too):
    from opdiff.store.writer import _TensorSink
    tensors = _tensors()
    if complex_too:   # a dtype the streaming writer leaves to safetensors
        tensors["c64"] = torch.randn(3, dtype=torch.complex64)
    sink = _TensorSink(tmp_path / "tensors")
    for key, t in tensors.items():
        sink.put(key, t)
    sink.close()
    back = _read_shards(tmp_path / "tensors")
    assert set(back) == set(tensors)
    for key, t in tensors.items():
        assert back[key].dtype == t.dtype and back[key].shape == t.shape, key
        assert torch.equal(_bits(back[key]), _bits(t)), key


def test_dump_reader_reads_the_shards(tmp_path):
    import opdiff
    from opdiff.store.reader import open_dump
    x = torch.randn(4, 5).bfloat16()
    with opdiff.dump(None, tmp_path / "d", level="L1", task="tensor"):
        y = torch.tanh(x)
    dump = open_dump(tmp_path / "d" / "step0" / "rank0")
    rec = next(r for r in dump.records() if r["name"] == "Torch.tanh.0.forward")
    assert torch.equal(dump.tensor(rec["inputs"][0]["key"]), x)
    assert torch.equal(dump.tensor(rec["outputs"][0]["key"]), y)


def test_queued_tensors_and_inline_tensors_land_in_the_same_shards(tmp_path):
    """Device tensors go through the background thread, CPU tensors are written inline; there is
    no device here, so the thread is fed directly, as put() does for a device tensor."""
    from opdiff.store.writer import _TensorSink
    sink = _TensorSink(tmp_path / "tensors")
    inline = torch.randn(4, 4)
    sink.put("inline", inline)
    queued = torch.arange(6, dtype=torch.int32)
    sink._enqueue("queued", queued, queued.numel() * queued.element_size(), None)
    sink.flush(wait=True)
    sink.put("after", torch.ones(2))
    sink.close()
    assert sink.error is None
    got = _read_shards(tmp_path / "tensors")
    assert torch.equal(got["inline"], inline) and torch.equal(got["queued"], queued)
    assert torch.equal(got["after"], torch.ones(2))


def test_a_failing_tensor_write_is_logged_once_and_never_raised(tmp_path, caplog):
    from opdiff.store.writer import _TensorSink
    blocker = tmp_path / "tensors"
    blocker.write_text("a file where the shard directory should be")
    sink = _TensorSink(blocker)
    sink.put("a", torch.randn(3))
    sink.flush(wait=True)
    sink.put("b", torch.randn(3))
    sink.close()
    assert sink.error is not None
    assert sum("writing tensors failed" in r.message for r in caplog.records) == 1


def test_cpu_tensors_are_written_when_saved_not_copied(tmp_path, monkeypatch):
    """A CPU tensor's bytes are in the shard when put() returns: changing it afterwards (the
    next, in-place op) changes nothing saved, and no private copy is made."""
    from opdiff.store.writer import _StreamingShard, _TensorSink
    monkeypatch.setattr(_StreamingShard, "HEADER_BYTES", 1024)     # a few entries per shard
    sink = _TensorSink(tmp_path / "tensors")
    originals = {}
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    for i in range(40):
        key = f"Tensor.add_.{i}.forward.input.0" + "_long_name" * 3
        originals[key] = x.clone()
        sink.put(key, x if i % 3 else x.t())            # non-contiguous views too
        originals[key] = originals[key] if i % 3 else originals[key].t()
        x.add_(1)                                         # the in-place op that follows
    sink.put("c64", torch.randn(3, dtype=torch.complex64))   # a dtype kept for its own shard
    sink.close()
    assert sink.error is None
    assert len(list((tmp_path / "tensors").glob("*.safetensors"))) > 3
    got = _read_shards(tmp_path / "tensors")
    assert set(got) == set(originals) | {"c64"}
    for key, t in originals.items():
        assert torch.equal(got[key], t), key


def test_tensor_task_keeps_inputs_of_in_place_ops_as_they_were(tmp_path):
    import opdiff
    from opdiff.store.reader import open_dump
    x = torch.randn(64, 64)
    before = x.clone()
    with opdiff.dump(None, tmp_path / "d", level="L1", task="tensor"):
        x.mul_(2)
        x.add_(1)
    dump = open_dump(tmp_path / "d" / "step0" / "rank0")
    recs = {r["name"]: r for r in dump.records()}
    assert torch.equal(dump.tensor(recs["Tensor.mul_.0.forward"]["inputs"][0]["key"]), before)
    assert torch.equal(dump.tensor(recs["Tensor.add_.0.forward"]["inputs"][0]["key"]), before * 2)
    assert torch.equal(dump.tensor(recs["Tensor.add_.0.forward"]["outputs"][0]["key"]), x)
