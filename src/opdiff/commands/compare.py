"""`opdiff compare TARGET GOLDEN [-o OUT]`: line up two dumps op by op and name the culprit."""
from __future__ import annotations

import argparse

EXAMPLE = """example:
  opdiff compare ./dump/npu ./dump/cpu -o ./out
  opdiff compare ./dump/npu ./dump/gpu -o ./out --map pairs.yaml   # renames, fused qkv, ignored ops
  opdiff compare ./dump/npu ./dump/gpu -o ./out --engine ray --ray-address auto
  opdiff compare ./dump/npu ./dump/gpu -o ./out --engine ray --shard-mb 256   # big tensor dumps
  opdiff compare ./dump/bf16/step0/rank0 ./dump/fp32/step0/rank0 --threshold bf16=0.02 \\
      --fail-on-divergence

TARGET is the run under suspicion (NPU, bf16, compiled...), GOLDEN the trusted one (CPU, fp32).
Each is a step/rank directory or a dump root (every step/rank pair is then compared), written by
opdiff, msprobe or ptdbg_ascend. OUT receives compare_result_{timestamp}.csv, summary.json,
report.html and rows.jsonl (every row, so summary.json loads back); what an earlier opdiff run
wrote into OUT is removed first, other files there are left alone. Exit codes: 0 done (a
divergence is a finding), 1 with --fail-on-divergence when one is found, 2 bad input."""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "compare", help="compare two dumps and find the first diverging op",
        description="Line up two dumps op by op, score every tensor, and name the first op whose "
                    "inputs agree with golden but whose outputs do not.",
        epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="TARGET", help="dump of the run under suspicion")
    p.add_argument("golden", metavar="GOLDEN", help="dump of the trusted run")
    p.add_argument("-o", "--output", metavar="OUT", default=None,
                   help="directory for the CSV, summary.json and report.html (default: none "
                        "written, terminal summary only)")
    p.add_argument("--shape-flag", action="store_true",
                   help="pair ops only when all their tensor shapes are equal")
    p.add_argument("--map", metavar="FILE", default=None, dest="mapping",
                   help="mapping file (YAML: 'modules:' renames target: golden, 'concat:' one "
                        "fused output against several golden outputs joined along a dim, "
                        "'ignore:' ops to drop, 'ops:' op calls or tensors paired as named; "
                        "msprobe's data_mapping.yaml / cell_mapping.yaml too)")
    p.add_argument("--layout", metavar="FILE", default=None,
                   help="the target's layout file, for ranks that split modules by hand with "
                        "plain tensors (Megatron-style): one line a module, 'column 0' or "
                        "'row 2 dim=1 ranks=0,1'")
    p.add_argument("--golden-layout", metavar="FILE", default=None,
                   help="the golden's layout file (as --layout)")
    p.add_argument("--token-ids", metavar="FILE", default=None,
                   help='JSON file of each side\'s input ids, for dumps that did not save them '
                        '(statistics dumps): {"target": [[ids], ...], "golden": [[ids]], '
                        '"target_mask": [[1, 0, ...]]} (masks optional)')
    p.add_argument("--thresholds", metavar="FILE", default=None,
                   help='JSON file of thresholds, e.g. {"tolerance": {"bf16": 0.02}, '
                        '"amplification": 10}')
    p.add_argument("--threshold", metavar="KEY=VALUE", action="append", default=[],
                   help="override one threshold: a dtype's tolerance (bf16=0.02), amplification, "
                        "agree_fraction or scale_min_numel; repeatable")
    p.add_argument("--noise", metavar="NOISE", default=None,
                   help="a noise floor from 'opdiff calibrate': judge each tensor it measured "
                        "against max(dtype floor, k x its floor) (k: --threshold "
                        "noise_multiple=K, default 3) and say each error as a multiple of it")
    p.add_argument("--replay", choices=("auto", "all", "off"), default="auto",
                   help="re-run target ops in float64 on their own saved tensors to tell an op's "
                        "own error from inherited error (tensor dumps): auto = the suspects and "
                        "the backward ops before them (default), all = every op, off = none")
    p.add_argument("--jobs", "-j", "--replay-jobs", metavar="N", default=None, dest="replay_jobs",
                   help="processes each pair's replay uses (default: OPDIFF_REPLAY_JOBS, else 1; "
                        "pays off when many ops are replayed and cores are idle; --replay-jobs "
                        "is the older spelling)")
    p.add_argument("--fail-on-divergence", action="store_true",
                   help="exit 1 when a first divergence is found (for CI)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="where step/rank pairs are compared: local = a process pool on this "
                        "machine (default), ray = Ray tasks (pip install opdiff[ray])")
    p.add_argument("--ray-address", metavar="ADDR", default=None,
                   help="the Ray cluster for --engine ray (auto, host:6379; default: a local one)")
    p.add_argument("--ray-pin", metavar="PATH=RESOURCE", action="append", default=[],
                   help="run the pairs whose target dump lies under PATH on the Ray node offering "
                        "the custom resource RESOURCE (node-local dumps); repeatable")
    p.add_argument("--shard-mb", metavar="MB", default=None,
                   help="with --engine ray: measure a step/rank pair whose saved tensors exceed "
                        "MB MiB in shards of about MB MiB, each its own Ray task (default: one "
                        "task per pair)")
    p.add_argument("--source-root", metavar="DIR", default=None,
                   help="show the source lines around the culprit's line from the run's .py "
                        "files under DIR, none hidden or in .git (default: the lines the dump "
                        "holds, which opdiff's capture stores; opdiff never reads a file just "
                        "because a dump names it)")
    p.add_argument("--max-tensor-mb", metavar="MB", default=None,
                   help="the largest tensor opdiff makes from what a dump claims (a "
                        "reference repeating its bytes, a statistics record's shape, a "
                        "replayed op's result), in MiB (default: OPDIFF_MAX_TENSOR_MB, "
                        "else 4096); a larger one is compared by its statistics or not "
                        "replayed, with a one-line reason")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar (default: when stderr is a terminal)")
    p.set_defaults(run=run)


