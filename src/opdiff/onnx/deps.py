"""The optional ONNX dependencies, imported on demand with a message that says how to get them."""
from __future__ import annotations

from ..errors import OpdiffError


class OnnxError(OpdiffError):
    """A model, input file or option for `opdiff onnx` that cannot be used as given."""


def require():
    """(onnx, onnxruntime), or OnnxError telling the user how to install them."""
    try:
        import onnx
        import onnxruntime
    except ImportError as exc:
        missing = getattr(exc, "name", None) or "onnx"
        raise OnnxError(f"'{missing}' is not installed; ONNX model compare needs it: "
                        f"pip install 'opdiff[onnx]'") from None
    return onnx, onnxruntime
