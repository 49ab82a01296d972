"""Warnings raised inside recorded ops point at the user's line, as they do without opdiff."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import opdiff


def _softmax_without_dim(x):
    return F.softmax(x)          # torch warns "Implicit dimension choice" (a Python warning)


def _resize_out(x):
    out = torch.empty(2)
    torch.add(x, x, out=out)     # C++ warns: "An output with one or more elements was resized"
    return out


def _line_of(fn, text: str) -> int:
    import inspect
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _caught(fn, *args, level="L1", model=None, name=None):
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        fn(*args)
        plain = [(w.filename, w.lineno, w.category) for w in log]
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        with opdiff.dump(model, _caught.root / level / (name or fn.__name__), level=level):
            fn(*args)
        captured = [(w.filename, w.lineno, w.category) for w in log
                    if "global hooks" not in str(w.message)]
    return plain, captured


@pytest.fixture(autouse=True)
def _root(tmp_path):
    _caught.root = tmp_path


@pytest.mark.parametrize("level", ["L1", "L2"])
def test_a_python_warning_in_an_op_names_the_users_line(level):
    plain, captured = _caught(_softmax_without_dim, torch.randn(3, 4), level=level)
    assert plain == [(__file__, _line_of(_softmax_without_dim, "F.softmax(x)"), UserWarning)]
    assert captured == plain


@pytest.mark.parametrize("level", ["L1", "L2"])
def test_a_cpp_warning_in_an_op_names_the_users_line(level):
    plain, captured = _caught(_resize_out, torch.randn(3), level=level)
    assert plain and plain[0][:2] == (__file__, _line_of(_resize_out, "torch.add(x, x, out=out)"))
    assert captured == plain


def test_a_warning_in_a_module_forward_names_the_module_line():
    class Head(torch.nn.Module):
        def forward(self, x):
            return F.softmax(x)          # the line the warning names

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Head())
    plain, captured = _caught(model, torch.randn(2, 4), level="mix", model=model, name="model")
    assert plain and plain[0][0] == __file__
    assert captured == plain


def test_default_filter_shows_each_call_site_once():
    """The warning registry is the user's module's, keyed by the user's line: two call sites
    warn once each (under opdiff they used to share opdiff's line: the second was hidden)."""
    x = torch.randn(3, 4)
    with warnings.catch_warnings(record=True) as log:
        warnings.resetwarnings()
        warnings.simplefilter("default")
        with opdiff.dump(None, _caught.root / "default", level="L1"):
            for _ in range(3):
                F.softmax(x)
                F.softmax(x)
    lines = sorted(w.lineno for w in log if "Implicit dimension" in str(w.message))
    assert len(lines) == 2 and lines[0] != lines[1]


def test_a_warning_turned_into_an_error_raises_from_the_op(read_dump):
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        with pytest.raises(UserWarning, match="Implicit dimension"):
            with opdiff.dump(None, _caught.root / "error", level="L1"):
                x.exp()
                _softmax_without_dim(x)
    assert read_dump(_caught.root / "error").names()[0] == "Tensor.exp.0.forward"


def test_a_traceback_through_an_op_shows_opdiffs_stand_in_frame_by_name():
    """The frame that stands in for the user's call shows the user's file and line, named so
    that a reader can tell it from the user's own frame."""
    import traceback
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    with opdiff.dump(None, _caught.root / "raise", level="L1"):
        with pytest.raises(RuntimeError) as info:
            torch.mm(a, b)
    frames = traceback.extract_tb(info.value.__traceback__)
    stand_in = [f for f in frames if f.name == "<opdiff call>"]
    assert len(stand_in) == 1 and stand_in[0].filename == __file__
    assert "torch.mm(a, b)" in stand_in[0].line