def _overrides(pairs: list[str]) -> dict:
    from ..errors import ConfigError

    out = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ConfigError(f"--threshold expects KEY=VALUE (e.g. bf16=0.02), got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _pins(items: list[str]) -> dict:
    from ..errors import ConfigError

    out = {}
    for item in items:
        path, sep, resource = item.rpartition("=")
        if not sep or not path or not resource:
            raise ConfigError(f"--ray-pin expects PATH=RESOURCE (e.g. /mnt/a=dumpA), got {item!r}")
        out[path] = resource
    return out


def _jobs(text):
    from ..errors import ConfigError

    if text is None:
        return None
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise ConfigError(f"--jobs expects a number of processes (1 or more), got {text!r}")
    return jobs


def _shard_mb(text):
    from ..errors import ConfigError

    if text is None:
        return None
    try:
        mb = float(text)
    except ValueError:
        mb = 0.0
    if not mb > 0 or mb == float("inf"):
        raise ConfigError(f"--shard-mb expects a size in MiB (more than 0), got {text!r}")
    return mb


def _engine(args):
    """The engine the flags name: --ray-address, --ray-pin and --shard-mb only with --engine ray."""
    from ..comparison.engines import LocalEngine, RayEngine
    from ..errors import ConfigError

    ray_flags = [flag for flag, given in (("--ray-address", args.ray_address is not None),
                                          ("--ray-pin", bool(args.ray_pin)),
                                          ("--shard-mb", args.shard_mb is not None)) if given]
    if args.engine != "ray":
        if ray_flags:
            raise ConfigError(f"{' and '.join(ray_flags)} {'is' if len(ray_flags) == 1 else 'are'} "
                              f"for --engine ray (the local engine compares each pair in one "
                              f"process on this machine)")
        return LocalEngine()
    return RayEngine(address=args.ray_address, pins=_pins(args.ray_pin),
                     shard_mb=_shard_mb(args.shard_mb))


def run(args) -> int:
    from .paths import dumps_exist, noise_exists, output_is_a_directory

    dumps_exist(args.target, args.golden)       # before torch is imported (seconds)
    noise_exists(args.noise)
    output_is_a_directory(args.output)          # before the compare, not after it
    from ..api import compare
    from ..comparison.verdicts import Thresholds
    from ..report.console import print_result

    from ..store.limits import set_max_tensor_mb

    set_max_tensor_mb(args.max_tensor_mb)     # in the environment: workers see it too
    thresholds = Thresholds.load(args.thresholds, _overrides(args.threshold))
    result = compare(args.target, args.golden, args.output, thresholds=thresholds,
                     shape_flag=args.shape_flag,
                     fail_on="divergence" if args.fail_on_divergence else None,
                     progress=args.progress, replay=args.replay,
                     engine=_engine(args), replay_jobs=_jobs(args.replay_jobs),
                     source_root=args.source_root, mapping=args.mapping, noise=args.noise,
                     token_ids=args.token_ids, layout=args.layout,
                     golden_layout=args.golden_layout)
    print_result(result)
    return 1 if result.failed else 0
