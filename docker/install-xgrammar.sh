#!/usr/bin/env bash
# Builds and installs xgrammar's C++ core, the constrained-decoding library the engine links
# (docs/ARCHITECTURE.md, structured output). The source is PyPI's sdist of xgrammar, pinned and
# checksummed (PyPI is the one source registry our machines reach). It is fetched with curl
# from PyPI's file host: `pip download` of it would build apache-tvm-ffi from source first.
# Only the static C++ library is built (no Python bindings, no tests), without LTO so that
# both GCC and Clang (the fuzzers, tests/fuzz) can link it. One fix is applied to the source
# (see `patch` below); the install prefix names it (<version>-<patch level>).
#   docker/install-xgrammar.sh     # prints the prefix; re-running once installed is a no-op
# Env: ATTNRES_XGRAMMAR_DIR (the install prefix; default ~/.cache/attnres-xgrammar/<version>-<patch>,
# the same default CMakeLists.txt looks in), JOBS (default: all cores).
set -euo pipefail
version=0.2.9
sha256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90  # of that sdist
url=https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-$version.tar.gz
patch_level=1  # raise when the fix below changes: a new prefix, so caches rebuild
prefix=${ATTNRES_XGRAMMAR_DIR:-$HOME/.cache/attnres-xgrammar/$version-$patch_level}
jobs=${JOBS:-$(nproc)}

if [ -f "$prefix/lib/libxgrammar.a" ] && [ -f "$prefix/include/xgrammar/xgrammar.h" ]; then
  echo "xgrammar $version: $prefix"
  exit 0
fi

work=$prefix.build
mkdir -p "$work"
tarball=$work/xgrammar-$version.tar.gz
if [ ! -f "$tarball" ] || ! echo "$sha256  $tarball" | sha256sum -c --quiet 2>/dev/null; then
  curl -fsSL --retry 3 -o "$tarball.part" "$url"
  mv "$tarball.part" "$tarball"
fi
echo "$sha256  $tarball" | sha256sum -c --quiet
src=$work/xgrammar-$version
if [ ! -f "$src/CMakeLists.txt" ]; then
  tar xzf "$tarball" -C "$work"
  # The fix: a JSON-schema string with minLength / maxLength is generated from a character
  # class that excludes only '"', '\\', CR and LF, so other control characters (invalid in
  # JSON strings) could be sampled. Exclude 0x00-0x1f, as xgrammar's unbounded strings do.
  converter=$src/cpp/json_schema_converter.cc
  bounded="builder_.AddCharacterClass({{'\"', '\"'}, {'\\\\', '\\\\'}, {'\\r', '\\r'}, {'\\n', '\\n'}}, true);"
  fixed="builder_.AddCharacterClass({{0, 0x1f}, {'\"', '\"'}, {'\\\\', '\\\\'}}, true);"
  [ "$(grep -cF "$bounded" "$converter")" = 1 ] || { echo "xgrammar patch: source changed" >&2; exit 1; }
  content=$(cat "$converter")
  printf '%s\n' "${content/"$bounded"/"$fixed"}" >"$converter"
  grep -qF "$fixed" "$converter"
fi

# xgrammar's CMakeLists reads config.cmake from the build dir first; its own cmake/config.cmake
# would turn the Python bindings on regardless of -D options.
build=$work/build
mkdir -p "$build"
cat >"$build/config.cmake" <<'CONFIG'
set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)
set(XGRAMMAR_BUILD_CXX_TESTS OFF)
set(XGRAMMAR_ENABLE_CPPTRACE OFF)
set(XGRAMMAR_ENABLE_INTERNAL_CHECK OFF)
set(XGRAMMAR_ENABLE_COVERAGE OFF)
CONFIG
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$src" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS=-fno-lto -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null
cmake --build "$build" -j "$jobs"
cmake --install "$build" >/dev/null
rm -rf "$work"
echo "xgrammar $version: $prefix"
