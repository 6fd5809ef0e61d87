# orch - build, test and sanitizer targets.
#
#   make            build build/orch and every engine this machine can build
#   make run        install, build, train the default model, generate from it
#   make test       install missing packages (tools/setup.sh), build, run all suites
#   make asan       the same suites under ASan+UBSan, in build/asan
#   make tsan       the threaded suites under ThreadSanitizer, in build/tsan
#   make analyze    static analysis (cppcheck) of orchestrator/, engines/, tools/
#   make format     apply .clang-format; make format-check fails on any difference
#   make clean
#
# Sources are picked up by wildcard: orchestrator/*/*.c -> build/orch,
# engines/<name>/*.c (and *.cu) -> build/libengine_<name>.so,
# tests/test_*.c -> build/tests/test_* (Check suites),
# tests/engines/*.c -> build/tests/engines/*.so (deliberately broken engines),
# tools/*.c -> build/tools/*.

BUILD ?= build
SAN ?= 0
CC ?= cc

OPT := -O2
SAN_FLAGS :=
ifeq ($(SAN),1)
  SAN_FLAGS := -fsanitize=address,undefined
  OPT := -O1 -fno-omit-frame-pointer $(SAN_FLAGS) -fno-sanitize-recover=undefined
endif
ifeq ($(SAN),thread)
  SAN_FLAGS := -fsanitize=thread
  OPT := -O1 -fno-omit-frame-pointer $(SAN_FLAGS)
endif

WARN := -Wall -Wextra -Werror
CFLAGS_COMMON := -std=c11 $(WARN) $(OPT) -g -D_GNU_SOURCE -I. -MMD -MP
LDFLAGS_COMMON := $(SAN_FLAGS)

# --- MPI: the orchestrator is compiled with mpicc where it exists ------------
MPICC := $(shell command -v mpicc 2>/dev/null)
ifneq ($(MPICC),)
  ifneq ($(NO_MPI),1)
    ORCH_CC := OMPI_CC=$(CC) $(MPICC)
    MPI_DEFS := -DORCH_HAVE_MPI=1
  endif
endif
ORCH_CC ?= $(CC)

PKG_LIBS = $(shell pkg-config --libs libcjson libmicrohttpd libpcre2-8 libcrypto icu-uc 2>/dev/null || echo -lcjson -lmicrohttpd -lpcre2-8 -lcrypto -licuuc -licudata)
PKG_CFLAGS = $(shell pkg-config --cflags libcjson libmicrohttpd libpcre2-8 libcrypto icu-uc 2>/dev/null)
CHECK_LIBS = $(shell pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lrt -lm -lpthread)

