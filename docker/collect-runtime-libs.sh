#!/usr/bin/env bash
# Copies the shared libraries a binary needs into DIR, except those the runtime base image
# already has: the C and C++ runtimes every base image has, and the CUDA libraries (the toolkit's
# own, cuBLAS, NCCL, the driver), which the nvidia/cuda runtime image ships for the same
# CUDA_VERSION as the devel image that built the binary; copying them would add about 800 MB.
# The runtime stage of an image then needs no -dev packages and no matching apt versions.
#   collect-runtime-libs.sh BINARY DIR
set -euo pipefail
binary=$1 dir=$2
mkdir -p "$dir"
ldd "$binary" | awk '/=> \// {print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*|libnvrtc*.so*) ;;
    *)
      case "$(readlink -f "$lib")" in
        /usr/local/cuda*) ;;  # any other toolkit library: also in the runtime image
        *) cp -L "$lib" "$dir/" ;;
      esac
      ;;
  esac
done
