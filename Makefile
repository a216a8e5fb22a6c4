# Thin wrapper over CMake. `make`, `make test`, `make demo`, `make asan`.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all build test demo asan dev clean

all: build

$(BUILD)/Makefile:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

demo: build
	./$(BUILD)/qvattn eval --synthetic wan-small

# Kernel versions under trial and their driver (dev/cuda/README.md); needs nvcc.
dev: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS) --target dev_attn

# CPU tests under AddressSanitizer + UBSan (CUDA off: the sanitizers are host-only).
asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DQVA_SANITIZE=ON -DQVA_CUDA=OFF -DQVA_OPENMP=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) build-asan
