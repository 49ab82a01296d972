"""Where a difference comes from is decided in one place: every `Origin` has one rule in
`origins.RULES`, tried in the order of `Origin.ALL` (and of the module docstring's table), and
summary.json's schema allows exactly those values."""
import re

import pytest

from opdiff import schemas
from opdiff.comparison import origins
from opdiff.comparison.blame import OpScore
from opdiff.comparison.regions import REGION
from opdiff.comparison.result import NUMBER, Origin, TensorRow
from opdiff.store.schema import Kind


def test_every_origin_has_one_rule_in_the_documented_order():
    assert [r.origin for r in origins.RULES] == list(Origin.ALL)
    assert len(set(Origin.ALL)) == len(Origin.ALL)
    assert all(v == getattr(Origin, k) for k, v in vars(Origin).items()
               if k.isupper() and isinstance(v, str))
    named = {v for k, v in vars(Origin).items() if k.isupper() and isinstance(v, str)}
    assert named == set(Origin.ALL), "an Origin constant missing from Origin.ALL"


def test_pair_rules_come_first_and_the_last_always_holds():
    pair, across = origins.pair_rules(), [r for r in origins.RULES if r.holds is None]
    assert list(origins.RULES) == list(pair) + across
    assert pair[-1].origin == Origin.OP and pair[-1].holds(op("Torch.add"))
    assert all(r.make is not None and r.across is None for r in pair)
    assert [r.origin for r in across] == [Origin.COLLECTIVE, Origin.OPTIMIZER]
    assert all(callable(r.across) for r in across)
    assert all(r.heading for r in origins.RULES)


def test_the_docstring_table_lists_the_origins_in_order():
    listed = re.findall(r'^    "(\w+)" ', origins.__doc__, re.M)
    assert listed == list(Origin.ALL)


def test_the_user_docs_give_the_same_order():
    from pathlib import Path
    text = " ".join((Path(__file__).parents[2] / "docs" / "explanation" / "origins.md")
                    .read_text(encoding="utf-8").split())
    said = re.search(r"takes the first of (.*?) that applies to it; (.*?) are decided", text)
    assert said, "docs/explanation/origins.md says in which order origins are tried"
    order = re.findall(r"`(\w+)`", said.group(1)) + re.findall(r"`(\w+)`", said.group(2))
    assert order == list(Origin.ALL)


def test_the_schema_allows_exactly_the_origins():
    found = []

    def walk(node):
        if isinstance(node, dict):
            props = node.get("properties", {})
            if isinstance(props, dict) and "origin" in props:
                found.append(props["origin"].get("enum"))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(schemas.load("compare-summary"))
    assert len(found) == 2          # the first divergence, and each pair's
    assert all(enum == list(Origin.ALL) for enum in found)


def op(name, **kw):
    return OpScore(name=f"{name}.0.forward", op=name, phase="forward", seq=0,
                   kind=kw.pop("kind", Kind.API), module=None, forward=None, location=None,
                   local=True, **kw)


def row(name):
    return TensorRow(target_name=name, golden_name=name, op_name=name.rsplit(".", 2)[0],
                     role="input", phase="forward", kind=Kind.API, index=0,
                     metrics={"MaxAbsErr": 1.0}, error=1.0)


@pytest.mark.parametrize("case, expected", [
    (dict(kind=Kind.LEAF, leaf="parameter", fqn="w", reader="Torch.add.0.forward"), Origin.PARAMETER),
    (dict(kind=Kind.LEAF, leaf=None, fqn="w", reader="Torch.add.0.forward"), Origin.PARAMETER),
    (dict(kind=Kind.LEAF, leaf="buffer", fqn="b", reader="Torch.add.0.forward"), Origin.BUFFER),
    (dict(kind=Kind.LEAF, leaf="input", fqn="0", reader="Torch.add.0.forward"), Origin.INPUT),
    (dict(blame=Origin.OUTSIDE, worst_in=0), Origin.OUTSIDE),
    (dict(rng=("cpu:1", "cpu:2"), blame="local", worst_out=0), Origin.RANDOM),
    (dict(arg_diffs=["input.1: 2 vs 1"], blame="local", worst_out=0), Origin.NUMBER),
    (dict(blame="local", worst_out=0), Origin.OP),
])
def test_the_first_rule_that_holds_makes_the_divergence(case, expected):
    first = op("Torch.add", **case)
    fd = origins.divergence(first, [row("Torch.add.0.forward.input.0")], [first])
    assert fd.origin == expected
    if expected == Origin.NUMBER:
        assert fd.kind == NUMBER


def test_a_region_is_decided_before_random_and_number():
    region = op("Region", kind=REGION, rng=("cpu:1", "cpu:2"), arg_diffs=["x"])
    assert next(r for r in origins.pair_rules() if r.holds(region)).origin == Origin.REGION


_READ_ORIGIN = re.compile(r"""["']origin["']\s*(?:,\s*None\s*)?\)\s*(?:[!=]=|(?:not\s+)?in\b)""")


def origin_literals(path):
    """Lines of Python code that name an origin and spell one of its values as a string."""
    import io
    import tokenize
    names, strings = {}, {}
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if tok.type == tokenize.NAME and "origin" in tok.string.lower() or \
                _READ_ORIGIN.search(tok.line):           # getattr(fd, "origin", None) == ...
            names[tok.start[0]] = tok.line
        if tok.type == tokenize.STRING and tok.string.strip("'\"") in Origin.ALL:
            strings[tok.start[0]] = tok.line
    return [f"{path.name}:{n}: {names[n].strip()}" for n in sorted(names.keys() & strings.keys())]


def test_no_origin_is_spelled_outside_the_enum():
    """Code compares and sets origins through `Origin`, never a string of its own."""
    from pathlib import Path

    import opdiff
    root = Path(opdiff.__file__).parent
    python = [*(root / "comparison").rglob("*.py"), root / "api.py", *(root / "report").glob("*.py")]
    found = [hit for f in python if f.name != "result.py" for hit in origin_literals(f)]
    js = re.compile(r"""origin\s*[!=]==?\s*["']""")
    found += [f"{f.name}:{n}" for f in (root / "report").glob("*.js")
              for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
              if js.search(line)]
    assert found == []
