# Imported targets for the dependencies of Monarch that ship no CMake package
# of their own (UCX and libpmem ship pkg-config files). Included by the build
# and, installed next to monarchConfig.cmake, by find_package(monarch), so the
# exported targets name the same imported targets in both.
include_guard(GLOBAL)
find_package(PkgConfig REQUIRED)
if(NOT TARGET PkgConfig::MONARCH_UCX)
  pkg_check_modules(MONARCH_UCX REQUIRED IMPORTED_TARGET ucx)
endif()
if(NOT TARGET PkgConfig::MONARCH_PMEM)
  pkg_check_modules(MONARCH_PMEM REQUIRED IMPORTED_TARGET libpmem)
endif()
