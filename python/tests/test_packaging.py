"""`pip install ./python` builds libqvattn with CMake and ships it (opt-in:
QVATTN_TEST_PIP=1; it needs pip, CMake, a C compiler and, for the isolated
build, access to a package index for setuptools)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.mark.skipif(os.environ.get("QVATTN_TEST_PIP") != "1",
                    reason="slow, needs pip and a package index; QVATTN_TEST_PIP=1")
def test_pip_install_builds_and_ships_the_library(tmp_path):
    target = tmp_path / "site"
    env = dict(os.environ, QVATTN_CUDA="0")
    env.pop("QVATTN_LIB", None)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target",
                    str(target), os.path.join(ROOT, "python")], check=True, env=env,
                   timeout=900)
    assert (target / "qvattn" / "libqvattn.so").is_file()
    code = ("import qvattn, os; p = qvattn._ffi.lib_path; "
            "assert p.startswith(os.environ['T']), p; print(qvattn.build_info())")
    r = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=str(target),
                                                              T=str(target)),
                       capture_output=True, text=True, cwd=str(tmp_path), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "qvattn" in r.stdout
