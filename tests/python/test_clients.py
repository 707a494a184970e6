"""End-to-end tests of the clients (clients/): the attnres-client command (over the C++ client
library) and the Python examples, against the real `attnres serve` binary with the built-in
demo model. Each check compares against an independent path to the same answer: the HTTP API
through the official `openai` package, /tokenize and /detokenize, /v1/models, the model's
config.json, and /metrics for what the server did with a cancelled request.

Every subprocess has a timeout and every wait is bounded; nothing sleeps for a fixed time.
"""

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import openai
import pytest

from http_helpers import post_json, request
from make_checkpoint import make_checkpoint
from grpc_stubs import GrpcServerProcess
from server_process import free_port

MAX_MODEL_LEN = 2048
PROMPT = "The depth of attention residuals"
TIMEOUT = 120  # seconds, for any one subprocess
EXAMPLES = Path(__file__).resolve().parents[2] / "clients" / "python"
ABORTED = 'attnres:request_success_total{model_name="attnres-demo",finished_reason="abort"}'


@pytest.fixture(scope="module")
def client_bin(build_dir) -> Path:
    path = build_dir / "clients" / "cpp" / "attnres-client"
    assert path.exists(), f"attnres-client not found at {path}: build first"
    return path


@pytest.fixture(scope="module")
def server(attnres_bin):
    with GrpcServerProcess(attnres_bin, "--max-model-len", str(MAX_MODEL_LEN),
                           "--max-num-seqs", "8") as s:
        yield s


@pytest.fixture(scope="module")
def http(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http_url + "/v1", api_key="none", timeout=TIMEOUT,
                         max_retries=0)


def run_client(client_bin, *args, target=None, env=None, check=None):
    """Runs attnres-client to the end: (exit code, stdout, stderr) as text."""
    cmd = [str(client_bin), *map(str, args)]
    if target:
        cmd += ["--target", target]
    proc = subprocess.run(cmd, capture_output=True, timeout=TIMEOUT,
                          env={**os.environ, **(env or {})})
    out, err = proc.stdout.decode(), proc.stderr.decode()
    if check is not None:
        assert proc.returncode == check, f"{cmd} exited {proc.returncode}:\n{err}"
    return proc.returncode, out, err


def cli(client_bin, server, *args, **kwargs):
    """A successful attnres-client call against `server`: its stdout."""
    return run_client(client_bin, *args, target=server.grpc_target, check=0, **kwargs)[1]


