"""Views of saved tensors are stored as references to the bytes they view, and every reader path
gives back exactly the tensors a dump written without references gives."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import opdiff
from opdiff.store import find_dumps, iter_tensors, open_dump
from opdiff.store.adapters import discover
from opdiff.store.reader import _Ref
from opdiff.store.writer import DumpWriter


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _same(a, b) -> bool:
    return (a is not None and b is not None and a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(_bits(a), _bits(b)))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(x.view(x.shape[0], -1))      # a view of the pooled activations


class Attention(nn.Module):
    """A transformer block written out: view, transpose, reshape, expand, getitem."""

    def __init__(self, d: int = 16, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.bias = nn.Parameter(torch.zeros(1, 1, 1, 8))

    def forward(self, x):
        b, s, d = x.shape
        qkv = self.qkv(self.norm(x)).view(b, s, 3, self.heads, d // self.heads)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]          # getitem: views of qkv
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5
        scores = scores + self.bias.expand(b, self.heads, s, s)    # expand: a view
        out = scores.softmax(-1) @ v
        x = x + self.proj(out.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(x)


def _step(model, x, path, references: bool, level="L1"):
    torch.manual_seed(0)
    old, DumpWriter.references = DumpWriter.references, references
    try:
        dbg = opdiff.PrecisionDebugger(dump_path=str(path), level=level, task="tensor")
        params = list(model.parameters())
        dbg.start(model)
        model(x).float().pow(2).mean().backward()
        if params:
            torch.optim.SGD(params, lr=0.1).step()
        dbg.stop()
        dbg.step()
    finally:
        DumpWriter.references = old
    (directory,) = find_dumps(path)
    return open_dump(directory)


def _pair(make_model, x, tmp_path, level="L1"):
    """The same step dumped without references and with them."""
    torch.manual_seed(1)
    plain = _step(make_model(), x, tmp_path / "plain", False, level)
    torch.manual_seed(1)
    refs = _step(make_model(), x, tmp_path / "refs", True, level)
    return plain, refs


def _refs(dump) -> dict[str, _Ref]:
    return {k: e for k, e in dump._index().items() if isinstance(e, _Ref)}


def _tensor_bytes(dump) -> int:
    return sum(f.stat().st_size for f in (dump.path / "tensors").glob("*.safetensors"))


def _assert_same_tensors(plain, refs):
    """Every recorded tensor of every record loads the same from both dumps."""
    a, b = list(plain.records()), list(refs.records())
    assert [r["name"] for r in a] == [r["name"] for r in b]
    compared = 0
    for ra, rb in zip(a, b):
        ta, tb = list(iter_tensors(ra)), list(iter_tensors(rb))
        assert [(n, d["shape"], d["dtype"]) for n, _, d in ta] == [(n, d["shape"], d["dtype"]) for n, _, d in tb]
        for (name, _, da), (_, _, db) in zip(ta, tb):
            if "key" in da or "key" in db:
                x, y = plain.tensor(da["key"]), refs.tensor(db["key"])
                assert _same(x, y), name
                assert y.is_contiguous(), name           # like every other loaded tensor
                compared += 1
    assert compared > 20
    for key in refs.tensor_keys():                       # and every saved tensor loads
        assert refs.tensor(key) is not None, key


def _ops_referenced(dump) -> set[str]:
    refs = _refs(dump)
    ops = set()
    for record in dump.records():
        for _, _, desc in iter_tensors(record):
            if desc.get("key") in refs:
                ops.add(record["op"])
    return ops


def test_a_cnn_reads_back_the_same_with_its_view_a_reference(tmp_path):
    x = torch.randn(4, 3, 8, 8)
    plain, refs = _pair(SmallCNN, x, tmp_path)
    _assert_same_tensors(plain, refs)
    assert "Tensor.view" in _ops_referenced(refs)
    assert not _refs(plain)
    assert _tensor_bytes(refs) < _tensor_bytes(plain)


def test_a_transformer_block_stores_its_views_once(tmp_path):
    x = torch.randn(2, 8, 16)
    plain, refs = _pair(Attention, x, tmp_path)
    _assert_same_tensors(plain, refs)
    ops = _ops_referenced(refs)
    assert {"Tensor.view", "Tensor.__getitem__", "Tensor.transpose", "Tensor.expand"} <= ops, ops
    saved = sum(plain._index()[k].nbytes for k in _refs(refs))
    assert _tensor_bytes(plain) - _tensor_bytes(refs) >= saved > 0
    # at mix level modules' outputs join in; still the same tensors
    plain_mix, refs_mix = _pair(Attention, x, tmp_path / "mix", level="mix")
    _assert_same_tensors(plain_mix, refs_mix)


class WritesAfterView(nn.Module):
    """Views whose base is written in place after they were taken: their values then are not
    what was saved for the base, so they must be saved as bytes of their own."""

    def forward(self, x):
        y = x * 2                        # saved (base)
        v = y.view(-1)                   # a view, same bytes: a reference
        w = v + 1
        y.add_(1)                        # in place: v now shows new values
        u = v * 3                        # v saved again: new version, not a reference to y's old bytes
        z = y * 1                        # y after the write
        y.data.mul_(5)                   # a write the version counter does not see
        t = y.t()                        # same version as before .data's write, other bytes
        return w.sum() + u.sum() + z.sum() + t.exp().sum()


def test_a_view_of_memory_written_since_is_not_a_reference(tmp_path):
    x = torch.randn(16, 8, requires_grad=True)        # views over 256 bytes: worth a reference
    plain, refs = _pair(WritesAfterView, x, tmp_path)
    _assert_same_tensors(plain, refs)
    records = {r["name"]: r for r in refs.records()}
    exp_input = records["Tensor.exp.0.forward"]["inputs"][0]["key"]
    t = refs.tensor(exp_input)
    base = refs.tensor(records["Tensor.__mul__.0.forward"]["outputs"][0]["key"])
    assert torch.allclose(t, ((base + 1) * 5).t())      # what the op really read
    assert exp_input not in _refs(refs)
    # v after y.add_: a reference to bytes as they are now (add_'s output, or w = v + 1 which
    # equals it), never to y's old ones
    mul3 = records["Tensor.__mul__.1.forward"]["inputs"][0]["key"]
    first = records["Tensor.__mul__.0.forward"]["outputs"][0]["key"]
    assert _refs(refs)[mul3].base in {records["Tensor.add_.0.forward"]["outputs"][0]["key"],
                                      records["Tensor.__add__.0.forward"]["outputs"][0]["key"]}
    assert _refs(refs)[mul3].base != first


def test_references_span_shard_rotation(tmp_path, monkeypatch):
    import opdiff.store.writer as writer
    monkeypatch.setattr(writer, "_SHARD_BYTES", 4096)       # a shard every few tensors
    from opdiff.store.writer import _TensorSink
    sink = _TensorSink(tmp_path / "tensors")
    g = torch.Generator().manual_seed(0)
    base = torch.randn(64, 32, generator=g)                  # 8 KB: a shard of its own
    sink.put("base", base)
    wanted = {"base": base}
    for i in range(40):                                      # views: refs in later shards
        view = base[i % 7:, ::3].t() if i % 2 else base.view(32, 64)[i % 32]
        sink.put(f"view{i}", view.detach())
        sink.put(f"other{i}", torch.randn(300, generator=g))
        wanted[f"view{i}"] = view.clone()
    sink.close()
    shards = sorted((tmp_path / "tensors").glob("*.safetensors"))
    assert len(shards) > 5
    from safetensors import safe_open
    from safetensors.torch import load_file
    written = {}
    for shard in shards:             # still plain safetensors: references are header metadata
        written.update(load_file(str(shard)))
        with safe_open(str(shard), framework="pt") as f:
            assert all(k.startswith("ref:view") for k in (f.metadata() or {}))
    assert set(written) == {"base"} | {f"other{i}" for i in range(40)}
    from opdiff.store.reader import Dump
    (tmp_path / "records.jsonl").write_text("")
    dump = Dump(path=tmp_path, meta={})
    index = dump._index()
    assert all(isinstance(index[f"view{i}"], _Ref) for i in range(40))
    assert index["base"].shard == shards[0] and dump.holds_tensors
    for key, t in wanted.items():
        assert _same(dump.tensor(key), t), key


def test_a_full_header_of_references_opens_the_next_shard(tmp_path):
    from opdiff.store.writer import _StreamingShard, _TensorSink
    sink = _TensorSink(tmp_path / "tensors")
    base = torch.arange(4096, dtype=torch.float32)
    sink.put("base", base)
    n = _StreamingShard.HEADER_BYTES // 120 + 50             # more references than one header holds
    for i in range(n):
        sink.put(f"a fairly long name for reference number {i:05d} of the base tensor", base[i:i + 64])
    sink.close()
    from opdiff.store.reader import Dump
    (tmp_path / "records.jsonl").write_text("")
    dump = Dump(path=tmp_path, meta={})
    assert len(list((tmp_path / "tensors").glob("*.safetensors"))) >= 2
    for i in (0, n // 2, n - 1):
        got = dump.tensor(f"a fairly long name for reference number {i:05d} of the base tensor")
        assert torch.equal(got, base[i:i + 64])
    assert all(isinstance(e, _Ref) for k, e in dump._index().items() if k != "base")


def test_the_background_thread_makes_references_from_the_origin(tmp_path):
    """A device tensor reaches the writer as a private copy: the view it was made from (origin)
    tells which saved tensor it views. No device here: the thread is fed as put() feeds it."""
    from opdiff.store.writer import _TensorSink
    sink = _TensorSink(tmp_path / "tensors")
    base = torch.randn(16, 10)
    view = base.t()[1:]
    for key, t in (("base", base), ("view", view)):
        copy = t.clone()
        sink._enqueue(key, copy, copy.numel() * 4, sink.aliases.link(key, t))
    changed = base.t()[2:].clone()
    changed[0, 0] += 1                 # claims to view base but holds other bytes: written whole
    sink._enqueue("changed", changed, changed.numel() * 4, sink.aliases.link("changed", base.t()[2:]))
    flat = base.reshape(-1).clone()    # without its origin: found by its bytes
    sink._enqueue("flat", flat, flat.numel() * 4, None)
    sink.close()
    from opdiff.store.reader import Dump
    (tmp_path / "records.jsonl").write_text("")
    dump = Dump(path=tmp_path, meta={})
    index = dump._index()
    assert isinstance(index["view"], _Ref) and not isinstance(index["changed"], _Ref)
    assert index["flat"].base == "base"
    assert _same(dump.tensor("view"), view) and _same(dump.tensor("changed"), changed)
    assert _same(dump.tensor("flat"), flat)


def test_a_reference_whose_base_is_lost_is_reported_not_loaded(tmp_path, monkeypatch, caplog):
    import opdiff.store.writer as writer
    monkeypatch.setattr(writer, "_SHARD_BYTES", 1024)
    from opdiff.store.writer import _TensorSink
    sink = _TensorSink(tmp_path / "tensors")
    base = torch.randn(32, 64)
    sink.put("base", base)
    sink.put("view", base[3])
    sink.put("alone", torch.ones(3))
    sink.close()
    shards = sorted((tmp_path / "tensors").glob("*.safetensors"))
    shards[0].write_bytes(shards[0].read_bytes()[:100])      # the base's shard, broken
    from opdiff.store.reader import Dump
    (tmp_path / "records.jsonl").write_text("")
    dump = Dump(path=tmp_path, meta={})
    with caplog.at_level(logging.WARNING, logger="opdiff"):
        assert dump.tensor("view") is None
        assert torch.equal(dump.tensor("alone"), torch.ones(3))
    assert "view" not in dump.tensor_keys() and "alone" in dump.tensor_keys()
    assert any("refer to tensors this dump lacks" in r.message for r in caplog.records)


def test_a_malformed_reference_makes_its_shard_unreadable_not_the_reader_crash(tmp_path, caplog):
    from opdiff.store.writer import _StreamingShard
    tdir = tmp_path / "tensors"
    tdir.mkdir()
    shard = _StreamingShard(tdir / "shard_00000.tmp")
    shard.add("base", torch.arange(4.0))
    shard.refs["ref:bad"] = json.dumps({"base": "base", "offset": "x"})
    shard.finish()
    from opdiff.store.reader import Dump
    (tmp_path / "records.jsonl").write_text("")
    with caplog.at_level(logging.WARNING, logger="opdiff"):
        assert Dump(path=tmp_path, meta={}).tensor_keys() == []
    assert any("malformed reference" in r.message for r in caplog.records)


def test_every_reader_path_gives_the_same_tensors(tmp_path):
    """discover()'s DumpSource, compare (with replay of every op) and check read a dump with
    references exactly as one without."""
    from opdiff.api import compare
    from opdiff.check.runner import check_dump
    x = torch.randn(2, 8, 16)
    plain, refs = _pair(Attention, x, tmp_path)
    assert _refs(refs)
    (source,) = discover(refs.path)
    assert source.holds_tensors and source.record_count() == plain.record_count() > 0
    assert sorted(source.tensor_keys()) == sorted(plain.tensor_keys())
    result = compare(str(refs.path), str(plain.path), replay="all")
    assert result.counts["error"] == result.counts["warning"] == result.counts["unmatched"] == 0
    assert all(row.error in (0.0, None) for row in result.rows)
    other = compare(str(plain.path), str(plain.path), replay="all")
    assert [(r.target_name, r.result, r.metrics) for r in result.rows] == \
           [(r.target_name, r.result, r.metrics) for r in other.rows]
    checks = [check_dump(str(d.path)) for d in (plain, refs)]
    assert checks[0].checked
    assert [(o.name, o.status, o.reason) for o in checks[0].ops] == \
           [(o.name, o.status, o.reason) for o in checks[1].ops]


_CHILD = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, sys.argv[2])
    from test_references import Attention
    import opdiff
    torch.manual_seed(0)
    model = Attention()
    x = torch.randn(2, 8, 16)
    dbg = opdiff.PrecisionDebugger(dump_path=sys.argv[1], task="tensor", level="L1")
    dbg.start(model)
    for i in range(10 ** 6):          # keeps recording until the parent kills it
        model(x).sum().backward()
        if i == 3:
            dbg.stop()                # flushes what was recorded so far
            print("flushed", flush=True)
            dbg.start(model)
        if i == 8:
            print("running", flush=True)
""")


