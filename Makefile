# multigrad — plain Makefile.
#   make            build the libraries, tools and tests into build/
#   make test       install missing system packages, build, run every test
#   make run        install missing system packages, build, run the main job
#   make install PREFIX=/usr/local
#   make ARCH=x86-64-v3   code for that CPU level, not this machine's (native)
#   make GPU=0      leave the CUDA backend out (built when the toolkit is found)
#   make MPI=0      leave the Open MPI backend out (built when mpicc is found)
#   make test SAN=address|thread|undefined   the suite under a sanitizer
#                                            (built into build-$(SAN)/)
#   make fuzz       the libFuzzer targets fuzz/fuzz_<name>.c (clang) into
#                   build-fuzz/fuzz/ (see fuzz/README.md); make test builds
#                   them too when clang is installed

CC      ?= gcc
PREFIX  ?= /usr/local
SAN     ?=
ARCH    ?= native
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)

ifeq ($(SAN),)
BUILD   := build
OPT     := -O3 -march=$(ARCH)
else ifeq ($(SAN),fuzz)
# The library for the fuzz targets: clang's coverage for libFuzzer, ASan
# and UBSan (any undefined behaviour is a crash the fuzzer reports).
BUILD   := build-fuzz
SANS    := address,undefined
OPT     := -O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,$(SANS) \
           -fno-sanitize-recover=undefined
else
BUILD   := build-$(SAN)
SANS    := $(SAN)
OPT     := -O1 -fno-omit-frame-pointer -fsanitize=$(SAN) -DMG_SANITIZED
ifeq ($(SAN),undefined)
OPT     += -fno-sanitize-recover=undefined
endif
endif

# Open MPI backend: built when mpicc is present (flags taken from its
# wrapper); MPI=0 leaves it out (a static program: Debian has no libmpi.a).
MPI     ?= 1
MPICC   := $(if $(filter 0,$(MPI)),,$(shell command -v mpicc 2>/dev/null))
ifneq ($(MPICC),)
MPI_CFLAGS := -DMG_HAVE_MPI $(shell mpicc --showme:compile)
MPI_LIBS   := $(shell mpicc --showme:link)
endif

# CUDA backend (issue 15): built when the CUDA toolkit is found under
# CUDA_HOME (default /usr/local/cuda); GPU=0 leaves it out. Without a
# toolkit the build is the CPU library alone. scripts/install-deps.sh does
# not install CUDA.
GPU       ?= 1
CUDA_HOME ?= /usr/local/cuda
ifneq ($(GPU),0)
ifneq ($(wildcard $(CUDA_HOME)/include/cuda_runtime.h),)
CUDA_CFLAGS := -DMG_HAVE_CUDA -isystem $(CUDA_HOME)/include
# cuBLAS is opened at the first use of a GPU (src/device/kernels.cu), not
# linked: loading it costs every process 70 ms and 200 MB.
CUDA_LIBS   := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -ldl
endif
endif

# The device kernels (src/device/kernels.cu): compiled by nvcc for the GPU
# (and the host, device kind emu) in a CUDA build; else, and under the
# sanitizers, by the host C++ compiler for emu alone.
CXX     := $(if $(filter clang,$(notdir $(CC))),clang++,g++)
ifneq ($(CUDA_CFLAGS),)
ifeq ($(SAN),)
NVCC    := $(CUDA_HOME)/bin/nvcc
endif
endif
ifneq ($(NVCC),)
KCC     := $(NVCC)
KFLAGS  := -std=c++17 --extended-lambda -O3 -g -Iinclude -Isrc $(CUDA_CFLAGS) -MMD -MP \
           -Xcompiler -fPIC,-pthread,-Wall,-Wextra,-Wno-unused-parameter \
           -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=[sm_80,compute_80]
else
KCC     := $(CXX)
KFLAGS  := -x c++ -std=c++17 -g $(OPT) -fPIC -pthread -Iinclude -Isrc -MMD -MP -fno-exceptions \
           -fno-rtti -Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers
endif

WARN    := -Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers
CFLAGS  += -std=gnu11 -g $(OPT) $(WARN) -fPIC -pthread -Iinclude -Isrc -MMD -MP \
           -fvisibility=default $(MPI_CFLAGS) $(CUDA_CFLAGS)
LDLIBS  := -lopenblas -lz -lcrypto $(MPI_LIBS) $(CUDA_LIBS) -lstdc++ -lmvec -lm -lpthread -lrt
LDFLAGS += $(if $(SANS),-fsanitize=$(SANS))

