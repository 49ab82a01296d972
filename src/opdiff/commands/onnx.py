"""`opdiff onnx`: compare two ONNX models (or a PyTorch module and its export) node by node."""
from __future__ import annotations

import argparse

EXAMPLES = """examples:
  opdiff onnx target.onnx golden.onnx -i input_0.npy,input_1.bin -o ./out
  opdiff onnx --golden golden.onnx --target target.onnx -o ./out        # either order, by name
  opdiff onnx model.onnx model.onnx --golden-opt disable_all --target-opt all -o ./out
  opdiff onnx --torch my_module.py:build_model model.onnx -o ./out      # PyTorch vs its export

TARGET comes first, GOLDEN second, as in `opdiff compare` and `opdiff trend`. (Before opdiff
0.2 this command took GOLDEN first: name the models with --golden and --target to be sure.)

Verdicts use msit's thresholds (CosineSimilarity > 0.99, RelativeEuclideanDistance < 0.05,
KullbackLeiblerDivergence < 0.005, RootMeanSquareError < 1.0, MeanRelativeError < 1.0); any
inf/NaN the golden does not have is an error. The metrics are the ones `opdiff compare` shows.
OUT gets result_{timestamp}.csv (msit's columns), summary.json, report.html, rows.jsonl (every
row, so summary.json loads back), onnx_details.json and both dumps (onnx_dump_{timestamp}/);
what an earlier opdiff run wrote into OUT is removed first, other files there are left alone.
"""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "onnx", help="compare ONNX models node by node, or a PyTorch module against its export",
        description="Run a golden and a target model on the same inputs, dump every intermediate "
                    "tensor, pair them across converter renames and name the first failing node.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="TARGET.onnx GOLDEN.onnx (the order of `opdiff compare`), or just "
                        "TARGET.onnx with --torch")
    p.add_argument("--target", "-om", dest="target_model", metavar="TARGET.onnx", default=None,
                   help="the model under suspicion, by name (any position; -om as in msit compare)")
    p.add_argument("--golden", "-gm", dest="golden_model", metavar="GOLDEN.onnx", default=None,
                   help="the trusted model, by name (any position; -gm as in msit compare)")
    p.add_argument("--torch", metavar="FILE.py:FUNCTION",
                   help="golden is a PyTorch module: FUNCTION() returns it, or (module, example_inputs)")
    p.add_argument("-i", "--input", dest="inputs", metavar="FILES",
                   help="comma-separated .npy/.npz/.bin, one per model input (default: random, seeded)")
    p.add_argument("-is", "--input-shape", metavar="SHAPES",
                   help="dynamic dimensions, e.g. 'input:1,3,224,224;mask:1,128'")
    p.add_argument("-o", "--output", default="./opdiff_out", metavar="OUT",
                   help="directory for the CSV, summary.json, report.html and both models' "
                        "dumps (default ./opdiff_out: unlike compare, this command always "
                        "writes, since its dumps are made here)")
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    for side in ("golden", "target"):
        p.add_argument(f"--{side}-opt", default="all",
                       choices=("disable_all", "basic", "extended", "all"),
                       help=f"ONNX Runtime graph optimisation level for the {side} (default all)")
        p.add_argument(f"--{side}-ep", default="CPU", metavar="PROVIDERS",
                       help=f"execution providers for the {side}, comma-separated (default CPU)")
    p.add_argument("--no-tensors", action="store_true",
                   help="keep only statistics in the dumps (the compare itself still uses every value)")
    p.add_argument("--fail-on-divergence", action="store_true",
                   help="exit 1 when a failing node is found (for CI)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..onnx.deps import OnnxError, require
    from ..onnx.inputs import parse_input_shapes
    from ..onnx.runner import RuntimeOptions

    require()

    def options(side: str) -> RuntimeOptions:
        providers = tuple(p.strip() for p in getattr(args, f"{side}_ep").split(",") if p.strip())
        return RuntimeOptions(providers=providers or ("CPU",), optimization=getattr(args, f"{side}_opt"))

    shapes = parse_input_shapes(args.input_shape)
    common = dict(inputs=args.inputs, output_path=args.output, input_shapes=shapes, seed=args.seed,
                  save_tensors=not args.no_tensors)
    target, golden = _models(args, OnnxError)
    if args.torch:
        from ..onnx.torch_side import compare_torch

        cmp = compare_torch(args.torch, target, target_options=options("target"), **common)
    else:
        from ..onnx.model_compare import compare_models

        cmp = compare_models(golden, target, golden_options=options("golden"),
                             target_options=options("target"), **common)
    _print(cmp)
    return 1 if args.fail_on_divergence and cmp.first_divergence is not None else 0


def _models(args, error) -> tuple:
    """(target, golden) from the positionals (TARGET first) and --target/--golden."""
    rest = list(args.models)
    target = args.target_model or (rest.pop(0) if rest else None)
    if args.torch:
        if args.golden_model or rest or target is None:
            raise error("with --torch give exactly one ONNX model (the export to check)")
        return target, None
    golden = args.golden_model or (rest.pop(0) if rest else None)
    if rest or target is None or golden is None:
        raise error("give two models, TARGET.onnx GOLDEN.onnx (or --target T.onnx --golden "
                    "G.onnx, or --torch FILE.py:FUNCTION MODEL.onnx)")
    return target, golden


def _print(cmp) -> None:
    """Console report: the shared printer (verdict, notes, worst rows), then ONNX-only file paths."""
    from ..report.console import print_result, stdout_console

    console = stdout_console()          # piped output is not wrapped at 80 columns
    print_result(cmp.result, console)
    if "details" in cmp.files:
        console.print(f"also wrote {cmp.files['details']} (observer check, input handling, unmatched "
                      f"tensors and why)", highlight=False, style="dim")
    console.print(f"compare took {cmp.seconds.get('total', 0):.2f} s", highlight=False, style="dim")
