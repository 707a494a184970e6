"""The CPU image's launcher (docker/attnres-launcher.sh, /usr/local/bin/attnres there): it runs
the build of `attnres` for the best instruction-set level the CPU has, among those
docker/build-cpu-variants.sh built. No Docker engine here, so the launcher runs as it would in
the image, against a folder of builds and CPU flag lists of real processors: stand-in builds
that report which one ran and with what arguments, and the real binary for one level.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

DOCKER = Path(__file__).resolve().parents[2] / "docker"
LAUNCHER = DOCKER / "attnres-launcher.sh"
IMAGE_LEVELS = ["x86-64-v4+avx512bf16", "x86-64-v3"]  # Dockerfile.cpu's default, in order

# /proc/cpuinfo flags of real processors (the x86-64 level flags and the AVX-512 ones, as
# Linux prints them; other flags left out).
V2 = "fpu sse sse2 pni ssse3 cx16 sse4_1 sse4_2 popcnt lahf_lm"
V3 = V2 + " avx avx2 bmi1 bmi2 f16c fma abm movbe xsave"
CPUS = {
    # AMD EPYC Zen 4 (this project's dev machine): AVX-512 with BF16.
    "zen4": V3 + " avx512f avx512dq avx512cd avx512bw avx512vl avx512ifma avx512vbmi"
                 " avx512_bf16 avx512_vnni avx512_vbmi2 avx512_bitalg avx512_vpopcntdq",
    # Intel Skylake-SP: AVX-512 without BF16.
    "skylake_sp": V3 + " avx512f avx512dq avx512cd avx512bw avx512vl",
    # AMD Zen 3: AVX2, no AVX-512.
    "zen3": V3,
    # Intel Westmere: SSE4.2, no AVX.
    "westmere": V2,
}


def write_cpuinfo(path: Path, flags: str) -> Path:
    blocks = [f"processor\t: {i}\nvendor_id\t: Test\nflags\t\t: {flags}\n" for i in range(2)]
    path.write_text("\n".join(blocks))
    return path


def stand_in_builds(folder: Path, levels) -> Path:
    """Executables attnres-LEVEL that print their level and their arguments, one per line,
    and exit 7; `variants` lists the levels as build-cpu-variants.sh writes it."""
    folder.mkdir()
    for level in levels:
        exe = folder / f"attnres-{level}"
        exe.write_text(f'#!/bin/sh\necho "ran {level}"\nfor a in "$@"; do echo "arg $a"; done\n'
                       "exit 7\n")
        exe.chmod(0o755)
    (folder / "variants").write_text("".join(level + "\n" for level in levels))
    return folder


def launch(builds: Path, cpuinfo: Path, *args, variant=None):
    env = {k: v for k, v in os.environ.items() if k != "ATTNRES_CPU_VARIANT"}
    env.update(ATTNRES_LIBEXEC_DIR=str(builds), ATTNRES_CPUINFO=str(cpuinfo))
    if variant is not None:
        env["ATTNRES_CPU_VARIANT"] = variant
    return subprocess.run(["/bin/sh", str(LAUNCHER), *args], env=env, capture_output=True,
                          text=True, timeout=30)


@pytest.mark.parametrize("cpu, want", [
    ("zen4", "x86-64-v4+avx512bf16"),
    ("skylake_sp", "x86-64-v3"),  # AVX-512 but no BF16: the v4+bf16 build would fault
    ("zen3", "x86-64-v3"),
])
def test_each_cpu_runs_the_best_build_it_can(tmp_path, cpu, want):
    builds = stand_in_builds(tmp_path / "libexec", IMAGE_LEVELS)
    r = launch(builds, write_cpuinfo(tmp_path / "cpuinfo", CPUS[cpu]), "serve", "--port", "80")
    assert r.returncode == 7, r.stderr  # the build's own exit status
    assert r.stdout.splitlines() == [f"ran {want}", "arg serve", "arg --port", "arg 80"]
    assert r.stderr == ""


def test_arguments_pass_through_unchanged(tmp_path):
    builds = stand_in_builds(tmp_path / "libexec", IMAGE_LEVELS)
    args = ["generate", "--prompt", "two words", "", "*", "$HOME", "--x=\"q\""]
    r = launch(builds, write_cpuinfo(tmp_path / "cpuinfo", CPUS["zen3"]), *args)
    assert r.stdout.splitlines()[1:] == [f"arg {a}" for a in args]


def test_the_list_order_is_the_preference(tmp_path):
    builds = stand_in_builds(tmp_path / "libexec", ["x86-64-v3", "x86-64-v4+avx512bf16"])
    r = launch(builds, write_cpuinfo(tmp_path / "cpuinfo", CPUS["zen4"]))
    assert r.stdout.splitlines() == ["ran x86-64-v3"]


def test_a_cpu_below_every_build_is_refused_naming_what_it_lacks(tmp_path):
    builds = stand_in_builds(tmp_path / "libexec", IMAGE_LEVELS)
    r = launch(builds, write_cpuinfo(tmp_path / "cpuinfo", CPUS["westmere"]), "serve")
    assert r.returncode == 2 and r.stdout == ""
    assert "x86-64-v3" in r.stderr
    for flag in ("avx2", "fma", "f16c"):
        assert flag in r.stderr
    assert "ATTNRES_CPU_VARIANTS" in r.stderr


def test_a_chosen_build_runs_where_the_cpu_has_its_flags(tmp_path):
    builds = stand_in_builds(tmp_path / "libexec", IMAGE_LEVELS)
    r = launch(builds, write_cpuinfo(tmp_path / "cpuinfo", CPUS["zen4"]), variant="x86-64-v3")
    assert r.stdout.splitlines() == ["ran x86-64-v3"]


@pytest.mark.parametrize("cpu, variant, says", [
    ("skylake_sp", "x86-64-v4+avx512bf16", "avx512_bf16"),  # would fault: refused
    ("zen4", "x86-64-v2", "this image has builds for: x86-64-v4+avx512bf16 x86-64-v3"),
])
def test_a_chosen_build_that_cannot_run_is_refused(tmp_path, cpu, variant, says):
    builds = stand_in_builds(tmp_path / "libexec", IMAGE_LEVELS)
    r = launch(builds, write_cpuinfo(tmp_path / "cpuinfo", CPUS[cpu]), variant=variant)
    assert r.returncode == 2 and r.stdout == ""
    assert f"ATTNRES_CPU_VARIANT={variant}" in r.stderr and says in r.stderr


def test_no_build_list_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    r = launch(tmp_path / "empty", write_cpuinfo(tmp_path / "cpuinfo", CPUS["zen4"]))
    assert r.returncode == 127 and "variants" in r.stderr


def test_the_real_binary_runs_behind_the_launcher(tmp_path, attnres_bin):
    """This build of `attnres` as the image's only level, named for what this machine is: the
    launcher picks it and the binary sees the arguments."""
    assert attnres_bin.exists(), f"build first: {attnres_bin}"
    builds = tmp_path / "libexec"
    builds.mkdir()
    shutil.copy(attnres_bin, builds / "attnres-native")
    (builds / "variants").write_text("native\n")
    r = launch(builds, Path("/proc/cpuinfo"), "inspect", "--model", "builtin:demo")
    assert r.returncode == 0, r.stderr
    assert "engine:" in r.stdout


def test_the_build_script_lists_levels_in_the_order_given(tmp_path):
    """build-cpu-variants.sh's bookkeeping, with cmake replaced by a stand-in build.sh."""
    repo = tmp_path / "repo"
    (repo / "docker").mkdir(parents=True)
    shutil.copy(DOCKER / "build-cpu-variants.sh", repo / "docker")
    fake_build = repo / "docker" / "build.sh"
    fake_build.write_text(
        '#!/bin/sh\nmkdir -p "$ATTNRES_BUILD_DIR/server/cli"\n'
        'echo "$* targets=${ATTNRES_BUILD_TARGETS:-all}" > "$ATTNRES_BUILD_DIR/server/cli/attnres"\n')
    fake_build.chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, ATTNRES_BUILD_DIR=str(tmp_path / "build"))
    subprocess.run(["bash", str(repo / "docker" / "build-cpu-variants.sh"), str(out),
                    *IMAGE_LEVELS], env=env, check=True, timeout=30)
    assert (out / "libexec" / "variants").read_text().split() == IMAGE_LEVELS
    best = (out / "libexec" / "attnres-x86-64-v4+avx512bf16").read_text()
    fallback = (out / "libexec" / "attnres-x86-64-v3").read_text()
    assert "-DATTNRES_CPU_ARCH=x86-64-v4+avx512bf16" in best and "targets=attnres" in best
    # The last level is the whole build, in the folder the Dockerfile copies the client from.
    assert "-DATTNRES_CPU_ARCH=x86-64-v3" in fallback and "targets=all" in fallback
    assert (tmp_path / "build" / "server" / "cli" / "attnres").read_text() == fallback


def test_the_levels_here_are_the_images_default():
    text = (DOCKER / "Dockerfile.cpu").read_text()
    default = re.search(r'^ARG ATTNRES_CPU_VARIANTS="([^"]*)"$', text, flags=re.M)
    assert default and default.group(1).split() == IMAGE_LEVELS


def test_this_machine_gets_the_build_its_flags_allow(tmp_path):
    """The launcher's choice on this machine among the image's builds, as docker/test-image.sh
    checks it in the built image: AVX-512 with BF16 where /proc/cpuinfo lists those flags,
    else AVX2 where it lists the x86-64-v3 ones."""
    flags = set(re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(),
                          flags=re.M).group(1).split())
    v3 = set(V3.split())
    if v3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_bf16"} <= flags:
        want = "x86-64-v4+avx512bf16"
    elif v3 <= flags:
        want = "x86-64-v3"
    else:
        pytest.skip("this CPU has no AVX2: the image's builds do not run here")
    builds = stand_in_builds(tmp_path / "libexec", IMAGE_LEVELS)
    r = launch(builds, Path("/proc/cpuinfo"))
    assert r.stdout.splitlines() == [f"ran {want}"], r.stderr
