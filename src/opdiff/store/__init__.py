"""The dump format: a writer used by capture, a reader used by everything else."""
from .reader import Dump, find_dumps, open_dump
from .records import decode_float, decoded_stats, iter_descriptors, iter_tensors
from .writer import DumpWriter

__all__ = ["Dump", "DumpWriter", "open_dump", "find_dumps", "iter_tensors", "iter_descriptors",
           "decoded_stats", "decode_float"]
