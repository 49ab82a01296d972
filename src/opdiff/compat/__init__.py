"""The APIs of the tools opdiff users come from, as thin layers over opdiff's own.

- `opdiff.compat.ptdbg_ascend`: ptdbg_ascend's hook style (`set_dump_path`, `register_hook`,
  `set_dump_switch`) and debugger style (`PrecisionDebugger(hook_name=...)`), `seed_all` and
  `compare(dump_result_param, out)`.
- `opdiff.compat.torch_npu_hooks`: torch_npu.hooks' `set_dump_path`, `register_acc_cmp_hook`,
  `seed_all` and `compare(pkl1, pkl2, csv)`.

A script written for either tool runs after one import line is changed; it records with
`opdiff.PrecisionDebugger`, writes the files the old tool wrote next to an opdiff dump, and
compares with `opdiff.compare`. Options that only mean something on Ascend (ACL dumps) are
accepted, and a warning says once what opdiff does instead.
"""
