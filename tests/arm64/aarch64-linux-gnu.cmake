# SPDX-License-Identifier: MIT
# Cross-compiling lockstep for arm64 (aarch64) on an x86-64 Debian/Ubuntu host, with the
# distribution's cross compiler (gcc-aarch64-linux-gnu) and its multiarch arm64 libraries
# (libjansson-dev:arm64 ...: bash deploy/install-deps.sh --tests installs them). Open MPI's arm64
# packages cannot be installed next to the host's (their libmunge2, libevent-dev and openmpi-bin
# are not Multi-Arch: same), so tests/arm64/mpi_prefix.sh unpacks them into a directory of their
# own, LKS_ARM64_MPI_PREFIX. Executables run under qemu-user (the emulator below), which also
# looks up the absolute paths the arm64 programs open first under that directory
# (QEMU_LD_PREFIX, part of the emulator command below), so Open MPI finds its components.
#
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=tests/arm64/aarch64-linux-gnu.cmake \
#         -DLKS_ARM64_MPI_PREFIX=$PWD/build-arm64-mpi
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Tests and other programs run under qemu-user. Its "max" CPU has every feature qemu emulates
# (NEON, BF16, ...), so the best kernels are the ones chosen at run time; LKS_SIMD=scalar runs
# the portable ones, -DLKS_ARM64_QEMU_CPU=cortex-a72 a CPU without BF16.
set(LKS_ARM64_QEMU_CPU max CACHE STRING "the CPU qemu-aarch64 emulates for the tests")
set(LKS_ARM64_MPI_PREFIX "" CACHE PATH "the arm64 Open MPI unpacked by tests/arm64/mpi_prefix.sh")
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES LKS_ARM64_MPI_PREFIX LKS_ARM64_QEMU_CPU)
# Open MPI's single-copy transfers between ranks (process_vm_readv) are not emulated by qemu-user
# (ENOSYS): ranks copy through shared memory instead.
set(CMAKE_CROSSCOMPILING_EMULATOR /usr/bin/env;QEMU_LD_PREFIX=${LKS_ARM64_MPI_PREFIX};OMPI_MCA_btl_vader_single_copy_mechanism=none;qemu-aarch64;-cpu;${LKS_ARM64_QEMU_CPU})

# Programs (protoc-c, python3, mpirun) are the host's; libraries and headers the target's.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_FIND_ROOT_PATH / ${LKS_ARM64_MPI_PREFIX})
# pkg-config reads the arm64 .pc files only.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# Open MPI from the unpacked prefix, without its compiler wrapper (an arm64 program).
if(LKS_ARM64_MPI_PREFIX)
  set(_mpi_lib ${LKS_ARM64_MPI_PREFIX}/usr/lib/aarch64-linux-gnu)
  set(MPI_C_COMPILER "" CACHE FILEPATH "" FORCE)
  set(MPI_SKIP_COMPILER_WRAPPER ON CACHE BOOL "")
  set(MPI_C_HEADER_DIR ${_mpi_lib}/openmpi/include CACHE PATH "")
  set(MPI_C_LIB_NAMES mpi CACHE STRING "")
  set(MPI_mpi_LIBRARY ${_mpi_lib}/openmpi/lib/libmpi.so CACHE FILEPATH "")
  # libmpi's own dependencies (libopen-rte, libhwloc, ...) are found at link time here.
  set(CMAKE_EXE_LINKER_FLAGS_INIT
      "-Wl,-rpath-link,${_mpi_lib}:${_mpi_lib}/openmpi/lib")
  set(CMAKE_SHARED_LINKER_FLAGS_INIT "${CMAKE_EXE_LINKER_FLAGS_INIT}")
endif()
# The host's mpirun (x86-64, the same Open MPI 4.1.4) starts the ranks; each runs under qemu
# (tests/CMakeLists.txt puts LKS_TARGET_EMULATOR before the program).
find_program(MPIEXEC_EXECUTABLE NAMES mpiexec mpirun PATHS /usr/bin NO_DEFAULT_PATH)
# The host's CUDA toolkit (if any) is x86-64's: no cuda backend in the cross build. A native
# arm64 build (a GB10 with DGX OS's CUDA) finds its own nvcc and builds for sm_121 as on x86-64.
set(LKS_CUDA OFF CACHE BOOL "build the cuda backend (not in the arm64 cross build)")