LIB_SRC   := $(sort $(shell find src -name '*.c' -o -name '*.cu'))
TOOL_SRC  := $(sort $(wildcard tools/*.c))
TEST_SRC  := $(sort $(wildcard tests/*.c))
BENCH_SRC := $(sort $(wildcard bench/*.c))
EX_SRC    := $(sort $(wildcard examples/*.c))
FUZZ_SRC  := $(sort $(wildcard fuzz/fuzz_*.c))

LIB_OBJ   := $(patsubst %.cu,$(BUILD)/obj/%.o,$(LIB_SRC:%.c=$(BUILD)/obj/%.o))
TEST_OBJ  := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)
TOOLS     := $(TOOL_SRC:tools/%.c=$(BUILD)/bin/%)
BENCHES   := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
EXAMPLES  := $(EX_SRC:examples/%.c=$(BUILD)/examples/%)
TESTBIN   := $(BUILD)/tests/mgtest
FUZZERS   := $(FUZZ_SRC:fuzz/%.c=build-fuzz/fuzz/%)
CLANG     := $(shell command -v clang 2>/dev/null)

.PHONY: all lib tools tests benches examples test run install deps clean fuzz fuzzers
# Keep the objects of tools, benches and examples (make would delete them as
# intermediate files and rebuild them every time).
.SECONDARY:
all: lib tools tests benches examples

lib: $(BUILD)/lib/libmultigrad.a $(BUILD)/lib/libmultigrad.so
tools: $(TOOLS)
tests: $(TESTBIN)
benches: $(BENCHES)
examples: $(EXAMPLES)

# V=1 shows the full commands.
Q := $(if $(V),,@)

# Objects are remade when the flags change (make GPU=0 after a CUDA build,
# another CC): the stamp holds the last build's flags.
FLAGS_STAMP := $(BUILD)/flags.stamp
$(shell mkdir -p $(BUILD) && echo '$(CC) $(CFLAGS) $(LDLIBS) $(KCC) $(KFLAGS)' | cmp -s - $(FLAGS_STAMP) || \
        echo '$(CC) $(CFLAGS) $(LDLIBS) $(KCC) $(KFLAGS)' > $(FLAGS_STAMP))

$(BUILD)/obj/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(V),,echo "  CC    $<")
	$(Q)$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	@$(if $(V),,echo "  $(if $(NVCC),NVCC,CXX)  $<")
	$(Q)$(KCC) $(KFLAGS) -c $< -o $@

# GELU's and the softmax rows' exp loops vectorise only with glibc's vector
# math (src/tensor/gelu.c, src/tensor/exp.c).
$(BUILD)/obj/src/tensor/gelu.o $(BUILD)/obj/src/tensor/exp.o: CFLAGS += -ffast-math

$(BUILD)/lib/libmultigrad.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# The shared library (installed; the build links the static one): its
# SONAME carries the version's major.minor, as the ABI may change with
# either before 1.0; it exports the public API alone (scripts/libmultigrad.map).
VERSION := $(shell sed -n 's/^\#define MG_VERSION "\(.*\)"/\1/p' include/multigrad/core.h)
SONAME  := libmultigrad.so.$(word 1,$(subst ., ,$(VERSION))).$(word 2,$(subst ., ,$(VERSION)))
$(BUILD)/lib/libmultigrad.so: $(LIB_OBJ) scripts/libmultigrad.map
	@mkdir -p $(dir $@)
	$(CC) -shared $(LDFLAGS) -Wl,-soname,$(SONAME) -Wl,--version-script,scripts/libmultigrad.map \
	    -o $@ $(LIB_OBJ) $(LDLIBS)

# Tools and tests link the static library: no LD_LIBRARY_PATH needed.
$(BUILD)/bin/%: $(BUILD)/obj/tools/%.o $(BUILD)/lib/libmultigrad.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/lib/libmultigrad.a $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(BUILD)/lib/libmultigrad.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/lib/libmultigrad.a $(LDLIBS)

$(BUILD)/examples/%: $(BUILD)/obj/examples/%.o $(BUILD)/lib/libmultigrad.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(BUILD)/lib/libmultigrad.a $(LDLIBS)

# The tests count allocations (tests/alloc_count.c).
ALLOC_WRAP := -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=posix_memalign
$(TESTBIN): $(TEST_OBJ) $(BUILD)/lib/libmultigrad.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(ALLOC_WRAP) -o $@ $(TEST_OBJ) $(BUILD)/lib/libmultigrad.a $(LDLIBS)

# The fuzz targets: the library and each target compiled by clang into
# build-fuzz/ (SAN=fuzz above), linked with libFuzzer's main.
fuzz:
ifeq ($(CLANG),)
	@echo "make fuzz: clang is not installed (scripts/install-deps.sh installs it)" >&2; exit 1
else
	@$(MAKE) --no-print-directory -j$(JOBS) SAN=fuzz CC=$(CLANG) fuzzers
endif

fuzzers: $(FUZZERS)

build-fuzz/fuzz/%: build-fuzz/obj/fuzz/%.o build-fuzz/lib/libmultigrad.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -fsanitize=fuzzer -o $@ $< build-fuzz/lib/libmultigrad.a $(LDLIBS)

deps:
	@bash scripts/install-deps.sh

# The fork-per-test runner; it ends with "N passed, N failed". The fuzz
# targets' smoke test (tests/test_fuzz.c) runs what `make fuzz` built.
test: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@$(if $(CLANG),$(MAKE) --no-print-directory fuzz,echo "make test: clang is not installed: no fuzz targets (their smoke test skips)")
	MG_BIN=$(BUILD)/bin MG_FUZZ_BIN=build-fuzz/fuzz ./$(TESTBIN) $(TESTFLAGS)

# The main job (see README).
run: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	bash scripts/main-job.sh $(BUILD)/bin

install: lib tools
	install -d $(DESTDIR)$(PREFIX)/include/multigrad $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/multigrad/*.h $(DESTDIR)$(PREFIX)/include/multigrad/
	install -m 644 $(BUILD)/lib/libmultigrad.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/lib/libmultigrad.so $(DESTDIR)$(PREFIX)/lib/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(PREFIX)/lib/libmultigrad.so
	install -m 755 $(TOOLS) $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBS@|$(LDLIBS)|' -e 's|@VERSION@|$(VERSION)|' \
	    scripts/multigrad.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/multigrad.pc

clean:
	rm -rf build build-*

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
