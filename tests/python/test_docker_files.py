"""The Docker images cannot be built here (no Docker engine on these machines), so this checks
what can be checked without one: the Dockerfiles build with the very scripts CI runs, expose
the documented ports, run as a non-root user with a /health healthcheck, and every ATTNRES_*
variable they (and compose.yaml) set is a real `attnres serve` flag or engine setting. The
environment-variable mechanism itself is exercised against the real binary.
"""

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
    """The build stage builds into /src/build with docker/build.sh: every binary the runtime
    stage copies from there must be what our build produces at the same relative path."""
    text = dockerfile.read_text()
    copied = re.findall(r"^COPY --from=build /src/build/(\S+) ", text, flags=re.M)
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
