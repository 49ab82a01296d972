"""When capture must stand aside and let an op run untouched."""
from __future__ import annotations

import sys

import torch


def capturing_graph() -> bool:
    """True while the current CUDA (or Ascend NPU) stream captures a graph.

    Captured ops do not run now but on each replay, when no Python runs: their tensors hold
    nothing yet, statistics kernels would be captured into the user's graph, and the host copy
    that fetches statistics would invalidate the capture.
    """
    if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        return True
    # torch.npu exists once torch_npu is imported (looking it up on torch otherwise costs a
    # failed module __getattr__, 2 us on every op)
    if "torch_npu" not in sys.modules:
        return False
    npu = getattr(torch, "npu", None)
    capturing = getattr(npu, "is_current_stream_capturing", None)
    return bool(capturing is not None and npu.is_initialized() and capturing())


def tracing_or_capturing() -> bool:
    """True while dynamo traces (it would trace opdiff's own Python into the user's graph and
    break the graph on it) or a device graph is being captured (see capturing_graph)."""
    return torch.compiler.is_compiling() or capturing_graph()
