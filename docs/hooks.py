"""MkDocs hook: the reference pages, generated from the code at every build so they cannot drift.

- reference/cli.md          every `opdiff` command from its argparse parser (opdiff.cli.build_parser)
- reference/environment.md  every OPDIFF_* variable the source reads (a literal "OPDIFF_..." in src/)
- reference/thresholds.md   every key `--thresholds` takes, with its default (Thresholds, DTYPE_THRESHOLDS)
- reference/exit-codes.md   the codes of every command, and each command's --fail-on-* options
- reference/dump-format.md  the layout, every record field (store/schema.py's Record, with its comments)
- reference/outputs.md      every JSON document opdiff writes, from its schema (opdiff/schemas/)

The functions are plain (text in, text out) so that tests/docs/ can call them too.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
if str(SRC) not in sys.path:            # document this checkout, whatever opdiff is installed
    sys.path.insert(0, str(SRC))

# What each environment variable does. A variable the source reads that is missing here still gets
# a row (with where it is read); tests/docs/test_reference.py fails until it is described.
ENVIRONMENT = {
    "OPDIFF_REPLAY_JOBS": "processes each step/rank pair's replay uses in `opdiff compare` (default 1; "
                          "`--replay-jobs` wins). Worth it when many ops are replayed and cores are idle.",
    "OPDIFF_REPLAY_THREADS": "threads the compare's replay uses: 1 keeps one thread, 2 always replays on a "
                             "second thread while the first measures (default: 2 when a core is idle as the "
                             "compare starts).",
    "OPDIFF_COMPARE_THREADS": "threads that measure each tensor pair's metrics (default 1; 2 lets a helper "
                              "thread take chunks too).",
    "OPDIFF_SPOOL_DIR": "where a many-pair compare keeps each pair's rows on disk while it runs (default: "
                        "the system's temporary directory); removed with the result.",
    "OPDIFF_MAX_TENSOR_MB": "the largest tensor, in megabytes, opdiff makes from what a dump claims "
                            "(`--max-tensor-mb` sets it for worker processes too); a larger one is not made: "
                            "the compare falls back to statistics, replay and check report the op as not "
                            "replayed / not checked.",
    "OPDIFF_LIGHTNING": "a dump directory: with opdiff installed, every Lightning `Trainer` gets opdiff's "
                        "callback through the `lightning.pytorch.callbacks_factory` entry point "
                        "(`OPDIFF_LIGHTNING_STEPS`, `_TASK`, `_LEVEL` optional; see the how-to page "
                        "*No code changes*).",
    "OPDIFF_BISECT_PROBE": "set by `opdiff compile-bisect` for each run of the command: where to write the "
                           "gradients of the optimizer step it judges (`{\"out\": ..., \"step\": N}`); "
                           "the run ends there.",
    "OPDIFF_RUN_CONFIG": "set by `opdiff run` for every process it launches: the capture settings as one "
                         "JSON object (read by the start-up hook; not meant to be set by hand).",
    "OPDIFF_TRITON_KERNELS": "1 records Inductor's Triton kernels (GPU) at `L2` and `mix`, through its "
                             "launcher (`capture/kernel_triton.py`). Experimental: not yet run on a GPU; "
                             "without it a compiled CUDA step's compare says they are not recorded.",
    "OPDIFF_REQUIRE_BROWSER": "tests only: 1 makes the HTML report's browser tests fail instead of skipping "
                              "when chromium is missing (CI sets it).",
}

THRESHOLD_KEYS = {
    "tolerance": "per dtype: relative L2 error beyond which a tensor is not a pass (a bare dtype key, "
                 "`{\"bf16\": 0.02}`, sets this one)",
    "agree_fraction": "a tensor passes below this fraction of its tolerance; between it and the tolerance "
                      "it is a warning",
    "amplification": "an op's output error must exceed its inputs' error by this factor to be its own "
                     "(local) error",
    "scale_tolerance": "per dtype: a systematic (scale) error beyond this is a finding",
    "scale_min_numel": "outputs with fewer elements are not judged by the scale rule",
    "scale_amplification": "an output's scale error must exceed this multiple of its inputs' scale error",
    "scale_noise_fraction": "the least share of the inputs' random error a scale error must exceed "
                            "(f(n) = min(1, max(this, 4/sqrt(n))))",
    "statistics_tolerance": "per dtype: statistics-only dumps blame an op only above this error (random rule)",
    "statistics_scale_tolerance": "per dtype: the same floor for the scale rule",
    "statistics_backward_tolerance": "per dtype: the floor for backward records in statistics-only dumps",
    "statistics_small_numel": "outputs of fewer elements get floors grown by this / n",
    "noise_multiple": "with `opdiff compare --noise`: a measured tensor is judged against "
                      "max(dtype floor, this x its measured noise floor)",
}


def _columns(width: int = 100):
    @contextlib.contextmanager
    def fixed():
        old = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = str(width)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("COLUMNS", None)
            else:
                os.environ["COLUMNS"] = old
    return fixed()


def subcommands():
    """{name: its argparse parser} of every `opdiff` command, in the order `opdiff --help` lists them."""
    import argparse

    from opdiff.cli import build_parser

    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return parser, dict(action.choices)
    return parser, {}


def cli_page() -> str:
    import argparse

    parser, commands = subcommands()
    helps = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
    out = ["# Command line", "",
           "Generated from the argparse parsers of `opdiff.cli` when this site is built: every "
           "command and option here exists. `python -m opdiff` is the same program as `opdiff`.", ""]
    with _columns():
        out += ["## opdiff", "", "```text", parser.format_help().rstrip(), "```", ""]
        for name, sub in commands.items():
            out += [f"## opdiff {name}", "", helps.get(name) or "", "", "```text",
                    sub.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def environment_variables() -> dict[str, list[str]]:
    """{OPDIFF_NAME: ["path:line", ...]} of every literal "OPDIFF_..." string in src/."""
    found: dict[str, list[str]] = {}
    for path in sorted((SRC / "opdiff").rglob("*.py")):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in re.findall(r"[\"'](OPDIFF_[A-Z0-9_]+)[\"']", line):
                found.setdefault(name, []).append(f"{path.relative_to(SRC)}:{i}")
    return found


def environment_page() -> str:
    found = environment_variables()
    out = ["# Environment variables", "",
           "Every `OPDIFF_*` variable opdiff reads (found in the source when this site is built).", "",
           "| variable | what it does |", "| --- | --- |"]
    for name in sorted(set(found) | {"OPDIFF_REQUIRE_BROWSER"}):
        what = ENVIRONMENT.get(name) or f"(not described yet; read at {', '.join(found[name])})"
        out.append(f"| `{name}` | {what} |")
    out += ["", "opdiff also sets, for determinism, the variables `opdiff.seed_all` documents "
            "(`PYTHONHASHSEED`, `CUBLAS_WORKSPACE_CONFIG`, `NCCL_DETERMINISTIC`, `HCCL_DETERMINISTIC`); "
            "`opdiff env` shows them.", ""]
    return "\n".join(out)


def thresholds_page() -> str:
    from opdiff.comparison.verdicts import DTYPE_COLUMNS, DTYPE_THRESHOLDS, Thresholds

    defaults = Thresholds()
    out = ["# Thresholds", "",
           "The numbers behind every verdict (`opdiff.comparison.verdicts.Thresholds`). Change them "
           "with `opdiff compare --thresholds FILE` (a JSON object of the keys below) or "
           "`--threshold KEY=VALUE`, or from Python `opdiff.compare(..., thresholds={...})`. "
           "Why the defaults are what they are: [how verdicts are made](../explanation/verdicts.md).", "",
           "```json", '{"tolerance": {"bf16": 0.02}, "amplification": 5}', "```", "",
           "Dtype keys accept the spellings users write: `bf16`, `bfloat16`, `fp16`, `half`, `fp32`, ...", "",
           "## Keys", "", "| key | default | meaning |", "| --- | --- | --- |"]
    for key in Thresholds._KEYS:
        value = getattr(defaults, key)
        shown = "per dtype (table below)" if isinstance(value, dict) else f"`{value}`"
        out.append(f"| `{key}` | {shown} | {THRESHOLD_KEYS.get(key, '')} |")
    out += ["", "## Per-dtype defaults", "", "| dtype | " + " | ".join(f"`{c}`" for c in DTYPE_COLUMNS) + " |",
            "| --- |" + " --- |" * len(DTYPE_COLUMNS)]
    for dtype, row in DTYPE_THRESHOLDS.items():
        out.append(f"| {dtype} | " + " | ".join(f"{v:g}" for v in row) + " |")
    out += ["", "A dtype without a row is judged like float32. `opdiff onnx` uses msit's thresholds "
            "instead (`opdiff.onnx.policy.MsitThresholds`).", ""]
    return "\n".join(out)


def exit_codes_page() -> str:
    _, commands = subcommands()
    out = ["# Exit codes", "",
           "Every command (from `opdiff.cli.main`):", "",
           "| code | meaning |", "| --- | --- |",
           "| 0 | done. A divergence, a failing op or an overflow is a finding, not a failure. |",
           "| 1 | a `--fail-on-*` option below held, or an internal error (a bug: rerun with `-v` for the "
           "traceback and report it) |",
           "| 2 | bad input: a one-line message says what to do (also for unknown options) |",
           "| 130 | interrupted (Ctrl-C) |", "",
           "## Options that turn a finding into exit 1", "", "| command | option | when |", "| --- | --- | --- |"]
    for name, sub in commands.items():
        for action in sub._actions:
            for flag in action.option_strings:
                if flag.startswith("--fail-on"):
                    out.append(f"| `opdiff {name}` | `{flag}` | {action.help or ''} |")
    out.append("")
    return "\n".join(out)


def record_fields() -> list[tuple[str, str, str]]:
    """(field, type, comment) of store/schema.py's Record TypedDict, in source order."""
    from opdiff.store import record_schema
    return record_schema.fields(record_schema.ROOT)


