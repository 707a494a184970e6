"""What can be checked of the Docker images without building them (docker/test-image.sh builds
them with buildah and serves from the CPU image; too slow for CI, docs/DOCKER.md): the
Dockerfiles build with the very scripts CI runs, outside the copied sources, from a build
context without build trees; they expose the documented ports, run as a non-root user with a
/health healthcheck, and every ATTNRES_* variable they (and compose.yaml) set is a real
`attnres serve` flag or engine setting. The environment-variable mechanism and the runtime
library collection are exercised against the real binary.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

from server_process import ServerProcess

DOCKER = Path(__file__).resolve().parents[2] / "docker"
DOCKERFILES = [DOCKER / "Dockerfile.cpu", DOCKER / "Dockerfile.cuda"]
# Not serve flags: the engine's asset folder, the build script's output folder, and the CPU
# image's build levels and the launcher's choice among them (test_docker_cpu_variants.py).
NOT_FLAGS = {"ATTNRES_ASSETS_DIR", "ATTNRES_BUILD_DIR", "ATTNRES_CPU_VARIANTS",
             "ATTNRES_CPU_VARIANT"}


def serve_flags(attnres_bin) -> set[str]:
    help_text = subprocess.run([str(attnres_bin), "serve", "--help"], capture_output=True,
                               text=True, check=True).stdout
    return set(re.findall(r"^\s+--([a-z0-9-]+)", help_text, flags=re.M))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_uses_ci_scripts_and_serving_conventions(dockerfile):
    text = dockerfile.read_text()
    # The CPU image builds through build-cpu-variants.sh, which runs build.sh per level.
    build = "docker/build-cpu-variants.sh" if dockerfile.name == "Dockerfile.cpu" else "docker/build.sh"
    for script in ("docker/install-deps.sh", build, "docker/collect-runtime-libs.sh"):
        assert script in text, f"{dockerfile.name} does not run {script}"
        assert (DOCKER.parent / script).exists()
    if build != "docker/build.sh":
        assert "docker/build.sh" in (DOCKER.parent / build).read_text()
    assert text.count("FROM ") >= 2, "multi-stage: build stage and runtime stage"
    assert re.search(r"^EXPOSE 8000 50051$", text, flags=re.M)
    assert re.search(r"^HEALTHCHECK .*\n?.*/health", text, flags=re.M)
    user = re.search(r"^USER (\S+)$", text, flags=re.M)
    assert user and user.group(1) not in ("root", "0")
    assert re.search(r'^ENTRYPOINT \["/usr/local/bin/attnres", "serve"\]$', text, flags=re.M)
    assert "/models" in text


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_binaries_the_image_copies_are_built_where_it_looks(dockerfile, build_dir):
    """The build stage builds into /build with docker/build.sh: every binary the runtime
    stage copies from there must be what our build produces at the same relative path."""
    text = dockerfile.read_text()
    copied = re.findall(r"^COPY --from=build /build/(\S+) ", text, flags=re.M)
    assert "clients/cpp/attnres-client" in copied
    if dockerfile.name == "Dockerfile.cpu":
        # attnres: one build per level from build-cpu-variants.sh, behind the launcher.
        assert re.search(r"^COPY --from=build /out/libexec/ /usr/local/libexec/attnres/$", text,
                         flags=re.M)
        assert re.search(r"^COPY docker/attnres-launcher.sh /usr/local/bin/attnres$", text,
                         flags=re.M)
        assert "server/cli/attnres" in (DOCKER / "build-cpu-variants.sh").read_text()
    else:
        assert "server/cli/attnres" in copied
    for relative in copied:
        assert (build_dir / relative).is_file(), f"{dockerfile.name} copies {relative}: not built"


@pytest.mark.parametrize("path", DOCKERFILES + [DOCKER / "compose.yaml"], ids=lambda p: p.name)
def test_every_attnres_variable_is_a_serve_flag(attnres_bin, path):
    flags = serve_flags(attnres_bin)
    names = set(re.findall(r"\b(ATTNRES_[A-Z0-9_]+)\b", path.read_text())) - NOT_FLAGS
    assert names, f"{path.name} sets no ATTNRES_ variable"
    for name in names:
        flag = name[len("ATTNRES_"):].lower().replace("_", "-")
        assert flag in flags, f"{path.name}: {name} matches no `attnres serve --{flag}`"


def test_environment_variables_configure_the_server(attnres_bin):
    env = {"ATTNRES_SERVED_MODEL_NAME": "from-the-environment", "ATTNRES_MAX_MODEL_LEN": "512"}
    with ServerProcess(attnres_bin, env=env) as server:
        import json
        import urllib.request
        with urllib.request.urlopen(server.http_url + "/v1/models", timeout=10) as r:
            model = json.loads(r.read())["data"][0]
        assert model["id"] == "from-the-environment"
        assert model["max_model_len"] == 512


# The build context: .dockerignore's patterns as Docker reads them (a path is left out when it
# or a folder above it matches the last matching pattern; "!" puts it back; "**" spans folders).
def dockerignore_patterns() -> list[tuple[re.Pattern, bool]]:
    patterns = []
    for line in (DOCKER.parent / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        patterns.append((re.compile(regex + "$"), keep))
    return patterns


def left_out_of_context(path: str, patterns) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    left_out = False
    for regex, keep in patterns:
        if any(regex.match(prefix) for prefix in prefixes):
            left_out = not keep
    return left_out


def tracked_files() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=DOCKER.parent, capture_output=True,
                          text=True, check=True).stdout.split()


def test_dockerignore_leaves_out_every_gitignore_entry():
    """What a checkout gathers (build trees, .venv, caches: .gitignore) never reaches the
    build context: the build stage would copy a host's CMakeCache.txt and stop on it."""
    patterns = dockerignore_patterns()
    for line in (DOCKER.parent / ".gitignore").read_text().splitlines():
        entry = line.strip().strip("/")
        if not entry or entry.startswith("#"):
            continue
        sample = entry.replace("*", "x")
        assert left_out_of_context(sample, patterns), f".dockerignore lets in {entry}"
    for path in ("build/CMakeCache.txt", "build-cuda/server/cli/attnres", ".venv/bin/python",
                 "build-x86-64-v3/build.ninja", "engine/CMakeCache.txt", ".git/HEAD",
                 "tests/python/__pycache__/conftest.cpython-311.pyc"):
        assert left_out_of_context(path, patterns), path


