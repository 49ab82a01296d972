"""Module calls pair by path and call count even where the target's class is renamed
(`NpuAttention` against golden's `LlamaAttention`, comparison/align.py `same_classes`), and only
where the tensors both calls hold have the same shapes; a mapping file still wins."""
from __future__ import annotations

import opdiff
from opdiff.comparison.align import align, same_classes
from opdiff.store.schema import complete

SDPA = "Functional.scaled_dot_product_attention"


def _t(shape):
    return {"type": "tensor", "dtype": "float32", "shape": list(shape)}


def _module(path, cls, shape, phase="forward", parent="Module.Net.forward.0"):
    return complete({"name": f"Module.{path}.{cls}.{phase}.0", "op": f"Module.{path}.{cls}",
                     "phase": phase, "kind": "module", "module": parent,
                     "inputs": [_t(shape)], "outputs": [_t(shape)]})


def _op(name, shape, module):
    op, _, phase = name.rsplit(".", 2)
    return complete({"name": name, "op": op, "phase": phase, "kind": "api", "module": module,
                     "inputs": [_t(shape)], "outputs": [_t(shape)]})


def _grads(path, cls, shape):
    return complete({"name": f"Module.{path}.{cls}.parameters_grad.0",
                     "op": f"Module.{path}.{cls}.parameters_grad", "phase": "backward",
                     "kind": "parameters_grad", "module": f"Module.{path}.{cls}.forward.0",
                     "parameters": {"weight": _t(shape)}})


def _side(cls, shape):
    call = f"Module.attn.{cls}.forward.0"
    return [_op("Functional.linear.0.forward", shape, call),
            _op("Torch.tanh.0.forward", shape, call), _module("attn", cls, shape),
            _grads("attn", cls, shape)]


def test_a_renamed_class_pairs_by_path_and_the_ops_inside_it_too():
    target, golden = _side("NpuAttention", (2, 8)), _side("Attention", (2, 8))
    view, renames = same_classes(target, golden)
    assert renames == {"Module.attn.NpuAttention": "Module.attn.Attention"}
    assert [r["name"] for r in view] == [r["name"] for r in golden]
    assert view[0]["module"] == "Module.attn.Attention.forward.0"
    assert view[3]["op"] == "Module.attn.Attention.parameters_grad"
    assert target[2]["name"] == "Module.attn.NpuAttention.forward.0"    # records unchanged
    assert all(t is not None and g is not None for t, g in align(view, golden))
    # without the view, the module call, its ops' module and its gradients do not pair
    assert any(g is None for _, g in align(target, golden))


def test_two_modules_at_one_path_whose_shapes_differ_stay_apart():
    target, golden = _side("Conv1d", (2, 16)), _side("Linear", (2, 8))
    view, renames = same_classes(target, golden)
    assert renames == {} and view is target
    assert (2, 2) not in align(view, golden)


def _compare(hf_dump, tmp_path, fault=None, mapping=None, renamed=True):
    golden = hf_dump("llama", "eager", "statistics")
    target = hf_dump("llama", "sdpa", "statistics", fault=fault, renamed=renamed)
    return opdiff.compare(str(target), str(golden), str(tmp_path / "out"), progress=False,
                          mapping=mapping)


def test_a_renamed_attention_class_pairs_without_a_mapping_file(hf_dump, tmp_path):
    plain = _compare(hf_dump, tmp_path, renamed=False)
    result = _compare(hf_dump, tmp_path)
    assert result.first_divergence is None, result.first_divergence
    assert result.counts == plain.counts, (result.counts, plain.counts)
    rows = {r.target_name: r for r in result.rows if r.target_name}
    row = rows["Module.model.layers.0.self_attn.NpuAttention.forward.0.output.0"]
    assert row.golden_name == "Module.model.layers.0.self_attn.LlamaAttention.forward.0.output.0"
    assert row.result == "pass"
    said = [n for n in result.notes if "module classes paired by path" in n]
    assert len(said) == 1 and "`NpuAttention` as golden's `LlamaAttention`" in said[0]


def test_a_fault_in_a_renamed_attention_names_its_region(hf_dump, tmp_path):
    first = _compare(hf_dump, tmp_path, fault=f"{SDPA}:1").first_divergence
    assert first is not None and first.origin == "region", first
    assert "region in `model.layers.1.self_attn`" in first.reason
    assert first.module == "Module.model.layers.1.self_attn.NpuAttention.forward.0"


def test_a_mapping_file_still_wins(hf_dump, tmp_path):
    f = tmp_path / "cell_mapping.yaml"
    f.write_text("self_attn.NpuAttention: self_attn.LlamaAttention\n")
    result = _compare(hf_dump, tmp_path, mapping=f)
    assert not [n for n in result.notes if "never used" in n or "classes paired" in n], \
        result.notes
    assert result.counts == _compare(hf_dump, tmp_path, renamed=False).counts