def _field_table(rows: list[tuple[str, str, str]]) -> list[str]:
    out = ["| field | type | meaning |", "| --- | --- | --- |"]
    for name, kind, comment in rows:
        comment = comment.replace("|", "\\|")     # a pipe would end the table cell
        out.append(f"| `{name}` | `{kind}` | {comment} |")
    return out


def dump_format_page() -> str:
    from opdiff.store import layout

    out = ["# Dump format v1", "",
           f"The format opdiff writes (`FORMAT_VERSION = {layout.FORMAT_VERSION}` in `opdiff.store.layout`). "
           "The reader also opens msprobe, ptdbg_ascend and torch_npu.hooks dumps. Generated from "
           "`opdiff.store.layout`, `opdiff.store.schema` and `opdiff.store.records` when this site is built.", "",
           "## Layout", "", "::: opdiff.store.layout", "    options:", "      show_root_heading: false",
           "      show_root_toc_entry: false", "      members: false", "",
           "## records.jsonl: one record per line", "",
           "`name`, `op`, `kind` and `phase` are required in records.jsonl. A field whose meaning names a "
           "default may be left out (and `inputs`, `outputs`, `kwargs`, `parameters` may be null): every "
           "reader, of opdiff's dumps and of the other tools', fills it in with that default as the dump is "
           "read (`opdiff.store.schema.complete`). The fields after `stack` are present only where they apply.",
           ""] + _field_table(record_fields())
    from opdiff.store import record_schema
    for cls in record_schema.types()[1:]:     # the types the fields above name
        out += ["", f"### {cls.__name__}", "", " ".join((cls.__doc__ or "").split()), ""]
        out += _field_table(record_schema.fields(cls))
    out += ["", "Schema of a line: [`dump-record.schema.json`](outputs.md#dump-record), generated from "
            "these types (`opdiff.store.record_schema`).", "",
            "## Record names", "", "::: opdiff.store.schema", "    options:", "      show_root_heading: false",
            "      show_root_toc_entry: false", "      members: false", "",
            "## Descriptors: one per argument", "", "::: opdiff.store.records", "    options:",
            "      show_root_heading: false", "      show_root_toc_entry: false", "      members: false", "",
            "## meta.json", "", "See [`dump-meta.schema.json`](outputs.md#dump-meta).", ""]
    return "\n".join(out)


