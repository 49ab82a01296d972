"""`--device DEV`: which torch device a statistics check re-runs its ops on.

    from opdiff.check.device import usable_device
    usable_device("cuda:0")      # "cuda:0", or ConfigError with the reason in one line

Any torch device string works (cpu, cuda, cuda:1, xpu, mps, npu:0, ...). Devices that an
extension registers (Ascend's `npu` comes with `torch_npu`) are parsed after importing that
extension, in the checking process and in each worker (`jobs`, Ray). A device is usable when a
tiny tensor can be made and added on it: a garbage string, a device this torch was built
without, a missing extension or an index past the last device is refused before any op is
replayed. `meta` is refused too: it computes no values.
"""
from __future__ import annotations

import importlib
from typing import Optional

import torch

from ..errors import ConfigError

# Device types that an out-of-tree extension registers: importing it makes the type parse.
EXTENSIONS = {"npu": "torch_npu"}
EXAMPLES = "e.g. cpu, cuda, cuda:1, npu:0, xpu, mps"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = text if len(text) <= 120 else text[:117] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _parse(text: str) -> torch.device:
    kind = text.split(":", 1)[0].strip().lower()
    module: Optional[str] = EXTENSIONS.get(kind)
    if module is not None:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"--device {text!r}: the {kind} device needs {module}, which is not "
                              f"installed here ({_first_line(exc)})") from None
    try:
        return torch.device(text)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ConfigError(f"--device {text!r} is not a torch device ({EXAMPLES}): "
                          f"{_first_line(exc)}") from None


def usable_device(text: str) -> str:
    """The device string, checked: it parses as a torch device and a tensor can be made and
    added on it. Raises ConfigError (one line, the CLI exits 2) otherwise."""
    device = _parse(str(text).strip())
    if device.type == "meta":
        raise ConfigError(f"--device {text!r}: the meta device computes no values; give a real "
                          f"one ({EXAMPLES})")
    try:
        probe = torch.ones(2, device=device)
        (probe + probe).cpu()
    except Exception as exc:  # noqa: BLE001 - torch raises Assertion/Runtime/NotImplemented...
        raise ConfigError(f"--device {text!r} is not available here: {_first_line(exc)}") from None
    return str(device)
