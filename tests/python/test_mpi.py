"""Tensor parallelism with one rank per process, launched by Open MPI's mpirun (issue #18):
engine/runner/process_runner.h and engine/parallel/mpi/, on the CPU over loopback.

What must hold:
- `mpirun -np 2` and `-np 4` give the same greedy tokens and text as one process, and logprobs
  within 1e-4, on every AttnRes variant (and a plain twin), with sequence-parallel prefill on
  and off.
- `mpirun -np 2 attnres serve` serves the single-process text; SIGTERM to rank 0 drains and
  the job exits 0.
- A rank that dies (SIGKILL) or hangs (SIGSTOP) mid-stream: the stream ends with an error naming
  it, /health stops answering 200, and the job exits non-zero within a bounded time.
- A --tensor-parallel-size that is not the number of processes is refused with a clear error.
"""

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import openai
import pytest
from openai import OpenAI

from checkpoint_cache import checkpoint_fixture
from make_checkpoint import ATTNRES_VARIANTS, MODE_VARIANTS
from engine_cli import prompt_ids
from server_process import ServerProcess

TIMEOUT_S = 600
GEN_TOKENS = 24
RANK_TIMEOUT_S = 2      # ATTNRES_RANK_TIMEOUT: how long a silent rank may stay silent
SIGKILL_TIMEOUT_S = 6   # mpirun's: longer than the rank timeout (see mpi_process_group.h)


def mpirun_env():
    # CI runs as root; -np 4 on 2 cores oversubscribes; one OpenMP thread per rank.
    return {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMP_NUM_THREADS": "1",
            "ATTNRES_RANK_TIMEOUT": str(RANK_TIMEOUT_S)}


def mpirun(np_):
    if shutil.which("mpirun") is None:
        pytest.fail("mpirun not found: docker/install-deps.sh installs openmpi-bin", pytrace=False)
    return ["mpirun", "-np", str(np_), "--mca", "odls_base_sigkill_timeout",
            str(SIGKILL_TIMEOUT_S), "--mca", "btl", "self,vader"]