ORCH_SRCS := $(wildcard orchestrator/*/*.c)
ORCH_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(ORCH_SRCS))
ORCH_LIB_OBJS := $(filter-out $(BUILD)/obj/orchestrator/cli/main.o,$(ORCH_OBJS))
ORCH_LIBS = $(PKG_LIBS) -lcurl -ldl -lpthread -lm

ENGINE_CFLAGS := $(CFLAGS_COMMON) -fPIC -fvisibility=hidden

MOCK_SRCS := $(wildcard engines/mock/*.c)
CPU_SRCS := $(wildcard engines/cpu/*.c)
CUDA_CU_SRCS := $(wildcard engines/cuda/*.cu)
CUDA_C_SRCS := $(wildcard engines/cuda/*.c)
# engine-side code shared by every engine (engines/common), linked into each .so
COMMON_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard engines/common/*.c))

NVCC := $(shell command -v nvcc 2>/dev/null || ( [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc ))
CUDA_HOME ?= $(if $(NVCC),$(patsubst %/bin/nvcc,%,$(NVCC)),/usr/local/cuda)
NVCC_FLAGS := -O2 -std=c++17 -MMD -MP -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror \
  -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 -I.

TEST_SRCS := $(wildcard tests/test_*.c)
TEST_BINS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
BROKEN_SRCS := $(wildcard tests/engines/*.c)
BROKEN_SOS := $(patsubst tests/engines/%.c,$(BUILD)/tests/engines/%.so,$(BROKEN_SRCS))
TOOL_SRCS := $(wildcard tools/*.c)
TOOL_BINS := $(patsubst tools/%.c,$(BUILD)/tools/%,$(TOOL_SRCS))

ENGINES := $(BUILD)/libengine_mock.so
ifneq ($(CPU_SRCS),)
  ENGINES += $(BUILD)/libengine_cpu.so
endif
ifneq ($(NVCC),)
  ifneq ($(CUDA_CU_SRCS),)
    ifeq ($(SAN),0)
      ENGINES += $(BUILD)/libengine_cuda.so
    endif
  endif
endif

.PHONY: all test asan tsan analyze format format-check clean setup test-bins cuda-note run
all: $(BUILD)/orch $(ENGINES) $(TOOL_BINS) cuda-note

cuda-note:
ifeq ($(NVCC),)
	@echo "note: nvcc not found; skipping build/libengine_cuda.so"
endif

$(BUILD)/obj/orchestrator/%.o: orchestrator/%.c
	@mkdir -p $(dir $@)
	$(ORCH_CC) $(CFLAGS_COMMON) $(MPI_DEFS) $(PKG_CFLAGS) -c $< -o $@

$(BUILD)/orch: $(ORCH_OBJS)
	$(ORCH_CC) $(LDFLAGS_COMMON) -o $@ $^ $(ORCH_LIBS) -rdynamic

$(BUILD)/obj/engines/%.o: engines/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ENGINE_CFLAGS) -c $< -o $@

$(BUILD)/libengine_mock.so: $(patsubst %.c,$(BUILD)/obj/%.o,$(MOCK_SRCS)) $(COMMON_OBJS)
	$(CC) $(LDFLAGS_COMMON) -shared -o $@ $^ -lm -lpthread

$(BUILD)/libengine_cpu.so: $(patsubst %.c,$(BUILD)/obj/%.o,$(CPU_SRCS)) $(COMMON_OBJS)
	$(CC) $(LDFLAGS_COMMON) -shared -o $@ $^ -ldl -lm -lpthread

$(BUILD)/obj/engines/cuda/%.cu.o: engines/cuda/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

$(BUILD)/libengine_cuda.so: $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(CUDA_CU_SRCS)) $(patsubst %.c,$(BUILD)/obj/%.o,$(CUDA_C_SRCS)) $(COMMON_OBJS)
	$(NVCC) -shared -o $@ $^ -L$(CUDA_HOME)/lib64 -lcublas -lcublasLt -lcudart -Xlinker -rpath,$(CUDA_HOME)/lib64

$(BUILD)/tests/%: tests/%.c $(ORCH_LIB_OBJS)
	@mkdir -p $(dir $@)
	$(ORCH_CC) $(CFLAGS_COMMON) $(MPI_DEFS) $(PKG_CFLAGS) $(LDFLAGS_COMMON) -o $@ $< $(ORCH_LIB_OBJS) $(CHECK_LIBS) $(ORCH_LIBS) -rdynamic

$(BUILD)/tests/engines/%.so: tests/engines/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ENGINE_CFLAGS) $(LDFLAGS_COMMON) -shared -o $@ $<

$(BUILD)/tools/%: tools/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(LDFLAGS_COMMON) -o $@ $< -lpthread -lm

test-bins: all $(TEST_BINS) $(BROKEN_SOS)

setup:
	@tools/setup.sh

# make test: install what is missing, build, then run every suite.
test:
	@tools/setup.sh
	@$(MAKE) --no-print-directory test-bins
	@BUILD=$(BUILD) tests/run_tests.sh

# make run: the main job on the built-in default: train the default model on
# the King James Bible (prepared on first use), then generate from it.
RUN_ENGINE ?= cpu
run:
	@tools/setup.sh
	@$(MAKE) --no-print-directory all
	$(BUILD)/orch train --engine=$(RUN_ENGINE)
	$(BUILD)/orch generate --engine=$(RUN_ENGINE) --checkpoint runs/default --prompt "And God said" --max-tokens 300 --temperature 0.8 --seed 1

asan:
	@tools/setup.sh
	@$(MAKE) --no-print-directory BUILD=build/asan SAN=1 test-bins
	@BUILD=build/asan ORCH_SAN=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 tests/run_tests.sh

# ThreadSanitizer over the suites whose code runs threads: the serving
# scheduler and HTTP threads, the data prefetcher, the engines' thread pools,
# training signals and the MPI watchdog. tests/tsan.supp names the few
# third-party libraries whose internals are not ours to report.
TSAN_SUITES := test_scheduler test_data_loader test_metrics test_cpu_engine test_server_serve \
  test_server_conn_watch test_server_listener test_server_policy test_mock_engine serve_api \
  serve_load serve_cpu serve_hardening serve_slowloris train_signals \
  train_cli dist_train test_cpu_int8 quantize_cli cpu_isa_cli test_route_policy route_api \
  route_failover test_cpu_llama
TSAN_SUITES += test_cpu_lora test_cpu_ft_stream serve_files serve_lora serve_finetune
tsan:
	@tools/setup.sh
	@$(MAKE) --no-print-directory BUILD=build/tsan SAN=thread test-bins
	@BUILD=build/tsan ORCH_SAN=thread TESTS="$(TSAN_SUITES)" \
	  TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp:halt_on_error=1:second_deadlock_stack=1" \
	  tests/run_tests.sh

# Static analysis: cppcheck over every C source of the project (warnings,
# portability and performance checks; CUDA sources are C++ and left to nvcc's
# own warnings). Any finding fails the target.
ANALYZE_SRCS = $(ORCH_SRCS) $(MOCK_SRCS) $(CPU_SRCS) $(wildcard engines/common/*.c) $(TOOL_SRCS)
analyze:
	@cppcheck --quiet --error-exitcode=1 --std=c11 --enable=warning,portability,performance \
	  --inline-suppr --suppressions-list=tools/cppcheck.supp -D_GNU_SOURCE -DORCH_HAVE_MPI=1 \
	  -I. $(ANALYZE_SRCS)
	@echo "analyze: cppcheck clean ($(words $(ANALYZE_SRCS)) files)"

FORMAT_SRCS = $(shell git ls-files '*.c' '*.h' '*.cu' '*.cpp' 2>/dev/null)
format:
	@clang-format -i $(FORMAT_SRCS)
format-check:
	@clang-format --dry-run --Werror $(FORMAT_SRCS)
	@echo "format-check: $(words $(FORMAT_SRCS)) files follow .clang-format"

clean:
	rm -rf build

# ==== fuzz: libFuzzer harnesses (tests/fuzz/) ==================================
# make fuzz builds build/fuzz/fuzz_<name> from tests/fuzz/fuzz_<name>.c, linked
# with the orchestrator (minus cli/main.c) compiled by clang with ASan, UBSan
# and libFuzzer's coverage instrumentation into build/fuzz/obj (its own object
# files, never mixed with $(BUILD)). tests/fuzz/run.sh SECONDS runs them.
FUZZ_BUILD := build/fuzz
FUZZ_CC ?= clang
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS = -std=c11 $(WARN) -Wno-missing-field-initializers -O1 -g -fno-omit-frame-pointer -D_GNU_SOURCE -I. -MMD -MP \
  $(FUZZ_SAN) $(PKG_CFLAGS)
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS := $(patsubst tests/fuzz/%.c,$(FUZZ_BUILD)/%,$(FUZZ_SRCS))
FUZZ_LIB_OBJS := $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,$(filter-out orchestrator/cli/main.c,$(ORCH_SRCS)))
FUZZ_LIB := $(FUZZ_BUILD)/liborch_fuzz.a

.PHONY: fuzz
fuzz: $(FUZZ_BINS)

# The BPE merge loops spend most of their time in comparison tracing
# (-fsanitize-coverage=trace-cmp) without gaining coverage from it: off there.
FUZZ_NO_CMP := $(FUZZ_BUILD)/obj/orchestrator/data/tokenizer.o
$(FUZZ_NO_CMP): FUZZ_COV_EXTRA := -fno-sanitize-coverage=trace-cmp

$(FUZZ_LIB_OBJS): $(FUZZ_BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link $(FUZZ_COV_EXTRA) -c $< -o $@

$(FUZZ_LIB): $(FUZZ_LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(FUZZ_BINS): $(FUZZ_BUILD)/%: tests/fuzz/%.c tests/fuzz/fuzz_util.h $(FUZZ_LIB)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_LIB) $(ORCH_LIBS)

ifneq ($(BUILD),build)
-include $(shell find $(FUZZ_BUILD) -name '*.d' 2>/dev/null)
endif
# ==== end of fuzz ===============================================================

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# ==== MPI tools (tools/mpi/*.c, built with mpicc) and the Dockerfile recipe ====
# make mpi-tools builds build/tools/mpi/allreduce_bench (docs/scaling.md).
# make docker-recipe-test builds the Dockerfile in debootstrap chroots and
# smoke-tests the image (needs root and the Debian mirror; several minutes,
# so not part of make test; tools/docker_recipe_test.sh).
MPI_TOOL_BINS := $(patsubst tools/mpi/%.c,$(BUILD)/tools/mpi/%,$(wildcard tools/mpi/*.c))
.PHONY: mpi-tools docker-recipe-test
mpi-tools: $(MPI_TOOL_BINS)
$(BUILD)/tools/mpi/%: tools/mpi/%.c
	@mkdir -p $(dir $@)
	OMPI_CC=$(CC) mpicc $(CFLAGS_COMMON) -o $@ $< -lm
docker-recipe-test:
	@BUILD=$(BUILD) tools/docker_recipe_test.sh
