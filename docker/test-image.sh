#!/usr/bin/env bash
# Builds the images of docker/ without a Docker engine or an image registry, and serves from the
# CPU image. Debian's own packages stand in for both: debootstrap makes debian:bookworm-slim
# from Debian's archive, buildah builds the Dockerfiles as `docker build` does (the same build
# context and .dockerignore, Docker's image format, the default build args, cached stages), and
# the built image's root filesystem runs with chroot in a network namespace of its own, because
# running a container with podman needs cgroups and rlimits that sandboxes and CI machines
# often refuse.
#
#   docker/test-image.sh [STEP...]     as root, with: apt-get install debootstrap podman buildah
# Steps (default: all of them, in this order):
#   base     debian:bookworm-slim in local storage, from Debian's archive, where none is present
#   context  the build context buildah sends: its size, and no build tree or .venv in it
#   cpu      build docker/Dockerfile.cpu as attnres-serve:cpu; its size, gzip-compressed too
#   serve    run attnres-serve:cpu's entrypoint as its user, with its environment, on its ports,
#            read-only; check /health, the image's HEALTHCHECK and compose.yaml's, a completion
#            through the official `openai` client, a gRPC health check through the image's
#            attnres-client, the build the launcher chose for this CPU, SIGTERM's exit 0, and
#            that each ATTNRES_CPU_VARIANT this CPU can run generates
#   cuda     build Dockerfile.cuda's build stage on a stand-in for nvidia/cuda:*-devel: this
#            Debian with the host's CUDA toolkit (/usr/local/cuda) copied in; check that the
#            CUDA backend was built and which libraries were collected for the runtime stage
# Environment: ATTNRES_TEST_IMAGE_WORK (scratch folder, default /var/tmp/attnres-test-image),
# ATTNRES_TEST_PYTHON (a Python with the openai and yaml packages; default .venv/bin/python,
# else python3).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${ATTNRES_TEST_IMAGE_WORK:-/var/tmp/attnres-test-image}
base_image=docker.io/library/debian:bookworm-slim
cpu_image=localhost/attnres-serve:cpu
cuda_build_image=localhost/attnres-serve:cuda-build
mkdir -p "$work"

say() { printf '\n== %s\n' "$*"; }
fail() { echo "FAILED: $*" >&2; exit 1; }
for tool in podman buildah; do
  command -v "$tool" >/dev/null || fail "$tool not found (apt-get install podman buildah)"
done
[ "$(id -u)" -eq 0 ] || fail "run as root: debootstrap, buildah's chroot builds and chroot need it"

# `buildah bud` as `docker build` runs it: the repository as the context (with .dockerignore),
# Docker's image format (which has HEALTHCHECK), stages cached between builds; base images from
# local storage only.
# The host's CA bundle goes in as CURL_CA_BUNDLE (mounted read-only for RUN steps, never into
# an image), so install-xgrammar.sh's download from PyPI works where the host trusts a
# TLS-intercepting proxy that a fresh image would not; elsewhere the host's store only adds to
# the image's.
host_ca=/etc/ssl/certs/ca-certificates.crt
bud() {
  local ca=()
  [ -f "$host_ca" ] && ca=(--volume "$host_ca:/run/host-ca.crt:ro"
                           --build-arg CURL_CA_BUNDLE=/run/host-ca.crt)
  buildah bud --isolation chroot --format docker --layers --pull=never "${ca[@]}" "$@" "$repo"
}

mib() { echo "$(( ($1 + 1048575) / 1048576 )) MiB"; }