def _type_of(prop: dict) -> str:
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1]
    if "const" in prop:
        return json.dumps(prop["const"])
    if "enum" in prop:
        return " \\| ".join(json.dumps(v) for v in prop["enum"])
    if "anyOf" in prop or "oneOf" in prop:
        return " or ".join(_type_of(p) for p in prop.get("anyOf") or prop.get("oneOf"))
    t = prop.get("type", "any")
    return " or ".join(t) if isinstance(t, list) else t


def _rows(props: dict, required: list, prefix: str = "", depth: int = 0) -> list[str]:
    rows = []
    for name, prop in props.items():
        need = "yes" if name in required else ""
        desc = (prop.get("description") or "").replace("|", "\\|")
        rows.append(f"| `{prefix}{name}` | {_type_of(prop)} | {need} | {desc} |")
        if depth < 1 and isinstance(prop.get("properties"), dict):
            rows += _rows(prop["properties"], prop.get("required", []), f"{prefix}{name}.", depth + 1)
        items = prop.get("items")
        if depth < 1 and isinstance(items, dict) and isinstance(items.get("properties"), dict):
            rows += _rows(items["properties"], items.get("required", []), f"{prefix}{name}[].", depth + 1)
    return rows


def outputs_page() -> str:
    from opdiff import schemas
    from opdiff.store.records import SCHEMA_VERSION

    out = ["# JSON outputs and their schemas", "",
           "Every JSON document opdiff writes has a JSON Schema in the package (`opdiff/schemas/`, "
           "draft 2020-12); the tables below are generated from those files, and the test suite "
           "validates real outputs of every command against them. Each document carries "
           f"`schema_version` (now {SCHEMA_VERSION}); a change to an output is a change to its schema "
           "and a line in the changelog. Fields may be added without a new version: readers must "
           "ignore fields they do not know.", "",
           "Non-finite numbers are the strings `\"NaN\"`, `\"Infinity\"`, `\"-Infinity\"` everywhere "
           "(strict JSON). Files from before this rule (the monitor's and trend's JSON spelled them "
           "`\"nan\"`, `\"inf\"`) are still read.", "",
           "```python", "from opdiff import schemas", "schemas.validate(\"compare-summary\", document)"
           "   # needs `pip install jsonschema`", "```", ""]
    for name, (file, writer) in schemas.DOCUMENTS.items():
        s = schemas.load(name)
        out += [f"## {name}", "", f"**{s['title']}**: `{file}`, written by {writer}.", "",
                s.get("description", ""), "", "| field | type | required | meaning |", "| --- | --- | --- | --- |"]
        out += _rows(s.get("properties", {}), s.get("required", []))
        out += ["", f"Schema file: `opdiff/schemas/{name}.schema.json`.", ""]
    return "\n".join(out)


PAGES = {
    "reference/cli.md": cli_page,
    "reference/environment.md": environment_page,
    "reference/thresholds.md": thresholds_page,
    "reference/exit-codes.md": exit_codes_page,
    "reference/dump-format.md": dump_format_page,
    "reference/outputs.md": outputs_page,
}


def on_files(files, config):
    from mkdocs.structure.files import File

    for path, make in PAGES.items():
        files.append(File.generated(config, path, content=make()))
    return files