@pytest.mark.slow
def test_a_run_killed_mid_dump_leaves_every_reference_readable(tmp_path, monkeypatch):
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "dump"),
                             os.path.dirname(__file__)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "flushed"
        assert proc.stdout.readline().strip() == "running"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    (directory,) = find_dumps(tmp_path / "dump")
    dump = open_dump(directory)
    refs = _refs(dump)
    assert refs and dump.holds_tensors and dump.record_count() > 0
    for key in refs:                                 # each one loads, from its base's bytes
        t = dump.tensor(key)
        assert t is not None and list(t.shape) == list(refs[key].shape)
    base_of = {k: r.base for k, r in refs.items()}
    assert all(b in dump.tensor_keys() for b in base_of.values())
    # what the first flush wrote is all there: the op records before it have their tensors
    keys = set(dump.tensor_keys())
    first = [r for r in dump.records()][:50]
    assert all(d.get("key") in keys for r in first for _, _, d in iter_tensors(r) if "key" in d)


def _sink_dump(tmp_path, feed, **kwargs):
    """Feed a tensor writer, then open what it wrote."""
    from opdiff.store.reader import Dump
    from opdiff.store.writer import _TensorSink
    sink = _TensorSink(tmp_path / "tensors", **kwargs)
    feed(sink)
    sink.close()
    (tmp_path / "records.jsonl").write_text("")
    return sink, Dump(path=tmp_path, meta={})


