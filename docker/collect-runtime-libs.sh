#!/usr/bin/env bash
# Copies the shared libraries a binary needs, except those every base image has (libc,
# libstdc++, the CUDA driver), into DIR: the runtime stage of an image then needs no -dev
# packages and no matching apt versions.  Usage: collect-runtime-libs.sh BINARY DIR
set -euo pipefail
binary=$1 dir=$2
mkdir -p "$dir"
ldd "$binary" | awk '/=> \// {print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*|libcuda.so*) ;;
    *) cp -L "$lib" "$dir/" ;;
  esac
done
