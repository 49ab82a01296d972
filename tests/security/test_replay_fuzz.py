"""Every op on replay's allow-list, called through replay's own path with random and
adversarial arguments a hostile dump can hold (`replay_fuzz.py`: huge, negative and zero sizes
and strides, out-of-range index tensors, wrong dtypes and enums, mismatched shapes), in child
processes under glibc's heap checks: none may die by a signal (a kernel that trusted what it
was given) or allocate past `--max-tensor-mb` (64 MB here; the address space is limited, so an
unbounded allocation shows as one the OS refused). A fixed seed, a bounded count per op."""
from __future__ import annotations

import pytest

import replay_fuzz


@pytest.mark.slow
def test_no_allow_listed_op_crashes_or_allocates_unbounded_on_hostile_arguments(tmp_path):
    result = replay_fuzz.run_all(tmp_path, seed=0, trials=(12, 2))
    assert result["targets"] > 1500, result["targets"]
    assert not result["crashes"], "\n".join(f"{op}: rc {rc}: {call}"
                                            for op, rc, call in result["crashes"])
    assert not result["allocs"], "\n".join(result["allocs"][:20])
    assert result["maxrss_kb"] < 1_500_000, result["maxrss_kb"]
