"""`pip install .` / `python -m build` from the repository root: the build
logic is python/setup.py's (CMake builds libqvattn.so into the package);
this file only points it at python/ and keeps setuptools' own build folders
out of CMake's build/ (`make`)."""
import importlib.util
import os

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("qvattn_setup",
                                               os.path.join(_here, "python", "setup.py"))
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)

_mod.main(options={"build": {"build_base": "build-py"}})
