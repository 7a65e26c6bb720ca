# petrel — one Makefile (see DESIGN.md "Build").
#   make              CPU build: build/petrel, build/libpetrel.a
#   make CUDA=1       adds the CUDA backend (nvcc, sm_90a)
#   make check        builds and runs every test; ends with "N passed, N failed"
#   make asan         the suite under AddressSanitizer + UBSan (build-asan/)
#   make fuzz         libFuzzer targets (clang), each run FUZZ_SECONDS
#   make gpu-bundle   build/gpu-bundle/: CUDA binaries + Debian libraries via RPATH
#   make demo         generates text with the bundled demo model
#   make bench        runs the benchmark harness (bench/run.sh)
#   make format       clang-format over src/ tests/ include/

BUILD    ?= build
CC       ?= cc
NVCC     ?= $(if $(shell command -v nvcc 2>/dev/null),nvcc,/usr/local/cuda/bin/nvcc)
CUDA     ?= 0
SAN      ?=
OPT      ?= -O2
PKGS     := libcjson libpcre2-8 libutf8proc libmicrohttpd
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
ifeq ($(strip $(PKG_LIBS)),)
PKG_LIBS := -lcjson -lpcre2-8 -lutf8proc -lmicrohttpd
endif

CFLAGS   := -std=c11 $(OPT) -g -Wall -Wextra -Werror -D_GNU_SOURCE -Iinclude -Isrc \
            -pthread -fno-strict-aliasing $(PKG_CFLAGS) $(SAN) $(EXTRA_CFLAGS)
LDFLAGS  := -pthread $(SAN) $(EXTRA_LDFLAGS)
LDLIBS   := $(PKG_LIBS) -lm -ldl

# ISA-specific translation units (runtime dispatch picks among them).
AVX2_FLAGS   := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16
AMX_FLAGS    := $(AVX512_FLAGS) -mamx-tile -mamx-int8 -mamx-bf16

SRC      := $(shell find src -name '*.c' | LC_ALL=C sort)
CLI_SRC  := $(filter src/cli/%,$(SRC))
LIB_SRC  := $(filter-out src/cli/%,$(SRC))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
CU_SRC   := $(shell find src -name '*.cu' | LC_ALL=C sort)

ifeq ($(CUDA),1)
CUDA_HOME ?= /usr/local/cuda
NVCCFLAGS ?= -gencode=arch=compute_90a,code=sm_90a
CU_OBJ   := $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
CFLAGS   += -DPT_HAVE_CUDA=1 -I$(CUDA_HOME)/include
# cudart is linked statically (no runtime-version dependency); cuBLAS comes
# from the machine's CUDA. RPATH (not RUNPATH: --disable-new-dtags) so the
# GPU bundle's lib/ also serves the bundled libraries' own dependencies.
# --no-as-needed: every library named is recorded, so the bundle carries them
# all whatever code paths link today.
LDFLAGS  += -Wl,--no-as-needed -Wl,--disable-new-dtags -Wl,-rpath,'$$ORIGIN/lib' -Wl,-rpath,'$$ORIGIN/../lib' \
            -Wl,-rpath,$(CUDA_HOME)/lib64
