#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora into tests/fuzz/corpus/<fuzzer>/ (committed; rerun after
changing a request format). Each seed is a small valid (or nearly valid) input, so the
fuzzers start from the inputs' real shapes.

    .venv/bin/python tests/fuzz/make_corpus.py
"""

import json
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = HERE / "corpus"


def write(fuzzer: str, name: str, data: bytes | str) -> None:
    d = OUT / fuzzer
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data.encode() if isinstance(data, str) else data)


def tokenizer_seeds():
    write("tokenizer_fuzzer", "encode_text", b"\x80Hello, world! <|im_start|>user\ncaf\xc3\xa9 \xf0\x9f\x98\x80")
    write("tokenizer_fuzzer", "encode_invalid_utf8", b"\x00abc\xff\xfe")
    ids = struct.pack("<6I", 9707, 11, 1879, 0, 151643, 151644)
    write("tokenizer_fuzzer", "decode_ids", b"\x01" + ids)
    write("tokenizer_fuzzer", "incremental_ids", b"\x02" + ids + struct.pack("<2I", 2, 0xFFFFFFFF))


def config_seeds():
    base = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "vocab_size": 512, "max_position_embeddings": 256,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
    write("config_json_fuzzer", "qwen3_v4", json.dumps({**base, "rope_theta": 1e6,
                                                        "torch_dtype": "bfloat16"}))
    write("config_json_fuzzer", "qwen3_v5_yarn", json.dumps({**base, "dtype": "bfloat16",
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                            "original_max_position_embeddings": 64}}))
    write("config_json_fuzzer", "attnres", json.dumps({**base, "model_type": "qwen3_attnres",
        "attnres_mode": "block", "attnres_num_blocks": 2, "attnres_gate_type": "bias"}))
    write("config_json_fuzzer", "llama3", json.dumps({**base, "model_type": "llama",
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 128},
        "eos_token_id": [1, 2]}))


def safetensors_seeds():
    def file(header: dict, data: bytes) -> bytes:
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        return struct.pack("<Q", len(h)) + h + data
    write("safetensors_fuzzer", "two_tensors", file(
        {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
         "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
         "__metadata__": {"format": "pt"}}, bytes(range(22))))
    write("safetensors_fuzzer", "scalar_and_i64", file(
        {"s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
         "i": {"dtype": "I64", "shape": [1], "data_offsets": [4, 12]}}, bytes(12)))


def jinja_seeds():
    write("jinja_fuzzer", "chatml",
          "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    write("jinja_fuzzer", "filters_and_macros",
          "{% macro m(x, y=2) %}{{ x|upper }}{{ y * 3 }}{% endmacro %}{% set ns = namespace(a=0) %}"
          "{% for t in tools %}{{ t|tojson }}{% set ns.a = ns.a + 1 %}{% endfor %}"
          "{{ m('a') }}{{ messages|length }}{{ (messages|last).content|trim|replace('4','x') }}"
          "{% if messages[0].role == 'system' %}{{ raise_exception('no system') if false }}{% endif %}")
    for name in ("qwen3", "llama3.2"):
        cfg = ROOT.parent / "shared" / "data" / "tokenizers" / name / "tokenizer_config.json"
        if cfg.exists():
            template = json.loads(cfg.read_text()).get("chat_template")
            if isinstance(template, str):
                write("jinja_fuzzer", name, template)


def sse_seeds():
    chunk = json.dumps({"choices": [{"index": 0, "text": "hi", "finish_reason": None}]})
    write("sse_parser_fuzzer", "crlf_stream", "\x03" + f"data: {chunk}\r\n\r\n: keep-alive\r\n\r\n"
          "event: x\ndata: a\ndata: b\n\ndata: [DONE]\n\n")
    write("sse_parser_fuzzer", "cr_only", "\x00data:x\rdata: y\r\rid: 1\r")


def openai_seeds():
    write("openai_requests_fuzzer", "completion", "\x00" + json.dumps({
        "model": "fuzz", "prompt": ["Hello", [1, 2, 3]], "max_tokens": 4, "temperature": 0.5,
        "top_p": 0.9, "logprobs": 2, "echo": True, "stop": ["\n"], "n": 2, "seed": 3,
        "logit_bias": {"11": 5}, "allowed_token_ids": [1, 2, 11], "stream": True,
        "stream_options": {"include_usage": True}, "return_depth_attention": True}))
    write("openai_requests_fuzzer", "chat", "\x01" + json.dumps({
        "model": "fuzz", "messages": [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "max_completion_tokens": 4, "logprobs": True, "top_logprobs": 2,
        "response_format": {"type": "text"}, "tools": [], "stop": "x"}))
    write("openai_requests_fuzzer", "tokenize", "\x02" + json.dumps({
        "model": "fuzz", "prompt": "Hello world", "add_special_tokens": False}))
    write("openai_requests_fuzzer", "tokenize_chat", "\x02" + json.dumps({
        "messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": True}))
    write("openai_requests_fuzzer", "responses", "\x03" + json.dumps({
        "model": "fuzz", "instructions": "Be brief.", "max_output_tokens": 4,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                  {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": "auto", "text": {"format": {"type": "text"}}, "metadata": {"k": "v"}}))


def grpc_seeds():
    sys.path.insert(0, str(ROOT / "tests" / "python"))
    try:
        from grpc_stubs import pb
    except Exception as e:  # noqa: BLE001 - grpcio-tools missing: keep the other seeds
        print(f"skipping gRPC seeds: {e}")
        return
    write("grpc_request_fuzzer", "text", pb.GenerateRequest(
        text="Hello", stream=True, sampling_params=pb.SamplingParams(
            temperature=0.7, top_k=5, max_tokens=8, stop=["\n"], logprobs=2, n=2,
            logit_bias={11: 2.0}, allowed_token_ids=[1, 11])).SerializeToString())
    write("grpc_request_fuzzer", "ids", pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=[1, 2, 3]), request_id="r",
        sampling_params=pb.SamplingParams(max_tokens=2, seed=4)).SerializeToString())


if __name__ == "__main__":
    for make in (tokenizer_seeds, config_seeds, safetensors_seeds, jinja_seeds, sse_seeds,
                 openai_seeds, grpc_seeds):
        make()
    print(f"wrote {sum(1 for _ in OUT.rglob('*') if _.is_file())} seeds under {OUT}")