def greedy(binary, model_dir, prompt, tp, sp_min_tokens, launcher=()):
    cmd = [*launcher, str(binary), "generate", "--model", str(model_dir), "--prompt-ids",
           ",".join(map(str, prompt)), "--max-tokens", str(GEN_TOKENS), "--temperature", "0",
           "--ignore-eos", "--json", "--tensor-parallel-size", str(tp),
           "--sequence-parallel-min-tokens", str(sp_min_tokens)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=mpirun_env())
    if proc.returncode != 0:
        pytest.fail(f"exit {proc.returncode}: {' '.join(cmd)}\n{proc.stderr[-3000:]}", pytrace=False)
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def rank_pids(mpirun_pid):
    """{rank: pid} of mpirun's children, read from their OMPI_COMM_WORLD_RANK."""
    pids = {}
    children = subprocess.run(["pgrep", "-P", str(mpirun_pid)], capture_output=True,
                              text=True).stdout.split()
    for child in children:
        try:
            environ = open(f"/proc/{child}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(b"OMPI_COMM_WORLD_RANK="):
                pids[int(item.split(b"=", 1)[1])] = int(child)
    return pids


@pytest.fixture(scope="module")
def checkpoint(ckpt_root):
    yield from checkpoint_fixture(ckpt_root, prefix="mpi", seed=11)


@pytest.mark.parametrize("variant", ATTNRES_VARIANTS + MODE_VARIANTS + ("qwen3",))
def test_processes_give_the_single_process_tokens(attnres_bin, checkpoint, variant):
    model_dir = checkpoint(variant)
    prompt = prompt_ids(6, 20)
    want, _ = greedy(attnres_bin, model_dir, prompt, 1, 0)
    assert len(want["token_ids"]) == GEN_TOKENS
    for np_ in (2, 4):
        for sp in (0, 1):
            got, log = greedy(attnres_bin, model_dir, prompt, np_, sp, launcher=mpirun(np_))
            where = f"mpirun -np {np_}, sequence-parallel {'on' if sp else 'off'}"
            assert f"{np_} processes: rank 0 (pid" in log, log  # it really ran as processes
            assert got["token_ids"] == want["token_ids"], where
            assert got["text"] == want["text"], where
            for a, b in zip(got["logprobs"], want["logprobs"]):
                assert abs(a["logprob"] - b["logprob"]) < 1e-4, where


def test_a_size_that_is_not_the_number_of_processes_is_refused(attnres_bin):
    cmd = [*mpirun(2), str(attnres_bin), "generate", "--max-tokens", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=mpirun_env())
    assert proc.returncode != 0
    assert ("--tensor-parallel-size 1, but the launcher started 2 processes (one rank each): "
            "pass --tensor-parallel-size 2") in proc.stderr


def test_a_rank_that_loads_another_model_refuses_it(attnres_bin, checkpoint, tmp_path):
    """The same relative path names different checkpoints in the two ranks' working directories
    (as the same path on two machines can): rank 1 must refuse, and rank 0 say why."""
    for rank_dir, variant in (("a", "attnres_block"), ("b", "attnres_full")):
        (tmp_path / rank_dir).mkdir()
        shutil.copytree(checkpoint(variant), tmp_path / rank_dir / "m")
    args = [str(attnres_bin), "generate", "--model", "m", "--tensor-parallel-size", "2",
            "--max-tokens", "2"]
    cmd = [*mpirun(1), "--wdir", str(tmp_path / "a"), *args, ":", "-np", "1", "--wdir",
           str(tmp_path / "b"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=mpirun_env())
    assert proc.returncode != 0
    assert "rank 1 (pid " in proc.stderr and "could not load its shard: it loaded 'm' as" in \
        proc.stderr, proc.stderr[-3000:]
    assert "is the same model at the same path on every machine?" in proc.stderr


def serve_args():
    return ("--tensor-parallel-size", "2", "--max-num-batched-tokens", "64")


def test_two_processes_serve_the_single_process_text_and_drain_on_sigterm(attnres_bin):
    prompt = "Depth attention lets every layer choose" * 6
    with ServerProcess(attnres_bin, "--max-num-batched-tokens", "64") as single:
        client = OpenAI(base_url=single.http_url + "/v1", api_key="unused", max_retries=0)
        want = client.completions.create(model="attnres-demo", prompt=prompt, max_tokens=16,
                                         temperature=0).choices[0].text
    server = ServerProcess(attnres_bin, *serve_args(), env=mpirun_env(), launcher=mpirun(2))
    server.__enter__()
    try:
        client = OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)
        got = client.completions.create(model="attnres-demo", prompt=prompt, max_tokens=16,
                                        temperature=0).choices[0].text
        assert got == want
        assert "x2 processes (mpi)" in server.log()
        # Graceful stop: SIGTERM to rank 0 (mpirun, signalled itself, exits 1 whatever happens).
        os.kill(rank_pids(server.proc.pid)[0], signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0, server.log()
        assert "SIGTERM: draining" in server.log()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


@pytest.mark.parametrize("how", ["dies", "hangs"])
def test_a_lost_rank_fails_the_stream_with_its_name_and_ends_the_job(attnres_bin, how):
    server = ServerProcess(attnres_bin, *serve_args(), env=mpirun_env(), launcher=mpirun(2))
    server.__enter__()
    pids = rank_pids(server.proc.pid)
    try:
        assert set(pids) == {0, 1}, pids
        client = OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)
        chunks, lost_at = 0, None
        with pytest.raises(openai.APIError) as error:
            for chunk in client.completions.create(
                    model="attnres-demo", prompt="Hello", max_tokens=4000, temperature=0,
                    stream=True, extra_body={"ignore_eos": True}):
                chunks += 1
                if chunks == 3:
                    os.kill(pids[1], signal.SIGKILL if how == "dies" else signal.SIGSTOP)
                    lost_at = time.monotonic()
        noticed = time.monotonic() - lost_at
        message = str(error.value)
        assert f"rank 1 (pid {pids[1]} on " in message and "died or hangs" in message, message
        assert noticed < RANK_TIMEOUT_S + 5, f"noticed after {noticed:.1f} s"
        # Unhealthy from then on (503, or no answer once it has exited), and the job exits
        # non-zero, within mpirun's kill sequence of the dead rank.
        try:
            with urllib.request.urlopen(server.http_url + "/health", timeout=2) as r:
                health = r.status
        except urllib.error.HTTPError as e:
            health = e.code
        except OSError:
            health = None
        assert health != 200
        code = server.proc.wait(timeout=4 * SIGKILL_TIMEOUT_S + 30)
        assert code != 0
        log = server.log()
        assert f"the tensor-parallel group failed: rank 1 (pid {pids[1]}" in log, log
        assert "exiting with status 1" in log, log
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
        for pid in pids.values():  # a stopped rank must not outlive the test
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