def test_a_copy_of_written_bytes_is_a_reference_and_a_near_copy_is_not(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 32, generator=g)
    near = x.clone()
    near[0, 1] += 1            # not one of the 32 sampled elements: only the whole compare sees it
    from opdiff.store.references import Aliases
    assert Aliases().same_bytes(near)[1] == Aliases().same_bytes(x)[1]      # the same fingerprint
    nan = torch.full((300,), float("nan"))
    wanted = {"x": x, "copy": x.clone(), "near": near, "zeros": torch.zeros(8, 40),
              "zeros again": torch.zeros(8, 40), "other shape": x.clone().view(16, 64),
              "other dtype": x.view(torch.int32).clone(), "nan": nan, "nan again": nan.clone(),
              "bf16": x.bfloat16(), "bf16 again": x.bfloat16(), "copy's view": None}

    def feed(sink):
        for key, t in wanted.items():
            if key == "copy's view":                 # views of a copy stored as a reference
                t = wanted[key] = wanted["copy"].t()[3:]
            sink.put(key, t)

    sink, dump = _sink_dump(tmp_path, feed)
    index = dump._index()
    refs = {k: e.base for k, e in index.items() if isinstance(e, _Ref)}
    assert refs == {"copy": "x", "zeros again": "zeros", "nan again": "nan", "bf16 again": "bf16",
                    "copy's view": "x", "other shape": "x"}       # the same bytes, seen as (16, 64)
    for key, t in wanted.items():
        assert _same(dump.tensor(key), t), key
    assert sink.referenced_bytes == sum(wanted[k].numel() * wanted[k].element_size() for k in refs)
    _, alone = _sink_dump(tmp_path / "views only", feed, same_bytes=False)
    assert {k: e.base for k, e in alone._index().items() if isinstance(e, _Ref)} == {"copy's view": "copy"}
    assert _same(alone.tensor("copy's view"), wanted["copy's view"])


def test_a_tiny_tensor_is_written_not_referenced(tmp_path):
    base = torch.randn(100)

    def feed(sink):
        sink.put("base", base)
        sink.put("small view", base[:8])      # 32 bytes: its reference would cost more
        sink.put("small copy", base[:8].clone())
        sink.put("big view", base[10:90])

    _, dump = _sink_dump(tmp_path, feed)
    assert [k for k, e in dump._index().items() if isinstance(e, _Ref)] == ["big view"]


def test_a_key_saved_twice_reads_back_its_bytes_not_a_reference_to_itself(tmp_path):
    # (capture saves a tensor again under its name when it finds it written outside torch: the
    # second save repeats the first's bytes and is stored as a reference to that same key)
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))

    def feed(sink):
        sink.put("x", x)
        sink.put("x", x.clone())

    _, dump = _sink_dump(tmp_path, feed)
    assert _same(dump.tensor("x"), x)