step_base() {
  say "base image $base_image"
  if podman image exists "$base_image"; then
    echo "present: $(podman image inspect --format '{{.Id}}' "$base_image" | cut -c1-12)"
    return
  fi
  command -v debootstrap >/dev/null || fail "debootstrap not found (apt-get install debootstrap)"
  local root=$work/bookworm-slim
  rm -rf "$root"
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian
  # What makes the official image "slim" (debuerreotype's --slimify) and its apt settings.
  cat > "$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/man/*
EOF
  find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  rm -rf "$root"/usr/share/{groff,info,linda,lintian,man}/*
  cat > "$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' > "$root/etc/apt/apt.conf.d/docker-no-languages"
  echo 'APT::AutoRemove::SuggestsImportant "false";' \
    > "$root/etc/apt/apt.conf.d/docker-autoremove-suggests"
  rm -f "$root/etc/apt/sources.list"
  cat > "$root/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/* "$root"/tmp/*
  echo "debian" > "$root/etc/hostname"
  tar -C "$root" --numeric-owner -c . | podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' - "$base_image"
  rm -rf "$root"
  echo "imported: $(mib "$(podman image inspect --format '{{.Size}}' "$base_image")")"
}

step_context() {
  say "build context"
  local file=$work/context.Dockerfile tag=localhost/attnres-build-context:latest
  printf 'FROM %s\nCOPY . /src\n' "$base_image" > "$file"
  bud -q -f "$file" -t "$tag" >/dev/null
  local ctr mnt
  ctr=$(buildah from "$tag")
  mnt=$(buildah mount "$ctr")
  echo "context: $(du -sh "$mnt/src" | cut -f1), $(find "$mnt/src" -type f | wc -l) files"
  local leaked
  leaked=$(cd "$mnt/src" && find . \( -name CMakeCache.txt -o -name CMakeFiles \
                                     -o -name __pycache__ -o -path ./.venv -o -path ./.git \
                                     -o -path ./build -o -path './build-*' \) -print | head)
  buildah umount "$ctr" >/dev/null
  buildah rm "$ctr" >/dev/null
  buildah rmi "$tag" >/dev/null
  [ -z "$leaked" ] || fail "in the build context: $leaked"
}

# The image's size as a registry stores it: the layers gzip-compressed.
compressed_size() {
  local dir=$work/oci-$$
  rm -rf "$dir"
  buildah push -q --compression-format gzip "$1" "oci:$dir:x" >/dev/null
  local bytes
  bytes=$(python3 -c 'import json, sys
index = json.load(open(f"{sys.argv[1]}/index.json"))
digest = index["manifests"][0]["digest"].split(":")[1]
manifest = json.load(open(f"{sys.argv[1]}/blobs/sha256/{digest}"))
print(sum(layer["size"] for layer in manifest["layers"]))' "$dir")
  rm -rf "$dir"
  echo "$bytes"
}

report_size() {
  local size compressed
  size=$(podman image inspect --format '{{.Size}}' "$1")
  compressed=$(compressed_size "$1")
  echo "$1: $(mib "$size") ($(mib "$compressed") compressed)"
}

step_cpu() {
  say "build docker/Dockerfile.cpu"
  local start=$SECONDS
  bud -f docker/Dockerfile.cpu -t "$cpu_image"
  echo "built in $((SECONDS - start)) s"
  report_size "$cpu_image"
  local ctr mnt
  ctr=$(buildah from "$cpu_image")
  mnt=$(buildah mount "$ctr")
  echo "largest parts:"
  (cd "$mnt" && du -sk usr/local/libexec/attnres/* usr/local/lib/attnres usr/local/bin/* \
     usr/lib/x86_64-linux-gnu/openmpi usr/lib/x86_64-linux-gnu usr/share usr/bin 2>/dev/null \
     | sort -rn | head -12 | awk '{printf "  %6d KiB  /%s\n", $1, $2}')
  buildah umount "$ctr" >/dev/null
  buildah rm "$ctr" >/dev/null
}

# The CPU image's filesystem as a container sees it: read-only (as under Kubernetes'
# readOnlyRootFilesystem), with /proc, /dev and a /tmp, and a network namespace of its own, so
# the server listens on the image's own ports (0.0.0.0:8000 and :50051) reachable from nothing
# outside it. The checks run in that namespace too.
root=""
netns_pid=""
server_pid=""
mounts=()
unmount_all() {
  local i
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
    server_pid=""
  fi
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "${mounts[$i]}" 2>/dev/null || true; done
  mounts=()
  if [ -n "$root" ]; then podman image unmount "$cpu_image" >/dev/null 2>&1 || true; fi
  if [ -n "$netns_pid" ]; then kill "$netns_pid" 2>/dev/null || true; netns_pid=""; fi
}
enter_container() {
  local image_mnt
  image_mnt=$(podman image mount "$cpu_image")
  root=$work/cpu-root
  mkdir -p "$root"
  mount --bind "$image_mnt" "$root" && mounts+=("$root")
  mount -o remount,bind,ro "$root"
  mount -t proc proc "$root/proc" && mounts+=("$root/proc")
  mount --bind /dev "$root/dev" && mounts+=("$root/dev")
  mount -t tmpfs tmpfs "$root/tmp" && mounts+=("$root/tmp")
  unshare --net sleep infinity &
  netns_pid=$!
  sleep 0.2
  in_netns ip link set lo up
  set_image_prefix
}
in_netns() { nsenter --net="/proc/$netns_pid/ns/net" "$@"; }

# The command words that run COMMAND... in the container as the image's user, with the image's
# environment (NAME=VALUE words before COMMAND add to it); each execs the next, so a command
# started in the background with them has their process id.
image_prefix=()
set_image_prefix() {
  local user uid gid
  user=$(podman image inspect --format '{{.Config.User}}' "$cpu_image")
  uid=$(awk -F: -v u="$user" '$1 == u {print $3}' "$root/etc/passwd")
  gid=$(awk -F: -v u="$user" '$1 == u {print $4}' "$root/etc/passwd")
  if [ -z "$uid" ] || [ "$uid" -eq 0 ]; then fail "image user '$user' is not a non-root user"; fi
  local env=()
  mapfile -t env < <(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' \
                       "$cpu_image" | sed '/^$/d')
  image_prefix=(nsenter --net="/proc/$netns_pid/ns/net" chroot --userspec="$uid:$gid" "$root"
                /usr/bin/env -i HOME=/nonexistent "${env[@]}")
}
in_image() { "${image_prefix[@]}" "$@"; }

image_env() {
  podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$cpu_image" \
    | sed -n "s/^$1=//p"
}

step_serve() {
  say "serve from attnres-serve:cpu"
  podman image exists "$cpu_image" || fail "$cpu_image not built (step cpu)"
  local python=${ATTNRES_TEST_PYTHON:-}
  if [ -z "$python" ]; then
    python=python3
    if [ -x "$repo/.venv/bin/python" ]; then python=$repo/.venv/bin/python; fi
  fi
  "$python" -c 'import openai, yaml' || fail "$python lacks the openai or yaml package"
  trap 'unmount_all' EXIT
  enter_container

  local entrypoint http grpc log=$work/serve.log
  entrypoint=$(podman image inspect --format '{{range .Config.Entrypoint}}{{.}} {{end}}' \
                 "$cpu_image")
  http=$(image_env ATTNRES_PORT)
  grpc=$(image_env ATTNRES_GRPC_PORT)
  echo "entrypoint: ${entrypoint}as $(podman image inspect --format '{{.Config.User}}' \
    "$cpu_image"), ports $(podman image inspect \
    --format '{{range $p, $v := .Config.ExposedPorts}}{{$p}} {{end}}' "$cpu_image")"
  # shellcheck disable=SC2086  # the entrypoint's words
  "${image_prefix[@]}" $entrypoint > "$log" 2>&1 &
  server_pid=$!
  local pid=$server_pid
  local base=http://127.0.0.1:$http status="" before=""
  for _ in $(seq 1 600); do
    kill -0 "$pid" 2>/dev/null || { cat "$log"; fail "the server exited"; }
    status=$(in_netns curl -s -o /dev/null -w '%{http_code}' "$base/health" || true)
    [ "$status" = 200 ] && break
    before="$before $status"
    sleep 0.5
  done
  [ "$status" = 200 ] || { cat "$log"; fail "/health never answered 200"; }
  # 000: no connection (nothing listens while the model loads, as the probes' comments say).
  echo "GET /health on the image's port $http: 200 (before it:$(echo "$before" \
    | tr ' ' '\n' | sed '/^$/d' | sort | uniq -c | awk '{printf " %s x %s", $1, $2}'))"

  # The image's HEALTHCHECK and compose.yaml's, run in the container as Docker runs them.
  local check
  check=$(podman image inspect --format '{{range .HealthCheck.Test}}{{println .}}{{end}}' \
            "$cpu_image" | sed '/^$/d')
  [ "$(echo "$check" | head -n 1)" = CMD-SHELL ] || fail "no HEALTHCHECK in the image: $check"
  in_image /bin/sh -c "$(echo "$check" | tail -n +2)" >/dev/null || fail "the image's HEALTHCHECK"
  echo "HEALTHCHECK: passes"
  local compose_check
  compose_check=$("$python" -c 'import sys, yaml
test = yaml.safe_load(open(sys.argv[1]))["services"]["attnres"]["healthcheck"]["test"]
assert test[0] == "CMD-SHELL" and len(test) == 2, test
print(test[1].replace("$$", "$"))' "$repo/docker/compose.yaml")
  in_image /bin/sh -c "$compose_check" >/dev/null || fail "compose.yaml's healthcheck"
  echo "compose.yaml healthcheck: passes"

  # The process that serves: the launcher exec'd the build it chose, as the image's user.
  local exe uid_line
  exe=$(readlink "/proc/$pid/exe")
  uid_line=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")
  echo "serving process: ${exe#"$root"} (uid $uid_line)"
  [ "$uid_line" != 0 ] || fail "the server runs as root"
  local want=x86-64-v3
  if grep -qw avx512_bf16 /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo &&
     grep -qw avx512vl /proc/cpuinfo; then
    want="x86-64-v4+avx512bf16"
  fi
  [ "${exe##*/}" = "attnres-$want" ] || fail "the launcher chose ${exe##*/}, not attnres-$want"
  echo "the launcher's choice on this CPU: $want"

  in_netns "$python" - "$base/v1" <<'EOF' || fail "the openai client's completion"
import sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1], api_key="unused")
model = client.models.list().data[0].id
r = client.completions.create(model=model, prompt="Hello, my name is", max_tokens=8,
                              temperature=0)
