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

.PHONY: all deps demo-deps test-deps build demo test e2e-vm clean format tidy fuzz sanitize ci-sanitizers bench-endpoint bench-fleet

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
	@scripts/prefetch-guest-image.sh $(BUILD_DIR)
	cmake --build $(BUILD_DIR) -j $(JOBS)
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 600 -j $(JOBS)

# The real-guest end-to-end test alone (it is part of `make test` too): the
# base image built with debootstrap or reused from its cache
# (${XDG_CACHE_HOME:-~/.cache}/factory/images), then real QEMU guests with
# cloud-init, systemd and the agent; prints each phase's duration.
e2e-vm: test-deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS) --target factory factory-agent vm_e2e
	cd $(BUILD_DIR) && ctest -L e2e-vm --output-on-failure -V --timeout 1200

# What the model endpoint's proxy costs against Ollama direct, in one run
# (bench/endpoint_bench.cpp; docs/model-endpoint.md quotes it).
bench-endpoint: test-deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS) --target endpoint_bench
	$(BUILD_DIR)/bench/endpoint_bench

# The fleet benchmark (bench/fleet/run.py; docs/scale.md quotes it): a real
# `factory serve` and a Node.js baseline on loopback, the same agent load on
# both, the table with the ratios. Debian's python3 (with python3-cryptography),
# not a pyenv one; root or a high `ulimit -Hn` for 10,000 agents.
BENCH_FLEET_ARGS ?=
bench-fleet: test-deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS) --target factory factory-agent
	/usr/bin/python3 bench/fleet/run.py --build-dir $(BUILD_DIR) --out $(BUILD_DIR)/bench-fleet/last.txt $(BENCH_FLEET_ARGS)

# Sanitizer and fuzz builds: clang, Release, no debug info. clang 14 cannot
# compile the two files with coroutines (common/net/ws_client.cpp,
# agent/link/link.cpp) under ASan ("Cannot represent a difference across
# sections"), with or without line tables: those two are built without
# sanitizers there (common/ and agent/CMakeLists.txt). Stacks still name functions.
# Unity batches (FACTORY_UNITY) are verified with GCC, the CI build; these
# clang builds keep compiling one file at a time, as they were verified.
SANITIZER_FLAGS = -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_FLAGS= -DFACTORY_PCH=OFF \
  -DFACTORY_UNITY=OFF

# libFuzzer targets with ASan+UBSan (clang), each run FUZZ_SECONDS.
FUZZ_SECONDS ?= 60
fuzz: test-deps
	cmake -S . -B build-fuzz -G Ninja $(SANITIZER_FLAGS) -DFACTORY_FUZZ=ON
	cmake --build build-fuzz -j $(JOBS) --target fuzz_all
	scripts/run-fuzzers.sh build-fuzz $(FUZZ_SECONDS)

# The test suite built with sanitizers (clang): SANITIZE=address,undefined or thread.
SANITIZE ?= address,undefined
SANITIZE_DIR ?= build-$(subst $(comma),-,$(SANITIZE))
comma := ,
sanitize: test-deps
	cmake -S . -B $(SANITIZE_DIR) -G Ninja $(SANITIZER_FLAGS) -DFACTORY_SANITIZE=$(SANITIZE)
	cmake --build $(SANITIZE_DIR) -j $(JOBS)
	cd $(SANITIZE_DIR) && ctest --output-on-failure --timeout 900 -j $(JOBS) $(CTEST_ARGS)

# What CI runs besides `make test`, on subsets that fit its time budget on
# 2 cores (docs/testing.md says why these): every fuzz target for
# CI_FUZZ_SECONDS; under ASan+UBSan (the fuzz build) the tests of the decoders, the durable files (store, token book, spool,
# journal) and the server; under TSan those of the server's io threads and the
# store's writer. All of them build without the product (tests/CMakeLists.txt:
# tests of common/ and the unit tests of one module).
CI_FUZZ_SECONDS ?= 30
ASAN_TESTS = protocol_test ws_codec_test server_test url_test cidr_test catalog_test pki_test \
  http_client_test store_test enroll_tokens_test spool_test plan_journal_test health_parsers_test \
  health_sample_test
TSAN_TESTS = server_test ws_codec_test store_test spool_test
empty :=
space := $(empty) $(empty)
labels = '^($(subst $(space),|,$(strip $(1))))$$'
ci-sanitizers: test-deps
	cmake -S . -B build-fuzz -G Ninja $(SANITIZER_FLAGS) -DFACTORY_FUZZ=ON
	cmake --build build-fuzz -j $(JOBS) --target fuzz_all $(ASAN_TESTS)
	scripts/run-fuzzers.sh build-fuzz $(CI_FUZZ_SECONDS)
	cd build-fuzz && ctest --output-on-failure --timeout 900 -j $(JOBS) -L $(call labels,$(ASAN_TESTS))
	cmake -S . -B build-tsan -G Ninja $(SANITIZER_FLAGS) -DFACTORY_SANITIZE=thread
	cmake --build build-tsan -j $(JOBS) --target $(TSAN_TESTS)
	cd build-tsan && ctest --output-on-failure --timeout 900 -j $(JOBS) -L $(call labels,$(TSAN_TESTS))

# The files the clang_format test checks (tests/lint/check_format.py).
format:
	find common contract coordinator agent tests fuzz -name '*.cpp' -o -name '*.hpp' | xargs clang-format -i

# clang-tidy's checks (.clang-tidy) over every product source; the clang_tidy
# test in `make test` runs them over the subset tests/CMakeLists.txt names.
tidy: test-deps $(BUILD_DIR)/build.ninja
	python3 tests/lint/run_clang_tidy.py . $(BUILD_DIR) --jobs $(JOBS)

clean:
	rm -rf $(BUILD_DIR)
