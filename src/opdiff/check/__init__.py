"""`opdiff check`: one run, no golden; every op judged against a float64 replay on the CPU.

    from opdiff.check import check_dump
    result = check_dump("./dump/npu/step0/rank0", jobs=2)
    print(result.checked, result.failed, result.first_failure)

- `engine`: one record's check (`check_record`), the result types, `--list`/`--scope`
- `standards`: the accuracy standards per op class (bitwise, ULP, ratio against float64)
- `inputs`: made-up inputs for statistics dumps (checked on `--device`)
- `runner`: a whole dump, parallel workers, `--resume`
- `ray_tasks`: the same batches as Ray tasks (`--engine ray`)
- `device`: which `--device` strings are usable here
- `outputs`: the CSV, summary.json and report.html
"""
from __future__ import annotations

from .engine import NOT_CHECKED, CheckResult, OpCheck, check_record
from .runner import check_dump
from .standards import FAIL, PASS, OutputCheck

__all__ = ["check_dump", "check_record", "CheckResult", "OpCheck", "OutputCheck", "PASS", "FAIL",
           "NOT_CHECKED"]