LDLIBS   += -L$(CUDA_HOME)/lib64 -lcublas -lcudart_static -lrt -lstdc++
# CUDA op tests and benchmarks (tests/cuda/{test,bench}_*.c): built only with CUDA=1, shipped in the
# GPU bundle and run there by `make check-cuda`. They link the library as one shared object
# (libpetrel_cuda.so: the CUDA objects and the library's C sources compiled once more,
# position-independent, into $(BUILD)/pic/), so a bundle carries the kernels once instead of once
# per binary; petrel and libpetrel.a are built from the usual objects, as without it.
CUDA_TEST_BIN := $(patsubst tests/cuda/%.c,$(BUILD)/tests/cuda/%,$(wildcard tests/cuda/test_*.c tests/cuda/bench_*.c))
CUDA_SO  := $(BUILD)/libpetrel_cuda.so
LIB_PIC_OBJ := $(LIB_SRC:%.c=$(BUILD)/pic/%.o)
# Those that call the CUDA runtime themselves link libpetrel.a instead: the runtime inside the
# shared object (cudart_static) is hidden, so they would run with a second, separate runtime.
CUDA_RT_RE  := (^|[^A-Za-z0-9_])cuda[A-Z][A-Za-z0-9]*[[:space:]]*[(]
CUDA_RT_BIN := $(patsubst tests/cuda/%.c,$(BUILD)/tests/cuda/%,$(shell grep -lE '$(CUDA_RT_RE)' \
  tests/cuda/test_*.c tests/cuda/bench_*.c))
else
CU_OBJ   :=
CUDA_TEST_BIN :=
CUDA_SO  :=
CUDA_RT_BIN :=
LIB_PIC_OBJ :=
endif
PIC := -fPIC -fno-semantic-interposition

TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_SUPPORT := $(filter-out tests/test_%.c,$(wildcard tests/*.c))
TEST_SUPPORT_OBJ := $(TEST_SUPPORT:%.c=$(BUILD)/obj/%.o)
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))

# The C objects are rebuilt when the compile flags change (CUDA=1, SAN, OPT, EXTRA_CFLAGS, ...): a
# stamp in the build folder holds the flags and is rewritten only when they differ.
FLAGS_STAMP := $(BUILD)/.cflags
$(shell mkdir -p $(BUILD) && { printf '%s\n' '$(CFLAGS)' | cmp -s - $(FLAGS_STAMP) || \
  printf '%s\n' '$(CFLAGS)' > $(FLAGS_STAMP); })

.SECONDARY: $(TEST_SUPPORT_OBJ)
.PHONY: all check check-cuda asan fuzz gpu-bundle demo bench format clean deps tests
all: $(BUILD)/petrel $(BUILD)/libpetrel.a $(CUDA_SO) $(CUDA_TEST_BIN)

deps:
	@tools/install-deps.sh

$(BUILD)/libpetrel.a: $(LIB_OBJ) $(CU_OBJ)
	@mkdir -p $(dir $@)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libpetrel_cuda.so: $(LIB_PIC_OBJ) $(CU_OBJ)
	$(CC) -shared -Wl,-soname,libpetrel_cuda.so $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/petrel: $(CLI_OBJ) $(BUILD)/libpetrel.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libpetrel.a $(LDLIBS)

# A translation unit's ISA flags from its name (in either object folder)
%_avx2.o: ISA_FLAGS = $(AVX2_FLAGS)
%_avx512.o: ISA_FLAGS = $(AVX512_FLAGS)
%_amx.o: ISA_FLAGS = $(AMX_FLAGS)
$(BUILD)/obj/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ISA_FLAGS) -MMD -MP -c -o $@ $<
$(BUILD)/pic/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PIC) $(ISA_FLAGS) -MMD -MP -c -o $@ $<
$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -O3 -std=c++17 -Iinclude -Isrc -Xcompiler -fPIC -MMD -MP -c -o $@ $<

$(BUILD)/tests/%: tests/%.c $(TEST_SUPPORT_OBJ) $(BUILD)/libpetrel.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(TEST_SUPPORT_OBJ) $(BUILD)/libpetrel.a $(LDFLAGS) $(LDLIBS)

# (RPATH $ORIGIN/../lib finds the library in a bundle, $ORIGIN/../.. in the build tree)
$(BUILD)/tests/cuda/%: tests/cuda/%.c $(TEST_SUPPORT_OBJ) $(CUDA_SO)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(TEST_SUPPORT_OBJ) -L$(BUILD) -lpetrel_cuda $(LDFLAGS) \
	  -Wl,-rpath,'$$ORIGIN/../..' $(LDLIBS)

$(CUDA_RT_BIN): $(BUILD)/tests/cuda/%: tests/cuda/%.c $(TEST_SUPPORT_OBJ) $(BUILD)/libpetrel.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(TEST_SUPPORT_OBJ) $(BUILD)/libpetrel.a $(LDFLAGS) $(LDLIBS)

$(BUILD)/examples/%: examples/%.c $(BUILD)/libpetrel.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libpetrel.a $(LDFLAGS) $(LDLIBS)

tests: all $(TEST_BIN) $(EXAMPLES)

check: deps
	@$(MAKE) --no-print-directory tests
	@BUILD=$(BUILD) tests/run.sh

check-cuda:
	@tests/run-cuda.sh

asan:
	@$(MAKE) --no-print-directory check BUILD=build-asan OPT=-O1 \
	  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"

FUZZ_SECONDS ?= 20
fuzz: deps
	@tools/fuzz.sh $(FUZZ_SECONDS)

gpu-bundle: deps
	@tools/gpu-bundle.sh

demo: deps
	@$(MAKE) --no-print-directory all
	@tools/demo.sh

bench: all
	@bench/run.sh

format:
	clang-format -i $$(find src tests include examples fuzz -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh')

clean:
	rm -rf build build-asan build-fuzz build-cuda

-include $(shell find $(BUILD)/obj $(BUILD)/pic -name '*.d' 2>/dev/null)
