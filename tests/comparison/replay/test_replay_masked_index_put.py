"""`aten._unsafe_masked_index_put_accumulate` (Inductor's embedding gradient in bf16) is on
replay's allow-list: a pure tensor computation (a new tensor: `self` with the masked values
added at the indices, clamped into `self`'s bounds), so a recorded call replays bitwise, in
float64, and a hostile dump's out-of-range indices cannot reach memory outside `self`."""
import torch

import opdiff
from opdiff import ops
from opdiff.comparison.replay.calls import rebuild_call
from opdiff.comparison.replay.local import replay_record
from opdiff.comparison.verdicts import Policy
from opdiff.store.reader import find_dumps, open_dump

OP = "Aten._unsafe_masked_index_put_accumulate"


def test_a_recorded_masked_index_put_replays_bitwise_and_in_float64(tmp_path):
    torch.manual_seed(0)
    grad = torch.zeros(6, 4, dtype=torch.bfloat16)
    ids = torch.tensor([0, 5, 2, 5, 7])             # 7 is out of range: masked out
    mask = (ids < 6).unsqueeze(1)
    values = torch.randn(5, 4, dtype=torch.bfloat16)
    call = torch.ops.aten._unsafe_masked_index_put_accumulate.default
    with opdiff.dump(None, tmp_path, level="L2", task="tensor"):
        call(grad, mask, [ids], values)
    assert not ops.replay_refusal(OP)
    dump = open_dump(find_dumps(tmp_path)[0])
    rec = next(r for r in dump.records() if r["op"] == OP)
    out = rebuild_call(rec, dump.tensor).run()
    assert torch.equal(out, dump.tensor(rec["outputs"][0]["key"]))
    local = replay_record(rec, dump.tensor, Policy())
    assert local.replayed and not local.culprit, local.describe()
    # a dump's indices far out of range are clamped into `self`, never read or written past it
    hostile = torch.tensor([10**12, -10**12, 3])
    got = call(torch.zeros(6, 4), torch.ones(3, 1, dtype=torch.bool), [hostile],
               torch.ones(3, 4))
    assert got.sum() == 12 and got[5].sum() == 4 and got[0].sum() == 4
