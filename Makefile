# Thin wrapper over CMake. `make`, `make test`, `make demo`, `make asan`, `make tsan`,
# `make install PREFIX=...`.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
PREFIX ?= /usr/local

.PHONY: all build test demo install asan tsan dev clean

all: build

$(BUILD)/Makefile:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	./$(BUILD)/qvattn eval --synthetic wan-small

# Header, shared and static libraries, qvattn.pc, the CMake package and the
# CLI under $(PREFIX) (DESTDIR is honoured); README.md, "Installing the C library".
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# Kernel versions under trial and their driver (dev/cuda/README.md); needs nvcc.
dev: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS) --target dev_attn

# CPU tests under AddressSanitizer + UBSan (CUDA off: the sanitizers are host-only).
asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DQVA_SANITIZE=ON -DQVA_CUDA=OFF -DQVA_OPENMP=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

# The threads test under ThreadSanitizer: CUDA off, and OpenMP off since
# libgomp is not TSan-instrumented (so the other, single-threaded tests
# would give TSan nothing to see).  Runs with ASLR off where setarch allows
# it: the TSan of older compilers cannot map its shadow memory under the
# 32-bit mmap randomization of recent kernels.
TSAN_RUN = $(shell setarch $$(uname -m) -R true 2>/dev/null && echo setarch $$(uname -m) -R)
tsan:
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQVA_TSAN=ON -DQVA_CUDA=OFF -DQVA_OPENMP=OFF
	cmake --build build-tsan -j $(JOBS) --target test_threads
	cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" $(TSAN_RUN) ctest --output-on-failure -R '^test_threads$$'

clean:
	rm -rf $(BUILD) build-asan build-tsan