def test_build_context_holds_what_the_builds_read():
    """Every tracked source the build compiles, and every file the Dockerfiles copy from the
    context or run from /src, is in the context."""
    patterns = dockerignore_patterns()
    for path in tracked_files():
        if path.split("/")[0] in ("engine", "kernels", "server", "clients", "proto") \
                or path == "CMakeLists.txt":
            assert not left_out_of_context(path, patterns), f".dockerignore leaves out {path}"
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        used = re.findall(r"^COPY (?!--from)(\S+) ", text, flags=re.M)
        used += re.findall(r"/src/(\S+\.sh)\b", text)
        used += re.findall(r"^COPY --from=build /src/(\S+) ", text, flags=re.M)
        assert used
        for path in used:
            assert (DOCKER.parent / path).exists(), f"{dockerfile.name} uses {path}: not there"
            assert not left_out_of_context(path, patterns), f"{dockerfile.name} uses {path}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_build_outside_the_copied_sources(dockerfile):
    """/src is the build context; a build in /src/build could pick up a host's build tree."""
    text = dockerfile.read_text()
    assert "ATTNRES_BUILD_DIR=/build " in text
    assert "/src/build" not in text


# docker/collect-runtime-libs.sh: what the runtime stage gets besides the binaries.
COLLECT = DOCKER / "collect-runtime-libs.sh"
BASE_IMAGE_LIB = re.compile(r"^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so|^ld-linux")
CUDA_LIB = re.compile(r"^lib(cuda|cudart|cublas|cublasLt|nccl|nvrtc)\.so")


def resolved_libraries(binary: Path, env=None) -> dict[str, str]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True,
                         env=env).stdout
    assert "not found" not in out, out
    return dict(re.findall(r"^\s*(\S+) => (/\S+)", out, flags=re.M))


def test_collected_libraries_are_what_the_binary_needs_beyond_the_base_image(attnres_bin,
                                                                             tmp_path):
    """On this build of `attnres`, as in the image's build stage: every library it loads is
    either collected or one every base image has (or, for a CUDA build, the CUDA runtime
    image), and with the collected folder first on the library path the binary runs."""
    assert attnres_bin.exists(), f"build first: {attnres_bin}"
    lib = tmp_path / "lib"
    subprocess.run(["bash", str(COLLECT), str(attnres_bin), str(lib)], check=True, timeout=60)
    collected = {p.name for p in lib.iterdir()}
    for name, path in resolved_libraries(attnres_bin).items():
        left_to_base = BASE_IMAGE_LIB.match(name) or CUDA_LIB.match(name) \
            or os.path.realpath(path).startswith("/usr/local/cuda")
        assert (name in collected) != bool(left_to_base), name
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib))
    for name, path in resolved_libraries(attnres_bin, env).items():
        if name in collected:
            assert Path(path).parent == lib, f"{name} resolves to {path}"
    r = subprocess.run([str(attnres_bin), "inspect"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "engine:" in r.stdout, r.stderr


def test_cuda_libraries_are_left_to_the_cuda_runtime_image(tmp_path):
    """The nvidia/cuda runtime image has cuBLAS, NCCL and the CUDA runtime (about 800 MB) for
    the CUDA_VERSION the devel image built with: they are not collected again."""
    libs = tmp_path / "usr-lib"
    libs.mkdir()
    names = ["libcudart.so.12", "libcublas.so.12", "libcublasLt.so.12", "libnccl.so.2",
             "libcuda.so.1", "libc.so.6", "libstdc++.so.6", "libgrpc.so.29", "libutf8proc.so.2"]
    for name in names:
        (libs / name).write_text(name)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "ldd").write_text("#!/bin/sh\n" + "".join(
        f'echo "\t{name} => {libs / name} (0x0)"\n' for name in names))
    (fake_bin / "ldd").chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, PATH=f"{fake_bin}:{os.environ['PATH']}")
    subprocess.run(["bash", str(COLLECT), "/bin/true", str(out)], env=env, check=True, timeout=30)
    assert sorted(p.name for p in out.iterdir()) == ["libgrpc.so.29", "libutf8proc.so.2"]
