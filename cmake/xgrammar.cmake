# xgrammar's C++ core: the constrained-decoding library behind structured output
# (engine/sample/constraint_compiler.h; why this library: docs/ARCHITECTURE.md). It is not a
# Debian package: docker/install-xgrammar.sh builds the pinned, checksummed PyPI sdist into a
# prefix (install-deps.sh runs it), and this file imports that prefix as the target
# `xgrammar::xgrammar`. Required: structured output is part of the API.
set(ATTNRES_XGRAMMAR_VERSION 0.2.9-1)  # <version>-<patch level>, as install-xgrammar.sh names it
set(ATTNRES_XGRAMMAR_DIR "" CACHE PATH
    "xgrammar's install prefix (empty: the environment's ATTNRES_XGRAMMAR_DIR, else the default)")
# The default is not cached, so a new version or patch level reaches existing build folders.
if(ATTNRES_XGRAMMAR_DIR)
  set(attnres_xgrammar_prefix "${ATTNRES_XGRAMMAR_DIR}")
elseif(DEFINED ENV{ATTNRES_XGRAMMAR_DIR})
  set(attnres_xgrammar_prefix "$ENV{ATTNRES_XGRAMMAR_DIR}")
else()
  set(attnres_xgrammar_prefix "$ENV{HOME}/.cache/attnres-xgrammar/${ATTNRES_XGRAMMAR_VERSION}")
endif()

# Plain paths, not find_library's cached results, for the same reason.
set(XGRAMMAR_INCLUDE_DIR "${attnres_xgrammar_prefix}/include")
set(XGRAMMAR_LIBRARY "${attnres_xgrammar_prefix}/lib/libxgrammar.a")
if(NOT EXISTS "${XGRAMMAR_INCLUDE_DIR}/xgrammar/xgrammar.h" OR NOT EXISTS "${XGRAMMAR_LIBRARY}")
  message(FATAL_ERROR
    "xgrammar ${ATTNRES_XGRAMMAR_VERSION} not found in ${attnres_xgrammar_prefix}. Build it with "
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
