"""Testing helpers that are also user features: plant a fault to check a setup finds it."""
from .faults import inject_fault

__all__ = ["inject_fault"]
