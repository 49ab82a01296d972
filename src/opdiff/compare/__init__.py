"""Compare two dumps: alignment, metrics, verdicts, first divergence (see `engine`).

`opdiff.compare` is both this package and the function `opdiff.compare(target, golden, ...)`:
calling the package runs `opdiff.compare.engine.compare`.
"""
import sys
import types


class _CallableModule(types.ModuleType):
    # `import opdiff.compare.engine` binds the package to `opdiff.compare`, replacing the lazy
    # function attribute: make the package itself callable so `opdiff.compare(...)` still works.
    def __call__(self, *args, **kwargs):
        from .engine import compare

        return compare(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
