"""The comparison stage: two dumps in, one CompareResult out (it never imports report).

- `pair`: one step/rank pair (align, measure, judge, find the first divergence)
- `runs`: many pairs (pairing by step and rank, processes, merging)
- `align`, `metrics`, `verdicts`, `divergence`: the pieces `pair` uses
- `replay`: re-running target ops in float64 on their own saved tensors

Users call `opdiff.compare(...)` (see `opdiff.api`), which adds discovery and reports.
"""