assert r.choices[0].finish_reason in ("length", "stop"), r
assert r.usage.completion_tokens >= 1 and r.choices[0].text, r
print(f"openai completion from {model}: {r.choices[0].text!r} "
      f"({r.usage.completion_tokens} tokens, {r.choices[0].finish_reason})")
EOF
  in_image /usr/local/bin/attnres-client health --target "127.0.0.1:$grpc" \
    || fail "attnres-client health"
  echo "attnres-client health on the image's port $grpc: exit 0 (SERVING)"

  kill -TERM "$pid"
  local rc=0
  wait "$pid" || rc=$?
  server_pid=""
  [ "$rc" -eq 0 ] || { cat "$log"; fail "the server exited $rc on SIGTERM"; }
  echo "SIGTERM: exit 0"

  # Each build the image has, chosen by name, generates where this CPU has its flags.
  local level out
  while read -r level; do
    rc=0
    out=$(in_image ATTNRES_CPU_VARIANT="$level" /usr/local/bin/attnres generate \
            --prompt "Hello" --max-tokens 4 --temperature 0 --json 2>&1) || rc=$?
    if [ "$rc" -eq 0 ]; then
      echo "ATTNRES_CPU_VARIANT=$level: generated $(printf '%s' "$out" | tail -n 1 \
        | python3 -c 'import json, sys
