"""opdiff: find the first operator where two runs of a neural network part ways.

    import opdiff
    opdiff.seed_all(1234)
    with opdiff.dump(model, "./dump/cpu", level="mix"):
        loss = model(x).sum(); loss.backward()
    result = opdiff.compare("./dump/npu", "./dump/cpu", output_path="./out")
    print(result.first_divergence)
"""
__version__ = "0.1.0"

from .errors import ConfigError, DumpError, OpdiffError, OverflowDetected

__all__ = ["__version__", "OpdiffError", "ConfigError", "DumpError", "OverflowDetected"]


def __getattr__(name):
    # Heavy pieces (torch-importing capture, compare) load on first use, so `opdiff --help` is fast.
    if name in ("PrecisionDebugger", "dump", "compare"):
        from . import api
        return getattr(api, name)
    if name == "Monitor":
        from .monitor.monitor import Monitor
        return Monitor
    if name == "testing":      # `opdiff.testing.inject_fault(...)` after a bare `import opdiff`
        import importlib
        return importlib.import_module(".testing", __name__)
    if name == "compile_bisect":
        from .bisect import compile_bisect
        return compile_bisect
    if name == "seed_all":
        from .seeding import seed_all
        return seed_all
    raise AttributeError(f"module 'opdiff' has no attribute {name!r}")
