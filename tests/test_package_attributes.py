"""What the README writes after a bare `import opdiff` works in a fresh interpreter."""
import os
import subprocess
import sys


def test_opdiff_testing_is_reachable_after_import_opdiff():
    code = ("import sys, opdiff\n"
            "assert 'opdiff.testing' not in sys.modules\n"
            "print(opdiff.testing.inject_fault.__name__)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "inject_fault"