r = json.load(sys.stdin)
print(r["token_ids"], repr(r["text"]))')"
    elif printf '%s' "$out" | grep -q "needs CPU flags this machine lacks"; then
      echo "ATTNRES_CPU_VARIANT=$level: refused here ($out)"
      [ "$level" != "$want" ] || fail "the chosen build $level refused"
    else
      fail "ATTNRES_CPU_VARIANT=$level: exit $rc: $out"
    fi
  done < "$root/usr/local/libexec/attnres/variants"
  unmount_all
  trap - EXIT
}

step_cuda() {
  say "Dockerfile.cuda's build stage on a stand-in for nvidia/cuda:*-devel"
  local toolkit version standin
  toolkit=$(readlink -f /usr/local/cuda)
  [ -x "$toolkit/bin/nvcc" ] || fail "no CUDA toolkit at /usr/local/cuda"
  version=$("$toolkit/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
  standin=localhost/attnres-cuda-devel-standin:$version
  if ! podman image exists "$standin"; then
    local ctr mnt
    ctr=$(buildah from "$base_image")
    buildah copy -q "$ctr" "$toolkit" "$toolkit" >/dev/null
    mnt=$(buildah mount "$ctr")
    ln -sfn "$toolkit" "$mnt/usr/local/cuda"
    buildah umount "$ctr" >/dev/null
    buildah config \
      --env PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      "$ctr"
    buildah commit -q "$ctr" "$standin" >/dev/null
    buildah rm "$ctr" >/dev/null
  fi
  echo "stand-in: $standin (Debian 12 + $toolkit)"
  local start=$SECONDS
  bud -f docker/Dockerfile.cuda --target build --build-arg CUDA_BUILD_IMAGE="$standin" \
    -t "$cuda_build_image"
  echo "built in $((SECONDS - start)) s"
  local ctr mnt
  ctr=$(buildah from "$cuda_build_image")
  mnt=$(buildah mount "$ctr")
  local needed
  needed=$(readelf -d "$mnt/build/server/cli/attnres" \
             | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p')
  echo "attnres links: $(echo "$needed" | tr '\n' ' ')"
  echo "$needed" | grep -q '^libcudart\.so' || fail "attnres was built without the CUDA backend"
  echo "collected for the runtime stage: $(find "$mnt/out/lib" -type f | wc -l) libraries," \
       "$(du -sh "$mnt/out/lib" | cut -f1)"
  local lib
  for lib in "$mnt"/out/lib/*; do
    case "${lib##*/}" in
      libcuda*|libcublas*|libnccl*|libnvrtc*) fail "collected a CUDA library: ${lib##*/}" ;;
    esac
  done
  # Every library the binaries need is either collected or one the runtime image has.
  local binary missing
  for binary in build/server/cli/attnres build/clients/cpp/attnres-client; do
    missing=$(chroot "$mnt" env LD_LIBRARY_PATH=/out/lib ldd "/$binary" \
      | awk '/=> \// {print $3}' \
      | grep -v -e '^/out/lib/' -e '/libc\.so' -e '/libm\.so' -e '/libstdc++' -e '/libgcc_s' \
                -e '/libdl\.so' -e '/libpthread' -e '/librt\.so' -e '/ld-linux' \
                -e '/usr/local/cuda' -e '/libcuda\.so' -e '/libcudart' -e '/libcublas' \
                -e '/libnccl' || true)
    [ -z "$missing" ] || fail "$binary needs libraries neither collected nor in the image: $missing"
  done
  echo "the runtime stage's files: $(du -shc "$mnt/out/lib" "$mnt/build/server/cli/attnres" \
          "$mnt/build/clients/cpp/attnres-client" | tail -n 1 | cut -f1)"
  buildah umount "$ctr" >/dev/null
  buildah rm "$ctr" >/dev/null
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(base context cpu serve cuda)
commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "test-image.sh: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit, $(nproc) CPUs"
for step in "${steps[@]}"; do
  case "$step" in
    base|context|cpu|serve|cuda) "step_$step" ;;
    *) fail "unknown step '$step' (base context cpu serve cuda)" ;;
  esac
done
say "done: ${steps[*]}"
