# Imported targets for the dependencies of Monarch that ship no CMake package
# of their own (libpmem ships a pkg-config file). Included by the build and,
# installed next to monarchConfig.cmake, by find_package(monarch), so the
# exported targets name the same imported targets in both. UCX is not among
# them: the peer tier opens it at run time (src/remote/ucx_loader.h), so
# nothing that links monarch::monarch links UCX.
include_guard(GLOBAL)
find_package(PkgConfig REQUIRED)
if(NOT TARGET PkgConfig::MONARCH_PMEM)
  pkg_check_modules(MONARCH_PMEM REQUIRED IMPORTED_TARGET libpmem)
endif()
