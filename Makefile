# The two commands a newcomer runs: `make demo` and `make test`.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
# Release: no debug info, so the agent binary guests download stays small and
# the ~40 test executables link fast on 2 cores. RelWithDebInfo for gdb.
BUILD_TYPE ?= Release
CMAKE_FLAGS ?=
ifeq ($(CI),true)
CMAKE_FLAGS += -DFACTORY_WERROR=ON
endif

# What scripts/demo.sh runs: the two binaries (the coordinator serves the
# agent binary to the simulated guests). The ~40 test executables are
# `make test`'s business.
DEMO_TARGETS = factory factory-agent

.PHONY: all deps demo-deps test-deps build demo test clean format

all: build

deps:
	@scripts/install-deps.sh

demo-deps:
	@scripts/install-deps.sh --demo

test-deps:
	@scripts/install-deps.sh --test

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: demo-deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS) --target $(DEMO_TARGETS)
	@scripts/demo.sh $(BUILD_DIR)

test: test-deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 600 -j $(JOBS)

format:
	git ls-files '*.cpp' '*.hpp' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
