"""What an op calls its arguments: `Functional.scaled_dot_product_attention`'s input 0 is `query`.

A region's verdict names the tensors that enter it by the arguments they are read as (its SDPA's
`query`, `key`, `value`, `attn_mask`), the names a user knows from the code:

    from opdiff.comparison.arguments import argument_name
    argument_name("Functional.scaled_dot_product_attention", "1")      # "key"
    argument_name("Torch.cat", "0.2")                                  # "tensors[2]"
    argument_name("Tensor.__mul__", "0")                               # None: no better name

The op name comes from a dump, which is untrusted: it only selects an entry of the `__dict__` of
`torch`, `torch.nn.functional` or the Tensor class already imported (no module is imported, no
attribute hook runs, nothing is called), and the names are read from that function's Python
signature, or from the first line of a builtin's docstring (`matmul(input, other, *, out=None)`).
A keyword argument is recorded under its own name (`input.attn_mask`), which is used as it is.
"""
from __future__ import annotations

import functools
import inspect
import re
from typing import Any, Optional

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PARAMETER = re.compile(r"^\s*(\*{0,2})([A-Za-z_][A-Za-z0-9_]*)")


def argument_name(op: str, key: str) -> Optional[str]:
    """The name the argument recorded as `input.<key>` of `op` has in the op's signature
    (`key`: "0", "2.1" for the second tensor of a list argument, or a keyword's name); None
    when the signature says nothing (a Tensor operator, an op this torch does not have)."""
    first, _, rest = key.partition(".")
    if not first.isdigit():
        name: Optional[str] = first if _IDENTIFIER.match(first) else None
    else:
        names = positional_names(op)
        name = names[int(first)] if int(first) < len(names) else None
    if name is None:
        return None
    return name + "".join(f"[{part}]" for part in rest.split(".")) if rest else name


@functools.lru_cache(maxsize=512)
def positional_names(op: str) -> tuple[str, ...]:
    """The names of `op`'s positional parameters, in order (a Tensor method's first is
    `self`); () when they cannot be read without running anything the name selects."""
    found = _function(op)
    if found is None:
        return ()
    func, method = found
    names = _from_signature(func) or _from_doc(func, op.rsplit(".", 1)[-1])
    if not names:
        return ()
    return ("self",) + names if method and names[0] != "self" else names


def _function(op: str) -> Optional[tuple[Any, bool]]:
    """(the torch function `op` names, whether it is a Tensor method), or None. Looked up in
    the namespaces' own dictionaries only: never an import, never a `__getattr__`."""
    prefix, _, name = op.partition(".")
    if not _IDENTIFIER.match(name) or name.startswith("_"):
        return None
    import torch    # (already imported by whoever compares: this imports nothing new)

    spaces: dict[str, tuple[Any, ...]] = {
        "Functional": (torch.nn.functional,), "Torch": (torch, torch._C._VariableFunctions),
        "Tensor": (torch.Tensor, torch._C.TensorBase)}
    for space in spaces.get(prefix, ()):
        func = getattr(space, "__dict__", {}).get(name)
        if inspect.isroutine(func):     # (a function or builtin, never a class or a module)
            return func, prefix == "Tensor"
    return None


def _from_signature(func: Any) -> tuple[str, ...]:
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):     # a builtin without a text signature
        return ()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = []
    for p in parameters:
        if p.kind not in positional:
            break
        names.append(p.name)
    return tuple(names)


def _from_doc(func: Any, name: str) -> tuple[str, ...]:
    """The positional parameters of a builtin's documented call, `name(a, b, c=None, *, out)`."""
    doc = getattr(func, "__doc__", None)
    if not isinstance(doc, str):
        return ()
    match = re.match(rf"\s*{re.escape(name)}\((.*?)\)", doc[:600], re.DOTALL)
    if match is None:
        return ()
    names = []
    for part in match.group(1).split(","):
        found = _PARAMETER.match(part)
        if part.strip().startswith("*") or found is None:
            break       # `*`, `*args`: no more positional parameters
        names.append(found.group(2))
    return tuple(names)


__all__ = ["argument_name", "positional_names"]
