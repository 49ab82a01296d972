"""Description handles (capture/handles.py): each kind shares its statistics and verifies a
later read of its tensor its own way (hash or bytes, a copy, a sum; a device vector not at all)."""
from __future__ import annotations

import torch

from opdiff.capture import handles
from opdiff.capture.stats import StatsBatch


def _batch(cpu_as_device: bool = False):
    batch = StatsBatch(cpu_as_device=cpu_as_device)
    seen: list = []
    batch.on_outside = lambda desc, values, where: seen.append((desc, where))
    return batch, seen


def test_a_large_cpu_tensor_is_known_at_once_and_verified_by_its_sum():
    batch, seen = _batch()
    t = torch.randn(1 << 15)
    desc: dict = {}
    handle = batch.add(desc, t)
    assert isinstance(handle, handles.Known) and desc["stats"] == handle.stats
    shared: dict = {}
    assert batch.share(shared, handle, t, "where") is handle and shared["stats"] == desc["stats"]
    assert not seen
    t.numpy()[3] += 100.0           # a write the version counter does not see
    changed: dict = {}
    fresh = batch.share(changed, handle, t, "where")
    assert isinstance(fresh, handles.Known) and fresh is not handle
    assert changed["stats"] == fresh.stats != desc["stats"]
    assert seen == [(changed, "where")]


def test_a_small_cpu_tensor_is_verified_by_its_bytes_then_by_its_hash():
    batch, seen = _batch()
    t = torch.randn(8)
    desc: dict = {}
    handle = batch.add(desc, t)
    assert isinstance(handle, handles.Small) and handle.staged is not None
    same: dict = {}
    assert batch.share(same, handle, t, "w0") is handle      # bytes still staged, unchanged
    batch.resolve()
    assert same["stats"] == desc["stats"] and handle.digest is not None and handle.values is None
    after: dict = {}
    assert batch.share(after, handle, t, "w1") is handle and after["stats"] == desc["stats"]
    t.numpy()[0] = 1e6              # through NumPy: the version counter stays
    changed: dict = {}
    check = batch.share(changed, handle, t, "w2")
    assert isinstance(check, handles.Small) and check.original is handle
    batch.resolve()
    assert changed["stats"]["max"] == 1e6 and seen == [(changed, "w2")]
    assert check.original is None and check.values is None     # settled


def test_a_device_vector_is_fetched_at_flush_and_not_verified():
    batch, seen = _batch(cpu_as_device=True)
    t = torch.randn(1 << 15)
    desc: dict = {}
    handle = batch.add(desc, t)
    assert isinstance(handle, handles.DeviceVector) and handle.numel == t.numel()
    shared: dict = {}
    t.numpy()[0] = 1e6
    assert batch.share(shared, handle, t, "w") is handle
    assert "stats" not in desc and "stats" not in shared
    batch.resolve()
    # reduced on the device when described: the later write is neither in it nor reported
    assert shared["stats"] == desc["stats"] and desc["stats"]["max"] < 1e6 and not seen


def test_no_statistics_is_shared_as_none():
    batch, _ = _batch()
    desc: dict = {}
    handle = batch.add(desc, torch.empty(0))
    assert handle is handles.NO_STATS and desc["stats"] is None
    shared: dict = {}
    assert batch.share(shared, handle, torch.empty(0), "w") is handle and shared["stats"] is None


def test_a_transposed_view_of_a_large_tensor_read_again_is_not_taken_for_a_write_outside_torch():
    """A view over the same memory block as a tensor described before shares its statistics;
    read again in a later op it is verified by its sum, which must be taken in the order the
    shared statistics summed it (memory order), or float32 rounding reads as a change."""
    from opdiff.capture.describe import Describer
    describer = Describer(StatsBatch(), None, save=False)
    torch.manual_seed(0)
    x = torch.randn(256, 128) * 1000 + 7
    first = describer.describe(x, "Torch.add.0.forward", "input", 0)
    view = x.t()
    describer.epoch += 1
    shared = describer.describe(view, "Tensor.t.0.forward", "output", 0)
    describer.epoch += 1
    again = describer.describe(view, "Torch.mul.0.forward", "input", 0)
    assert "outside" not in shared and "outside" not in again
    assert again["stats"] == shared["stats"] == first["stats"]
    x.numpy()[3, 5] += 100.0        # a write the version counter does not see is still found
    describer.epoch += 1
    changed = describer.describe(view, "Torch.mul.1.forward", "input", 0)
    assert changed.get("outside") is True and changed["stats"] != first["stats"]


def test_a_cloned_transpose_is_verified_by_its_bytes_then_by_the_hash_of_its_clone():
    batch, seen = _batch()
    t = torch.randn(6, 4).t()       # one memory block, not contiguous: cloned, not staged
    desc: dict = {}
    handle = batch.add(desc, t)
    assert isinstance(handle, handles.Small) and handle.staged is None
    assert handle.digest == handles.AT_FLUSH     # not hashed when described
    assert batch.share({}, handle, t, "w0") is handle      # compared with the clone in place
    batch.resolve()
    assert handle.digest == handles.digest(t) and handle.values is None
    assert batch.share({}, handle, t, "w1") is handle
    t.numpy()[0, 0] = 1e6           # through NumPy: the version counter stays
    changed: dict = {}
    check = batch.share(changed, handle, t, "w2")
    assert isinstance(check, handles.Small) and check.original is handle
    batch.resolve()
    assert changed["stats"]["max"] == 1e6 and seen == [(changed, "w2")]


def test_a_cloned_transpose_written_outside_torch_before_its_flush_is_found():
    batch, seen = _batch()
    t = torch.randn(6, 4).t()
    desc: dict = {}
    handle = batch.add(desc, t)
    t.numpy()[1, 2] = -1e6
    changed: dict = {}
    check = batch.share(changed, handle, t, "w")
    assert check is not handle and check.original is handle
    batch.resolve()
    assert changed["stats"]["min"] == -1e6 and desc["stats"]["min"] > -1e6
    assert seen == [(changed, "w")]


def test_staged_bytes_are_hashed_only_for_tensors_that_can_be_read_again():
    import weakref
    batch, _ = _batch()
    kept, gone = torch.randn(16), torch.randn(16)
    staged = [batch.add_contiguous({}, t, t.dtype, t.numel(), t.data_ptr(), weakref.ref(t))
              for t in (kept, gone)]
    del gone
    batch.resolve()
    assert staged[0].digest == handles.digest(kept) and staged[1].digest is None
    last = batch.add_contiguous({}, kept, kept.dtype, kept.numel(), kept.data_ptr(), weakref.ref(kept))
    batch.resolve(digests=False)     # the step's last flush: no reader is left
    assert last.digest is None and last.stats == staged[0].stats
