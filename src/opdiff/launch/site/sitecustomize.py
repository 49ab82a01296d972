"""Imported by Python at start-up in every process `opdiff run` or `opdiff compile-bisect`
launches (its directory is first on PYTHONPATH): installs opdiff's hooks when OPDIFF_RUN_CONFIG
is set, compile-bisect's probe when OPDIFF_BISECT_PROBE is, then runs the sitecustomize this
one hides, if any. Never raises: a broken start-up must not stop the user's run."""
import os
import sys


def _opdiff_start() -> None:
    if os.environ.get("OPDIFF_RUN_CONFIG"):
        try:
            from opdiff.launch import bootstrap
            bootstrap.install()
        except Exception as exc:  # noqa: BLE001 - the user's program runs on regardless
            sys.stderr.write(f"opdiff run: could not install its hooks in this process "
                             f"({type(exc).__name__}: {exc}); the program runs without capture\n")


def _bisect_probe() -> None:
    if os.environ.get("OPDIFF_BISECT_PROBE"):
        try:
            from opdiff.bisect import probe
            probe.install()
        except Exception as exc:  # noqa: BLE001 - reported: the run then writes no result
            sys.stderr.write(f"opdiff compile-bisect: could not install its probe "
                             f"({type(exc).__name__}: {exc})\n")


def _chain() -> None:
    """Run the next sitecustomize on sys.path (the one this file shadows)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_opdiff_start()
_bisect_probe()
try:
    _chain()
except Exception as exc:  # noqa: BLE001 - as Python itself does with a failing sitecustomize
    sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")
