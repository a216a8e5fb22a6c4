"""pytest setup for the Python tests: the package from this checkout.

The library is found through $QVATTN_LIB or ../../build/libqvattn.so
(python/qvattn/_ffi.py).  Tests that need torch or diffusers skip cleanly
where those are not installed (CI installs numpy and pytest only).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
