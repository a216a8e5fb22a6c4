"""Build hook of the qvattn Python package: runs CMake on the repository and
ships libqvattn.so inside the package.

    pip install .                   # from the repository root (../setup.py loads this file)
    pip install ./python            # the same package, built from python/
    pip install -v .                # ... with CMake's and the compilers' output
    python -m build                 # sdist + wheel (from the root; see docs/PYTHON.md)

Environment:
  QVATTN_CUDA=0|1        the CUDA backend off / on (default 1: CMake builds it
                         where it finds nvcc, else builds without it)
  QVATTN_BUILD_JOBS=N    parallel build jobs (default: CPU count)
  QVATTN_BUILD_TYPE      CMake build type (default Release)
  QVATTN_CMAKE_ARGS      more CMake arguments, split like a shell would
                         (e.g. "-DQVA_OPENMP=OFF")
  QVATTN_SOURCE_DIR      the qvattn source tree (default: the parent of this
                         directory)
  QVATTN_PREBUILT_LIB    ship this libqvattn.so instead of building
  QVATTN_PROGRESS=0      no progress lines on the terminal (see _say)
Without a source tree (an sdist of python/ alone) a libqvattn.so copied into
python/qvattn/ is shipped as is.

pip runs this build in a subprocess and shows its output only with -v, so
what is being built, and how long it takes, is also written to the
controlling terminal (/dev/tty) where there is one: one line up front, one
after CMake's configure step, one every 30 s while compiling, one at the end.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = "libqvattn.so"
CMAKE_MIN = (3, 18)
# Measured: `pip install .` from a clean clone on a 2-core machine with nvcc
# 13.0, about 1 CPU-minute of nvcc since the CUDA sources compile as three
# units, 51-58 s of wall time under a load of 1.6-1.7 (2.3-4.7 minutes
# under a load of 3-8 before; docs/PYTHON.md has the figures).
CUDA_TIME = "about 1 CPU-minute: about a minute on 2 idle cores, longer under load"


def _source_dir():
    cands = [os.environ.get("QVATTN_SOURCE_DIR"), os.path.join(HERE, "..")]
    for c in cands:
        if c and os.path.isfile(os.path.join(c, "CMakeLists.txt")) and \
                os.path.isfile(os.path.join(c, "include", "qvattn.h")):
            return os.path.abspath(c)
    return None


def _cmake_version(exe):
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _system_cmake_ok():
    exe = shutil.which("cmake")
    v = exe and _cmake_version(exe)
    return bool(v and v >= CMAKE_MIN)


def _cmake():
    exe = shutil.which("cmake")
    if exe and (_cmake_version(exe) or (0,)) >= CMAKE_MIN:
        return exe
    try:  # the PyPI "cmake" package (a build requirement where no CMake >= 3.18 is on PATH)
        import cmake
        return os.path.join(cmake.CMAKE_BIN_DIR, "cmake")
    except ImportError:
        raise RuntimeError("qvattn: CMake >= 3.18 is needed to build libqvattn "
                           "(apt install cmake, or pip install cmake)")


_TTY = None
_TTY_LINES = 0


def _say(msg):
    """A progress line the user sees even without `pip install -v`: on the
    controlling terminal when there is one (pip captures this process's
    output and shows it only with -v), else on stderr (CI logs)."""
    global _TTY, _TTY_LINES
    line = "qvattn: " + msg + "\n"
    if _TTY is None:
        _TTY = False
        if os.environ.get("QVATTN_PROGRESS", "1") not in ("0", "off", "OFF", "no"):
            try:
                _TTY = open("/dev/tty", "w")
            except OSError:
                _TTY = False
    if _TTY:
        try:
            # pip draws a spinner after "Building wheel for qvattn ... ":
            # start below it, then return over its last frame each time.
            _TTY.write(("\r" if _TTY_LINES else "\n") + line)
            _TTY_LINES += 1
            _TTY.flush()
            return
        except OSError:
            _TTY = False
    sys.stderr.write(line)
    sys.stderr.flush()


def _cache_value(bdir, key):
    try:
        with open(os.path.join(bdir, "CMakeCache.txt")) as f:
            for ln in f:
                if ln.startswith(key + ":"):
                    return ln.split("=", 1)[1].strip()
    except OSError:
        pass
    return ""


def _run_build(cmd, heartbeat_s=30.0):
    """Runs CMake's build step with its output on our stdout (what pip -v
    shows) and a line on the terminal every heartbeat_s: CMake's last
    "[ NN%]" and the elapsed time."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    state = {"pct": "", "what": ""}

    def pump():
        for raw in proc.stdout:
            sys.stdout.write(raw.decode("utf-8", "replace"))
            sys.stdout.flush()
            m = re.match(rb"\[\s*(\d+)%\]\s+(.*)", raw)
            if m:
                state["pct"] = m.group(1).decode()
                state["what"] = os.path.basename(m.group(2).decode("utf-8", "replace").split()[-1])

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    while True:
        th.join(heartbeat_s)
        if not th.is_alive():
            break
        el = int(time.monotonic() - t0)
        pct = f"{state['pct']}% " if state["pct"] else ""
        _say(f"still compiling ({el // 60}m{el % 60:02d}s, {pct}{state['what']})")
    rc = proc.wait()
    if rc:
        raise subprocess.CalledProcessError(rc, cmd)
    return time.monotonic() - t0


