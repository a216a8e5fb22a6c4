"""Build hook of the qvattn Python package: runs CMake on the repository and
ships libqvattn.so inside the package.

    pip install ./python            # from a checkout (CUDA where nvcc is)

Environment:
  QVATTN_CUDA=0|1        force the CUDA backend off / on (default: CMake's
                         choice: on where nvcc is found)
  QVATTN_BUILD_JOBS=N    parallel build jobs (default: CPU count)
  QVATTN_BUILD_TYPE      CMake build type (default Release)
  QVATTN_SOURCE_DIR      the qvattn source tree (default: the parent of this
                         directory)
  QVATTN_PREBUILT_LIB    ship this libqvattn.so instead of building
Without a source tree (an sdist of python/ alone) a libqvattn.so copied into
python/qvattn/ is shipped as is.
"""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = "libqvattn.so"


def _source_dir():
    cands = [os.environ.get("QVATTN_SOURCE_DIR"), os.path.join(HERE, "..")]
    for c in cands:
        if c and os.path.isfile(os.path.join(c, "CMakeLists.txt")) and \
                os.path.isfile(os.path.join(c, "include", "qvattn.h")):
            return os.path.abspath(c)
    return None


def _cmake():
    exe = shutil.which("cmake")
    if exe:
        return exe
    try:  # the PyPI "cmake" package
        import cmake
        return os.path.join(cmake.CMAKE_BIN_DIR, "cmake")
    except ImportError:
        raise RuntimeError("qvattn: CMake >= 3.18 is needed to build libqvattn "
                           "(apt install cmake, or pip install cmake)")


class BuildPyWithCMake(build_py):
    """build_py, then CMake's qvattn_shared target copied into the package."""

    def run(self):
        super().run()
        dest_dir = os.path.join(self.build_lib, "qvattn")
        os.makedirs(dest_dir, exist_ok=True)
        dest = os.path.join(dest_dir, LIB)
        prebuilt = os.environ.get("QVATTN_PREBUILT_LIB")
        if prebuilt:
            shutil.copy2(prebuilt, dest)
            return
        src = _source_dir()
        if src is None:
            local = os.path.join(HERE, "qvattn", LIB)
            if os.path.isfile(local):
                shutil.copy2(local, dest)
                return
            raise RuntimeError("qvattn: no source tree (CMakeLists.txt) found next to "
                               "python/ and no prebuilt libqvattn.so: build from a "
                               "checkout, or set QVATTN_SOURCE_DIR / QVATTN_PREBUILT_LIB")
        build_temp = self.get_finalized_command("build").build_temp
        bdir = os.path.abspath(os.path.join(build_temp, "qvattn-cmake"))
        cmake = _cmake()
        cfg = [cmake, "-S", src, "-B", bdir,
               "-DCMAKE_BUILD_TYPE=" + os.environ.get("QVATTN_BUILD_TYPE", "Release")]
        cuda = os.environ.get("QVATTN_CUDA")
        if cuda is not None:
            cfg.append("-DQVA_CUDA=" + ("ON" if cuda not in ("0", "OFF", "off", "") else "OFF"))
        jobs = os.environ.get("QVATTN_BUILD_JOBS") or str(os.cpu_count() or 2)
        self.announce("qvattn: " + " ".join(cfg), level=2)
        subprocess.check_call(cfg)
        subprocess.check_call([cmake, "--build", bdir, "--target", "qvattn_shared",
                               "-j", jobs])
        built = os.path.join(bdir, LIB)
        if not os.path.isfile(built):
            raise RuntimeError(f"qvattn: CMake did not produce {built}")
        shutil.copy2(built, dest)


class BinaryDistribution(Distribution):
    """The wheel carries a native library: platform-specific, not pure."""

    def has_ext_modules(self):
        return True


if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildPyWithCMake}, distclass=BinaryDistribution)
