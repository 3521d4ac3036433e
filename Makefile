# packbert: `make demo` and `make test` set everything up (Debian packages via apt-get) and build.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS       ?= $(shell nproc)
CMAKE_GEN  := -G Ninja

.PHONY: setup build demo test test-fast test-fast-run test-avx2-run build-asan test-asan test-asan-run test-tsan bench \
        clean format

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Release

build: setup $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	./$(BUILD)/packbert demo --workdir out/demo

# The test command: the optimised build and its tests (the CPU's own instruction set), then the
# same tests under ASan + UBSan with the instruction set capped at AVX2 for packbert and oneDNN
# (the sanitizer build's kernels are AVX2 code, and oneDNN is capped too: what an AVX2-only CPU
# runs, checked for memory errors), then the interrupted-training tests under ThreadSanitizer;
# each stage timed, the times printed at the end.
test:
	@bash scripts/stages.sh \
	  "set-up and build" "$(MAKE) --no-print-directory build" \
	  "tests" "$(MAKE) --no-print-directory test-fast-run" \
	  "ASan + UBSan build" "$(MAKE) --no-print-directory build-asan" \
	  "ASan + UBSan tests, AVX2" "$(MAKE) --no-print-directory test-asan-run" \
	  "TSan build and crash tests" "$(MAKE) --no-print-directory test-tsan"

test-fast: build test-fast-run

test-fast-run:
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The optimised build's tests capped at AVX2 (not part of `make test`, whose sanitizer stage runs
# capped; on a CPU without AVX-512 the cap hides nothing).
test-avx2-run:
	@if grep -qw avx512f /proc/cpuinfo; then \
	  PACKBERT_MAX_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
	    ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS); \
	else \
	  echo "test-avx2-run: this CPU has no AVX-512, so the tests above ran what an AVX2-only CPU runs"; \
	fi

build-asan: setup
	cmake -S . -B $(ASAN_BUILD) $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPACKBERT_SANITIZE=ON
	cmake --build $(ASAN_BUILD) -j $(JOBS)

test-asan: build-asan test-asan-run

test-asan-run:
	PACKBERT_MAX_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)

test-tsan: setup
	bash scripts/test_tsan.sh $(TSAN_BUILD) $(JOBS)

bench: build
	./$(BUILD)/pack_bench --runs 5

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
