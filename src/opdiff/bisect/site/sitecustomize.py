"""Imported by Python at start-up in every process `opdiff compile-bisect` starts (its directory
is first on PYTHONPATH): installs the probe when OPDIFF_BISECT_PROBE is set, then runs the
sitecustomize this one hides, if any."""
import os
import sys


def _probe() -> None:
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


_probe()
_chain()