def wait_until(predicate, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def engine_idle(server) -> bool:
    m = server.metrics()
    return (m["attnres:num_requests_running"] == 0 and m["attnres:num_requests_waiting"] == 0
            and m["attnres:kv_cache_usage_perc"] == 0)


def http_completion(http, **kwargs):
    return http.completions.create(model="attnres-demo", prompt=PROMPT,
                                   extra_body={"return_token_ids": True, "ignore_eos": True},
                                   **kwargs)


def start_long_generate(client_bin, server, *extra):
    """attnres-client generating up to the context limit; returns it once its first text is
    out (so the output streams: the whole generation takes many seconds)."""
    proc = subprocess.Popen([str(client_bin), "generate", "--target", server.grpc_target,
                             "--prompt", PROMPT, "--temperature", "0", "--ignore-eos",
                             "--max-tokens", str(MAX_MODEL_LEN - 16), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT)
    assert ready, "no streamed output from attnres-client generate"
    first = os.read(proc.stdout.fileno(), 4096)
    assert first, proc.stderr.read().decode()
    # Streaming: text arrived while the generation (thousands of tokens) is still running.
    assert proc.poll() is None, "attnres-client printed nothing until the generation ended"
    return proc, first


# --- generate ---------------------------------------------------------------------------------


def test_streamed_generate_prints_the_http_text(client_bin, server, http):
    expected = http_completion(http, max_tokens=24, temperature=0)
    choice = expected.choices[0]
    code, out, err = run_client(client_bin, "generate", "--prompt", PROMPT, "--max-tokens", 24,
                                "--temperature", 0, "--ignore-eos", target=server.grpc_target)
    assert code == 0, err
    assert out == choice.text + "\n"
    usage = expected.usage
    assert "finish_reason length" in err
    assert (f"usage: prompt {usage.prompt_tokens}, completion 24, "
            f"total {usage.prompt_tokens + 24}") in err
    whole = cli(client_bin, server, "generate", "--prompt", PROMPT, "--max-tokens", 24,
                "--temperature", 0, "--ignore-eos", "--no-stream", "--quiet")
    assert whole == out


def test_json_result_agrees_with_the_http_api(client_bin, server, http):
    expected = http_completion(http, max_tokens=12, temperature=0, logprobs=2)
    choice = expected.choices[0]
    for mode in ([], ["--no-stream"]):
        out = cli(client_bin, server, "generate", "--prompt", PROMPT, "--max-tokens", 12,
                  "--temperature", 0, "--ignore-eos", "--json", "--logprobs", 2,
                  "--request-id", f"json-{uuid.uuid4().hex}", *mode)
        result = json.loads(out)
        assert result["request_id"].startswith("json-")
        [c] = result["choices"]
        assert c["index"] == 0 and c["text"] == choice.text
        assert c["token_ids"] == choice.model_extra["token_ids"]
        assert c["finish_reason"] == choice.finish_reason == "length"
        assert c["stop_reason"] is None
        usage = {"prompt_tokens": expected.usage.prompt_tokens, "completion_tokens": 12,
                 "total_tokens": expected.usage.prompt_tokens + 12}
        assert c["usage"] == usage and result["usage"] == usage
        # Logprobs, streamed in chunks or sent whole: one per token, greedy = the best.
        assert [lp["token_id"] for lp in c["logprobs"]] == c["token_ids"]
        for lp, http_lp in zip(c["logprobs"], choice.logprobs.token_logprobs):
            assert lp["rank"] == 1 and lp["top"][0]["token_id"] == lp["token_id"]
            assert len(lp["top"]) == 2
            assert lp["logprob"] == pytest.approx(http_lp, abs=1e-5)
    # The same prompt as token ids (from /tokenize) generates the same tokens.
    _, _, tok = post_json(server.http_url, "/tokenize", {"prompt": PROMPT})
    by_ids = json.loads(cli(client_bin, server, "generate", "--prompt-ids",
                            ",".join(map(str, tok["tokens"])), "--max-tokens", 12,
                            "--temperature", 0, "--ignore-eos", "--json"))
    assert by_ids["choices"][0]["token_ids"] == choice.model_extra["token_ids"]


def test_stop_string_ends_the_text(client_bin, server, http):
    full = http_completion(http, max_tokens=24, temperature=0).choices[0].text
    stop = full[len(full) // 2:len(full) // 2 + 3]
    result = json.loads(cli(client_bin, server, "generate", "--prompt", PROMPT, "--max-tokens",
                            24, "--temperature", 0, "--ignore-eos", "--stop", stop, "--json"))
    [c] = result["choices"]
    assert c["finish_reason"] == "stop" and c["stop_reason"] == stop
    assert c["text"] == full[:full.find(stop)]


def test_n_choices_with_a_seed_reproduce_and_match_http(client_bin, server, http):
    args = ["generate", "--prompt", PROMPT, "--max-tokens", 8, "--ignore-eos", "--temperature",
            1.0, "--seed", 1234, "--n", 2]
    first = json.loads(cli(client_bin, server, *args, "--json"))
    second = json.loads(cli(client_bin, server, *args, "--json"))
    assert [c["index"] for c in first["choices"]] == [0, 1]
    assert first["choices"] == second["choices"]
    texts = [c["text"] for c in first["choices"]]
    assert texts[0] != texts[1]  # choice i samples with seed + i
    expected = http.completions.create(model="attnres-demo", prompt=PROMPT, max_tokens=8,
                                       temperature=1.0, seed=1234, n=2,
                                       extra_body={"ignore_eos": True})
    assert [c.text for c in sorted(expected.choices, key=lambda c: c.index)] == texts
    assert first["usage"]["completion_tokens"] == 16 == expected.usage.completion_tokens
    # Without --json each choice is printed whole, under its index.
    out = cli(client_bin, server, *args, "--quiet")
    assert out == f"[choice 0]\n{texts[0]}\n[choice 1]\n{texts[1]}\n"


def test_invalid_parameter_reports_the_servers_message(client_bin, server):
    code, out, err = run_client(client_bin, "generate", "--prompt", PROMPT, "--temperature", -1,
                                target=server.grpc_target)
    assert code == 1 and out == ""
    assert "INVALID_ARGUMENT" in err and "field temperature: got -1" in err
    code, _, err = run_client(client_bin, "generate", "--prompt", PROMPT, "--max-tokens",
                              MAX_MODEL_LEN, target=server.grpc_target)
    assert code == 1 and "INVALID_ARGUMENT" in err and str(MAX_MODEL_LEN) in err


@pytest.mark.parametrize("args, fragment", [
    (["generate"], "--prompt"),
    (["generate", "--prompt", "a", "--prompt-ids", "1"], "exactly one"),
    (["generate", "--prompt", "a", "--seed", "-3"], "--seed"),
    (["generate", "--prompt", "a", "--logit-bias", "12"], "ID:BIAS"),
    (["generate", "--prompt", "a", "--bogus"], "unknown flag --bogus"),
    (["generate", "--prompt", "a", "--timeout", "-1"], "--timeout"),
    (["tokenize"], "--text"),
    (["frobnicate"], "unknown command"),
    ([], "usage"),
])
def test_bad_command_lines_exit_2(client_bin, args, fragment):
    code, out, err = run_client(client_bin, *args)
    assert code == 2
    assert fragment in err + out


# --- cancellation and abort -------------------------------------------------------------------


def test_ctrl_c_cancels_the_request(client_bin, server):
    wait_until(lambda: engine_idle(server), what="the engine to be idle")
    aborted_before = server.metrics().get(ABORTED, 0.0)
    proc, _ = start_long_generate(client_bin, server)
    try:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert code == 128 + signal.SIGINT
    assert "interrupted" in proc.stderr.read().decode()
    # The server aborted the request (not finished by length) and freed its KV cache.
    wait_until(lambda: engine_idle(server), what="the cancelled request to leave the engine")
    assert server.metrics()[ABORTED] == aborted_before + 1


def test_abort_command_ends_a_running_request(client_bin, server):
    request_id = f"cli-abort-{uuid.uuid4().hex}"
    proc, _ = start_long_generate(client_bin, server, "--request-id", request_id)
    try:
        cli(client_bin, server, "abort", "--request-id", request_id)
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    err = proc.stderr.read().decode()
    assert code == 0, err
    assert f"[request {request_id} | finish_reason abort" in err


# --- tokenize, detokenize, model info, health ------------------------------------------------


@pytest.mark.parametrize("text", ["Hello, depth attention! Ünïcødé 🚀",
                                  "  two  spaces\nand a line"])
def test_tokenize_and_detokenize_agree_with_http(client_bin, server, text):
    _, _, tok = post_json(server.http_url, "/tokenize", {"prompt": text})
    out = cli(client_bin, server, "tokenize", "--text", text)
    assert out == ",".join(map(str, tok["tokens"])) + "\n"
    as_json = json.loads(cli(client_bin, server, "tokenize", "--text", text, "--json"))
    assert as_json == {"token_ids": tok["tokens"], "count": tok["count"],
                       "max_model_len": tok["max_model_len"]}
    _, _, detok = post_json(server.http_url, "/detokenize", {"tokens": tok["tokens"]})
    assert detok["prompt"] == text
    assert cli(client_bin, server, "detokenize", "--ids", out.strip()) == text + "\n"
    back = json.loads(cli(client_bin, server, "detokenize", "--ids", out.strip(), "--json"))
    assert back == {"text": text}


def test_model_info_agrees_with_v1_models_and_the_config(client_bin, server, attnres_bin):
    info = json.loads(cli(client_bin, server, "model-info", "--json"))
    _, _, body = request(server.http_url, "GET", "/v1/models")
    [model] = json.loads(body)["data"]
    assert info["served_model_name"] == model["id"]
    assert info["model_source"] == model["root"]
    assert info["max_model_len"] == model["max_model_len"] == MAX_MODEL_LEN
    # The demo model's configuration as `attnres inspect` prints it.
    inspect = subprocess.run([str(attnres_bin), "inspect"], capture_output=True, text=True,
                             timeout=TIMEOUT, check=True).stdout
    config = re.search(r"config:\s+(\S+) \(attnres (\w+), (\d+) blocks.*layers=(\d+) .*"
                       r"vocab=(\d+)", inspect)
    assert config, inspect
    assert (info["model_type"], info["attnres_mode"], info["attnres_num_blocks"],
            info["num_layers"], info["vocab_size"]) == (
        config[1], config[2], int(config[3]), int(config[4]), int(config[5]))
    assert info["eos_token_ids"] == [50256]  # the GPT-2 tokenizer's <|endoftext|>
    text = cli(client_bin, server, "model-info")
    assert f"served_model_name: {model['id']}\n" in text
    assert f"max_model_len: {MAX_MODEL_LEN}\n" in text


def test_health(client_bin, server):
    assert cli(client_bin, server, "health") == "SERVING\n"
    assert cli(client_bin, server, "health", "--service", "attnres.v1.Generate") == "SERVING\n"
    code, _, err = run_client(client_bin, "health", "--service", "no.such.Service",
                              target=server.grpc_target)
    assert code == 1 and "NOT_FOUND" in err
    # The target from the environment, as a container's health check would give it.
    code, out, _ = run_client(client_bin, "health",
                              env={"ATTNRES_GRPC_TARGET": server.grpc_target})
    assert (code, out) == (0, "SERVING\n")


def test_health_of_a_dead_port_fails(client_bin):
    code, out, err = run_client(client_bin, "health", "--timeout", 10,
                                target=f"127.0.0.1:{free_port()}")
    assert code != 0 and out == ""
    assert "UNAVAILABLE" in err


# --- API keys (on a generated checkpoint: model-info against its config.json) ----------------


def test_api_key_and_model_info_of_a_checkpoint(client_bin, attnres_bin, ckpt_root):
    ckpt = make_checkpoint(ckpt_root / "clients_attnres_block", "attnres_block", seed=11)
    config = json.loads((ckpt / "config.json").read_text())
    key = "client-test-secret"
    with GrpcServerProcess(attnres_bin, "--model", ckpt, "--api-key", key,
                           "--served-model-name", "keyed-model") as keyed:
        code, _, err = run_client(client_bin, "model-info", target=keyed.grpc_target,
                                  env={"ATTNRES_API_KEY": ""})
        assert code == 1 and "UNAUTHENTICATED" in err
        code, _, err = run_client(client_bin, "generate", "--prompt", "hi", "--api-key", "wrong",
                                  target=keyed.grpc_target)
        assert code == 1 and "UNAUTHENTICATED" in err
        info = json.loads(cli(client_bin, keyed, "model-info", "--json", "--api-key", key))
        assert info["served_model_name"] == "keyed-model"
        assert info["model_source"] == str(ckpt)
        assert info["model_type"] == config["model_type"]
        assert info["attnres_mode"] == config["attnres_mode"]
        assert info["attnres_num_blocks"] == config["attnres_num_blocks"]
        assert info["num_layers"] == config["num_hidden_layers"]
        assert info["vocab_size"] == config["vocab_size"]
        assert info["eos_token_ids"] == [config["eos_token_id"]]
        assert info["bos_token_id"] == config["bos_token_id"]
        # The key from the environment; health needs none.
        result = json.loads(cli(client_bin, keyed, "generate", "--prompt", "hi", "--max-tokens",
                                3, "--ignore-eos", "--json", env={"ATTNRES_API_KEY": key}))
        assert result["usage"]["completion_tokens"] == 3
        assert cli(client_bin, keyed, "health", env={"ATTNRES_API_KEY": ""}) == "SERVING\n"


# --- the Python examples ----------------------------------------------------------------------


def run_example(name, *args):
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def split_example_output(out):
    """The openai examples print: model, '--- not streamed ---', text, finish line,
    '--- streamed ---', text, finish line. Returns [(text, finish line)] per part."""
    head, rest = out.split("--- not streamed ---\n", 1)
    whole, streamed = rest.split("--- streamed ---\n", 1)
    parts = []
    for part in (whole, streamed):
        text, finish = part.rsplit("\nfinish_reason: ", 1)
        parts.append((text, "finish_reason: " + finish.strip()))
    return head, parts


def test_openai_completions_example(server, http):
    out = run_example("openai_completions.py", "--url", server.http_url + "/v1", "--prompt",
                      PROMPT, "--max-tokens", 16)
    head, [(whole, whole_finish), (streamed, streamed_finish)] = split_example_output(out)
    assert head == "model: attnres-demo\n"
    expected = http.completions.create(model="attnres-demo", prompt=PROMPT, max_tokens=16,
                                       temperature=0)
    choice = expected.choices[0]
    assert whole == streamed == choice.text
    usage = expected.usage
    assert whole_finish == streamed_finish == (
        f"finish_reason: {choice.finish_reason}; usage: prompt {usage.prompt_tokens}, "
        f"completion {usage.completion_tokens}, total {usage.total_tokens}")


def test_openai_chat_example(server, http):
    system, message = "You are terse.", "Say something about depth."
    out = run_example("openai_chat.py", "--url", server.http_url + "/v1", "--system", system,
                      "--message", message, "--max-tokens", 16)
    head, [(whole, whole_finish), (streamed, streamed_finish)] = split_example_output(out)
    assert head == "model: attnres-demo\n"
    expected = http.chat.completions.create(
        model="attnres-demo", max_tokens=16, temperature=0,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": message}])
    choice = expected.choices[0]
    assert whole == streamed == f"assistant: {choice.message.content}"
    usage = expected.usage
    assert whole_finish == streamed_finish == (
        f"finish_reason: {choice.finish_reason}; usage: prompt {usage.prompt_tokens}, "
        f"completion {usage.completion_tokens}, total {usage.total_tokens}")


def test_grpc_generate_example(server, http):
    request_id = f"example-{uuid.uuid4().hex}"
    out = run_example("grpc_generate.py", "--target", server.grpc_target, "--prompt", PROMPT,
                      "--max-tokens", 16, "--request-id", request_id)
    expected = http.completions.create(model="attnres-demo", prompt=PROMPT, max_tokens=16,
                                       temperature=0, extra_body={"return_token_ids": True})
    choice = expected.choices[0]
    usage = expected.usage
    head, rest = out.split("\n", 1)
    assert head == (f"model: attnres-demo (qwen3_attnres, attnres_mode block, "
                    f"max_model_len {MAX_MODEL_LEN})")
    assert rest == (f"{choice.text}\n"
                    f"request_id: {request_id}\n"
                    f"finish_reason: {choice.finish_reason}\n"
                    f"token_ids: {choice.model_extra['token_ids']}\n"
                    f"usage: prompt {usage.prompt_tokens}, completion {usage.completion_tokens}, "
                    f"total {usage.total_tokens}\n")
