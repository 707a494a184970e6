# xgrammar's C++ core: the constrained-decoding library behind structured output
# (engine/sample/constraint_compiler.h; why this library: docs/ARCHITECTURE.md). It is not a
# Debian package: docker/install-xgrammar.sh builds the pinned, checksummed PyPI sdist into a
# prefix (install-deps.sh runs it), and this file imports that prefix as the target
# `xgrammar::xgrammar`. Required: structured output is part of the API.
set(ATTNRES_XGRAMMAR_VERSION 0.2.9)
if(DEFINED ENV{ATTNRES_XGRAMMAR_DIR})
  set(attnres_xgrammar_default "$ENV{ATTNRES_XGRAMMAR_DIR}")
else()
  set(attnres_xgrammar_default "$ENV{HOME}/.cache/attnres-xgrammar/${ATTNRES_XGRAMMAR_VERSION}")
endif()
set(ATTNRES_XGRAMMAR_DIR "${attnres_xgrammar_default}"
    CACHE PATH "Install prefix of xgrammar's C++ core (docker/install-xgrammar.sh)")

find_path(XGRAMMAR_INCLUDE_DIR xgrammar/xgrammar.h
          PATHS "${ATTNRES_XGRAMMAR_DIR}/include" NO_DEFAULT_PATH)
find_library(XGRAMMAR_LIBRARY NAMES libxgrammar.a xgrammar
             PATHS "${ATTNRES_XGRAMMAR_DIR}/lib" "${ATTNRES_XGRAMMAR_DIR}/lib64" NO_DEFAULT_PATH)
if(NOT XGRAMMAR_INCLUDE_DIR OR NOT XGRAMMAR_LIBRARY)
  message(FATAL_ERROR
    "xgrammar ${ATTNRES_XGRAMMAR_VERSION} not found in ${ATTNRES_XGRAMMAR_DIR}. Build it with "
    "docker/install-xgrammar.sh (docker/install-deps.sh runs it), or point "
    "-DATTNRES_XGRAMMAR_DIR / the ATTNRES_XGRAMMAR_DIR environment variable at its prefix.")
endif()
add_library(xgrammar::xgrammar STATIC IMPORTED GLOBAL)
set_target_properties(xgrammar::xgrammar PROPERTIES
  IMPORTED_LOCATION "${XGRAMMAR_LIBRARY}"
  INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${XGRAMMAR_INCLUDE_DIR}"
  INTERFACE_INCLUDE_DIRECTORIES "${XGRAMMAR_INCLUDE_DIR}"
  INTERFACE_COMPILE_DEFINITIONS "XGRAMMAR_ENABLE_CPPTRACE=0")
message(STATUS "xgrammar: ${XGRAMMAR_LIBRARY}")
