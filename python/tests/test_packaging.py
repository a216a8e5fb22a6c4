"""The Python packaging, as a new user meets it.

test_metadata_*          (instant, offline) the root and python/ pyproject.toml
                         describe the same package; one version everywhere.
test_wheel_in_clean_venv (CI; 24-37 s on a loaded 2-core machine; needs PyPI)
                         a copy of the checkout's files (a clean clone) ->
                         `pip wheel` from the root with QVATTN_CUDA=0 (an
                         isolated build, as `pip install .` does) -> a fresh
                         venv with the wheel and numpy from PyPI -> import
                         qvattn and a small CPU attention against numpy.  Skips when the package
                         index cannot be reached, or without CMake / a C
                         compiler.
test_pip_install_python_dir  (opt-in: QVATTN_TEST_PIP=1, slower) the same
                         through `pip install ./python` into a --target dir.
"""
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _toml(path):
    try:
        import tomllib
    except ImportError:
        try:
            import tomli as tomllib
        except ImportError:
            pytest.skip("needs tomllib (Python >= 3.11) or tomli")
    with open(path, "rb") as f:
        return tomllib.load(f)


def test_metadata_root_and_python_dir_agree():
    root = _toml(os.path.join(ROOT, "pyproject.toml"))
    sub = _toml(os.path.join(ROOT, "python", "pyproject.toml"))
    assert root["project"] == sub["project"]
    assert root["build-system"] == sub["build-system"]
    assert root["tool"]["setuptools"]["package-dir"] == {"": "python"}
    for t in (root, sub):
        st = t["tool"]["setuptools"]
        assert st["packages"] == ["qvattn"]
        assert st["package-data"] == {"qvattn": ["libqvattn.so"]}
        assert st["dynamic"]["version"] == {"attr": "qvattn.__version__"}
    proj = root["project"]
    # `import qvattn` needs only the library; torch is the torch layer's extra.
    assert proj["dependencies"] == []
    assert any(r.startswith("torch") for r in proj["optional-dependencies"]["torch"])


def test_metadata_one_version():
    with open(os.path.join(ROOT, "python", "qvattn", "__init__.py")) as f:
        py = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        cm = re.search(r"project\(qvattn VERSION ([0-9.]+)", f.read()).group(1)
    assert py == cm, f"python/qvattn/__init__.py says {py}, CMakeLists.txt {cm}"


def _index_reachable():
    url = (os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip("/")
    try:
        req = urllib.request.Request(url + "/setuptools/", method="HEAD")
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status == 200, url
    except Exception as e:  # offline, proxy, DNS, TLS
        return False, f"{url}: {e}"


def _checkout_copy(dst):
    """The checkout's files as a clone would have them (tracked + untracked
    not ignored, as they are now): no build/, no libqvattn.so, no .git."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], cwd=ROOT, capture_output=True,
                             check=True, timeout=60).stdout
        files = [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    for f in files:
        src = os.path.join(ROOT, f)
        if not os.path.isfile(src):  # deleted in the work tree
            continue
        os.makedirs(os.path.join(dst, os.path.dirname(f)), exist_ok=True)
        shutil.copy2(src, os.path.join(dst, f))


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("QVATTN_", "PYTHON")) and k != "VIRTUAL_ENV"}
    env.update(extra)
    return env


def _venv_pip(venv, vpy):
    """A fresh venv and the pip command that installs into it: this pip with
    --python (pip >= 22.3; no ensurepip needed, which Debian's python3
    lacks without python3-venv), else the venv's own pip."""
    import pip as _pip
    if tuple(int(x) for x in _pip.__version__.split(".")[:2]) >= (22, 3):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                       check=True, timeout=120)
        return [sys.executable, "-m", "pip", "--python", vpy]
    r = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True,
                       text=True, timeout=180)
    if r.returncode:
        pytest.skip(f"cannot create a venv with pip (python3-venv?): {r.stdout}{r.stderr}")
    return [vpy, "-m", "pip"]


SMOKE = r"""
import os, sys
import numpy as np
import qvattn
from qvattn import _ffi
venv = os.path.realpath(sys.prefix)
assert os.path.realpath(qvattn.__file__).startswith(venv), qvattn.__file__
assert os.path.realpath(_ffi.lib_path).startswith(venv), _ffi.lib_path
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 2, 64, 64)).astype(np.float32) for _ in range(3))
s = np.einsum("bhnd,bhmd->bhnm", q, k) / 8.0
p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
ref = np.einsum("bhnm,bhmd->bhnd", p, v)
out = qvattn.attention(q, k, v, method="exact")
assert out.shape == q.shape and out.dtype == np.float32
err = float(np.abs(out - ref).max())
assert err < 1e-4, err
out8 = qvattn.attention(q, k, v)  # the default method
rel = float(np.linalg.norm(out8 - ref) / np.linalg.norm(ref))
assert rel < 0.1, rel
print("SMOKE OK", qvattn.__version__, err, rel, qvattn.build_info())
"""


def test_wheel_in_clean_venv(tmp_path):
    if not shutil.which("cmake") or not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("needs CMake and a C compiler")
    t0 = time.monotonic()
    ok, why = _index_reachable()
    if not ok:
        pytest.skip(f"package index unreachable (offline?): {why}")
    src, dist, venv = tmp_path / "qvattn", tmp_path / "dist", tmp_path / "venv"
    _checkout_copy(str(src))
    # The build as `pip install .` runs it (isolated: setuptools from the
    # index), CUDA off; its output is kept for the failure message.
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v",
                        "--disable-pip-version-check", "-w", str(dist), str(src)],
                       env=_clean_env(QVATTN_CUDA="0", QVATTN_PROGRESS="0"),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "CUDA backend OFF" in r.stdout + r.stderr
    t_wheel = time.monotonic() - t0
    wheels = list(dist.glob("qvattn-*.whl"))
    assert len(wheels) == 1, wheels
    whl = wheels[0]
    assert re.match(r"qvattn-[0-9.]+-py3-none-linux_\w+\.whl$", whl.name), whl.name
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "qvattn/libqvattn.so" in names and "qvattn/__init__.py" in names, names
    assert not any(n.startswith(("tests/", "src/", "python/")) for n in names), names
    assert "Provides-Extra: torch" in meta
    assert not re.search(r"^Requires-Dist: (?!.*extra ==)", meta, re.M), meta

    vpy = str(venv / "bin" / "python")
    pip = _venv_pip(venv, vpy)
    r = subprocess.run(pip + ["install", "-q", "--disable-pip-version-check",
                              str(whl), "numpy"], env=_clean_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lib = next((venv / "lib").glob("python3*/site-packages/qvattn/libqvattn.so"))
    if shutil.which("readelf"):
        dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True,
                             text=True, check=True).stdout
        assert "libcudart.so" not in dyn  # cudart (when built) is linked statically
    r = subprocess.run([vpy, "-c", SMOKE], env=_clean_env(), cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SMOKE OK" in r.stdout and "no CUDA" in r.stdout, r.stdout
    print(f"\nwheel {whl.name} built in {t_wheel:.1f} s; "
          f"whole test {time.monotonic() - t0:.1f} s")


@pytest.mark.skipif(os.environ.get("QVATTN_TEST_PIP") != "1",
                    reason="slow, needs pip and a package index; QVATTN_TEST_PIP=1")
def test_pip_install_python_dir(tmp_path):
    target = tmp_path / "site"
    env = _clean_env(QVATTN_CUDA="0", QVATTN_PROGRESS="0")
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
