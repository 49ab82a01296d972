"""The comparison stage: two dumps in, one CompareResult out (it never imports report).

- `pair`: one step/rank pair (align, measure, judge, find the first divergence)
- `runs`: many pairs (pairing by step and rank, processes, merging)
- `align`: which target op meets which golden op
- `metric_table` (the metric specification, torch-free), `metrics` (torch) and `metrics_numpy`
  (numpy): how far a tensor is from its golden
- `verdicts`: thresholds, one row per dtype, and the verdict of one tensor
- `blame` (the rules: which op is to blame) and `reasons` (the same in English)
- `rejudge`: a result judged again with other thresholds, from the metrics its rows carry
- `replay`: re-running target ops in float64 on their own saved tensors

Users call `opdiff.compare(...)` (see `opdiff.api`), which adds discovery and reports.
"""
from .rejudge import rejudge

__all__ = ["rejudge"]
