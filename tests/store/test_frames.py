"""Which frames are the user's (store/frames.py): installed model code is, torch and the stdlib
are not, wherever the interpreter and its site-packages live."""
from __future__ import annotations

import sysconfig

from opdiff.store.frames import is_internal

STDLIB = sysconfig.get_paths()["stdlib"]


def test_the_stdlib_is_internal():
    assert is_internal(f"{STDLIB}/json/decoder.py")
    assert is_internal(f"{STDLIB}/contextlib.py")


def test_installed_model_code_is_the_users_in_any_site_packages():
    # the interpreter's own site-packages (inside its stdlib directory), as a venv made with
    # --system-site-packages imports it: transformers' model files are where the user's ops are
    assert not is_internal(f"{STDLIB}/site-packages/transformers/models/llama/modeling_llama.py")
    assert not is_internal("/opt/venv/lib/python3.11/site-packages/timm/models/resnet.py")
    assert not is_internal("/usr/lib/python3/dist-packages/mylib/model.py")


def test_torch_and_the_tools_are_internal_in_any_site_packages():
    assert is_internal(f"{STDLIB}/site-packages/torch/nn/modules/linear.py")
    assert is_internal("/opt/venv/lib/python3.11/site-packages/torch_npu/utils.py")
    assert is_internal("/usr/lib/python3/dist-packages/msprobe/pytorch/hook.py")
