#!/bin/sh
# /usr/local/bin/attnres in the CPU image: runs the build of `attnres` for the best
# instruction-set level this CPU has (docker/build-cpu-variants.sh builds one per level), with
# the same arguments. Without it a portable image would run AVX2 kernels on every machine,
# at about half the prefill speed on a Zen 4 or Sapphire Rapids core.
#   ATTNRES_CPU_VARIANT=LEVEL   run that level's build (refused where this CPU lacks its flags)
#   ATTNRES_LIBEXEC_DIR, ATTNRES_CPUINFO   where the builds and the CPU's flags are read (tests)
set -eu
dir=${ATTNRES_LIBEXEC_DIR:-/usr/local/libexec/attnres}
cpuinfo=${ATTNRES_CPUINFO:-/proc/cpuinfo}

# The CPU's flags, as Linux names them (the first processor's: they are the same on all).
flags=" $(sed -n 's/^flags[[:space:]]*:[[:space:]]*//p' "$cpuinfo" 2>/dev/null | head -n 1) "

# The /proc/cpuinfo flags a level needs: the x86-64 psABI levels (GCC's -march=x86-64-vN),
# then one name per +feature (GCC's -m name, Linux's flag name where they differ). A level
# that names no x86-64 level (e.g. "native" in an image run where it is built) needs nothing.
required_flags() {
  level=$1
  march=${level%%+*}
  need=""
  case "$march" in
    x86-64-v4) need="avx512f avx512bw avx512cd avx512dq avx512vl" ;;
  esac
  case "$march" in
    x86-64-v3|x86-64-v4) need="$need avx avx2 bmi1 bmi2 f16c fma abm movbe xsave" ;;
  esac
  case "$march" in
    x86-64-v2|x86-64-v3|x86-64-v4) need="$need cx16 lahf_lm popcnt pni sse4_1 sse4_2 ssse3" ;;
  esac
  rest=${level#"$march"}
  while [ -n "$rest" ]; do
    rest=${rest#+}
    feature=${rest%%+*}
    rest=${rest#"$feature"}
    case "$feature" in
      avx512bf16) need="$need avx512_bf16" ;;
      avx512vnni) need="$need avx512_vnni" ;;
      avx512fp16) need="$need avx512_fp16" ;;
      avx512vbmi2) need="$need avx512_vbmi2" ;;
      avxvnni) need="$need avx_vnni" ;;
      *) need="$need $feature" ;;
    esac
  done
  echo "$need"
}

# The flags of `level` this CPU lacks (empty: it can run that build).
missing_flags() {
  missing=""
  for flag in $(required_flags "$1"); do
    case "$flags" in
      *" $flag "*) ;;
      *) missing="$missing $flag" ;;
    esac
  done
  echo "${missing# }"
}

if [ ! -r "$dir/variants" ]; then
  echo "attnres: no builds listed in $dir/variants (docker/build-cpu-variants.sh writes it)" >&2
  exit 127
fi
levels=$(cat "$dir/variants")

if [ -n "${ATTNRES_CPU_VARIANT:-}" ]; then
  chosen=$ATTNRES_CPU_VARIANT
  case " $(echo $levels) " in
    *" $chosen "*) ;;
    *) echo "attnres: ATTNRES_CPU_VARIANT=$chosen: this image has builds for: $(echo $levels)" >&2
       exit 2 ;;
  esac
  lacking=$(missing_flags "$chosen")
  if [ -n "$lacking" ]; then
    echo "attnres: ATTNRES_CPU_VARIANT=$chosen needs CPU flags this machine lacks: $lacking" >&2
    exit 2
  fi
else
  chosen=""
  for level in $levels; do
    if [ -z "$(missing_flags "$level")" ]; then
      chosen=$level
      break
    fi
  done
  if [ -z "$chosen" ]; then
    fallback=$(echo "$levels" | tail -n 1)
    echo "attnres: this CPU cannot run any build in this image; the most portable" \
         "($fallback) needs: $(missing_flags "$fallback")." \
         "Build the image for it: --build-arg ATTNRES_CPU_VARIANTS=x86-64" >&2
    exit 2
  fi
fi
exec "$dir/attnres-$chosen" "$@"
