"""`opdiff overflow | grep ...` sees whole lines: piped output is not wrapped at 80 columns
(a dump path or a source line cut in two is lost to grep)."""
from opdiff.cli import main

from .test_offline import _dump


def test_piped_output_keeps_long_lines_whole(tmp_path, capsys):
    deep = tmp_path / ("a_rather_long_directory_name_" * 3) / "and_another_long_one"
    deep.mkdir(parents=True)
    path = _dump(deep, "exp")
    assert len(str(path)) > 100
    assert main(["overflow", str(path)]) == 0
    out = capsys.readouterr().out
    assert str(path) in out, out
    assert any(len(line) > 100 for line in out.splitlines())