class BuildPyWithCMake(build_py):
    """build_py, then CMake's qvattn_shared target copied into the package."""

    def run(self):
        super().run()
        dest_dir = os.path.join(self.build_lib, "qvattn")
        os.makedirs(dest_dir, exist_ok=True)
        dest = os.path.join(dest_dir, LIB)
        prebuilt = os.environ.get("QVATTN_PREBUILT_LIB")
        if prebuilt:
            _say(f"shipping the prebuilt {prebuilt} (QVATTN_PREBUILT_LIB)")
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
        # Always explicit: a build folder reused by a later `pip install .`
        # must not keep an earlier QVATTN_CUDA=0 in CMake's cache.
        cuda = os.environ.get("QVATTN_CUDA", "1")
        cfg.append("-DQVA_CUDA=" + ("OFF" if cuda.lower() in ("0", "off", "no", "false", "")
                                    else "ON"))
        cfg += shlex.split(os.environ.get("QVATTN_CMAKE_ARGS", ""))
        jobs = os.environ.get("QVATTN_BUILD_JOBS") or str(os.cpu_count() or 2)
        t0 = time.monotonic()
        cuda_off = "-DQVA_CUDA=OFF" in cfg
        _say("building libqvattn, the C library" +
             ("" if cuda_off else " and, where nvcc is found, its CUDA kernels") +
             f", with CMake in {bdir} (`pip install -v` shows the compilers)")
        sys.stdout.write("qvattn: " + " ".join(shlex.quote(a) for a in cfg) + "\n")
        sys.stdout.flush()
        subprocess.check_call(cfg)
        nvcc = _cache_value(bdir, "CMAKE_CUDA_COMPILER")
        cuda_on = (_cache_value(bdir, "QVA_CUDA").upper() not in ("OFF", "0", "FALSE", "NO")
                   and bool(nvcc) and not nvcc.endswith("NOTFOUND"))
        if cuda_on:
            _say(f"CUDA backend ON ({nvcc}, sm_90a): the CUDA kernels take {CUDA_TIME} "
                 f"({jobs} jobs here); QVATTN_CUDA=0 builds the CPU-only library in "
                 "seconds")
        else:
            _say("CUDA backend OFF (" + ("QVATTN_CUDA=0" if cuda_off else "no nvcc found") +
                 f"): the CPU-only library, {jobs} jobs")
        sys.stdout.write(f"qvattn: {cmake} --build {bdir} --target qvattn_shared -j {jobs}\n")
        sys.stdout.flush()
        _run_build([cmake, "--build", bdir, "--target", "qvattn_shared", "-j", jobs])
        built = os.path.join(bdir, LIB)
        if not os.path.isfile(built):
            raise RuntimeError(f"qvattn: CMake did not produce {built}")
        shutil.copy2(built, dest)
        _say(f"libqvattn built in {time.monotonic() - t0:.0f} s "
             f"({'with' if cuda_on else 'without'} CUDA)")


class BinaryDistribution(Distribution):
    """The wheel carries a native library: platform-specific, not pure."""

    def has_ext_modules(self):
        return True


def _cmdclass():
    cmds = {"build_py": BuildPyWithCMake}
    try:  # setuptools >= 70.1 has bdist_wheel; older ones take it from `wheel`
        from setuptools.command.bdist_wheel import bdist_wheel
    except ImportError:
        try:
            from wheel.bdist_wheel import bdist_wheel
        except ImportError:
            bdist_wheel = None
    if bdist_wheel is not None:
        class BdistWheelAnyPython(bdist_wheel):
            """libqvattn.so is loaded with ctypes: no Python ABI in it, so
            one wheel serves every Python 3 on the platform
            (py3-none-linux_x86_64)."""

            def get_tag(self):
                _, _, plat = super().get_tag()
                return "py3", "none", plat

        cmds["bdist_wheel"] = BdistWheelAnyPython
    return cmds


def main(**kw):
    """setup() with the CMake build; ../setup.py (the repository root) calls
    this with package_dir={"": "python"}."""
    # Without a CMake >= 3.18 on PATH, ask the build front end (pip, build)
    # for the PyPI one: setuptools hands setup_requires to PEP 517's
    # get_requires_for_build_wheel.
    if not os.environ.get("QVATTN_PREBUILT_LIB") and not _system_cmake_ok():
        kw.setdefault("setup_requires", ["cmake>=3.18"])
    setup(cmdclass=_cmdclass(), distclass=BinaryDistribution, **kw)


if __name__ == "__main__":
    main()
