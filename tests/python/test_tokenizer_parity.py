"""Parity of the C++ tokenizer (engine/tokenizer) with the Hugging Face `tokenizers` library.

For every tokenizer in <repo>/../shared/data/tokenizers/*/tokenizer.json:
  * encode() ids are identical for a few thousand varied strings, add_special_tokens on and off;
  * decode() text is identical (skip_special_tokens on and off), for those ids and for random
    id sequences (which exercise invalid UTF-8 and byte-fallback runs);
  * the IncrementalDecoder's streamed output concatenates to the full decode.

The C++ side is $ATTNRES_BUILD_DIR/tests/cpp/engine/tokenizer/tokenizer_tool (JSON lines over pipes).
A missing tool is a failure, not a skip.
"""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import tokenizers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tokenizer_corpus import build_corpus  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT.parent / "shared" / "data" / "tokenizers"
BUILD_DIR = Path(os.environ.get("ATTNRES_BUILD_DIR", REPO_ROOT / "build")).resolve()
TOOL = BUILD_DIR / "tests" / "cpp" / "engine" / "tokenizer" / "tokenizer_tool"

TOKENIZER_FILES = sorted(DATA_DIR.glob("*/tokenizer.json"))
CORPUS = build_corpus()
MAX_REPORTED = 8


def run_tool(tokenizer_json: Path, requests: list[dict]) -> list[dict]:
    assert TOOL.exists(), f"tokenizer_tool not built: {TOOL} (set ATTNRES_BUILD_DIR)"
    payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in requests)
    proc = subprocess.run([str(TOOL), str(tokenizer_json)], input=payload.encode("utf-8"),
                          capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")
    replies = [json.loads(line) for line in proc.stdout.decode("utf-8").split("\n") if line]
    assert len(replies) == len(requests), "tool answered a different number of requests"
    return replies


def test_data_present():
    assert len(TOKENIZER_FILES) >= 4, f"expected the shared tokenizers in {DATA_DIR}"
    assert len(CORPUS) > 2000


@pytest.fixture(scope="module", params=TOKENIZER_FILES, ids=lambda p: p.parent.name)
def case(request):
    path = request.param
    hf = tokenizers.Tokenizer.from_file(str(path))
    return path, hf


def test_encode_matches_hf(case):
    path, hf = case
    requests, expected = [], []
    for add_special in (True, False):
        hf_ids = [e.ids for e in hf.encode_batch(CORPUS, add_special_tokens=add_special)]
        for text, ids in zip(CORPUS, hf_ids):
            requests.append({"encode": text, "add_special_tokens": add_special})
            expected.append(ids)
    replies = run_tool(path, requests)
    mismatches = []
    for req, want, got in zip(requests, expected, replies):
        if got.get("ids") != want:
            mismatches.append(f"{req!r}\n   hf:  {want}\n   c++: {got}")
    assert not mismatches, (f"{len(mismatches)}/{len(requests)} encodings differ, e.g.\n" +
                            "\n".join(mismatches[:MAX_REPORTED]))


def _decode_cases(hf) -> list[list[int]]:
    cases = [e.ids for e in hf.encode_batch(CORPUS, add_special_tokens=True)]
    rng = random.Random(99)
    vocab = hf.get_vocab_size(with_added_tokens=True)
    byte_ids = [hf.token_to_id(f"<0x{b:02X}>") for b in range(256)]
    byte_ids = [i for i in byte_ids if i is not None]
    specials = [i for i in range(vocab - 300, vocab) if i >= 0] + [0, 1, 2]
    for _ in range(500):  # random sequences: invalid UTF-8, byte runs, specials anywhere
        seq = []
        for _ in range(rng.randint(0, 20)):
            r = rng.random()
            if byte_ids and r < 0.3:
                seq.append(rng.choice(byte_ids))
            elif r < 0.4:
                seq.append(rng.choice(specials))
            else:
                seq.append(rng.randrange(vocab))
        cases.append(seq)
    cases += [[], [0], [vocab - 1]]
    return cases


def test_decode_matches_hf(case):
    path, hf = case
    id_lists = _decode_cases(hf)
    requests, expected = [], []
    for skip in (False, True):
        texts = hf.decode_batch(id_lists, skip_special_tokens=skip)
        for ids, text in zip(id_lists, texts):
            requests.append({"decode": ids, "skip_special_tokens": skip})
            expected.append(text)
    replies = run_tool(path, requests)
    mismatches = []
    for req, want, got in zip(requests, expected, replies):
        if got.get("text") != want:
            mismatches.append(f"decode {req!r}\n   hf:  {want!r}\n   c++: {got!r}")
        elif got.get("incremental") != want:
            mismatches.append(f"incremental {req!r}\n   full: {want!r}\n   inc:  {got!r}")
    assert not mismatches, (f"{len(mismatches)}/{len(requests)} decodes differ, e.g.\n" +
                            "\n".join(mismatches[:MAX_REPORTED]))


# ---- Synthetic variants: components and flags the four real files do not exercise ----------

def _gpt2_added_flags(j):
    j["added_tokens"][0].update(lstrip=True, rstrip=True, normalized=False)
    base = {"special": False, "lstrip": False, "rstrip": False, "normalized": False,
            "single_word": False}
    j["added_tokens"] += [
        dict(base, id=50257, content="hello", single_word=True),
        dict(base, id=50258, content=" world", normalized=True),
        dict(base, id=50259, content="<tool>", special=True, rstrip=True),
        dict(base, id=50260, content="<pad>", special=True, lstrip=True),
    ]


def _llama2_metaspace_first(j):
    # The newer ("legacy": false) Llama-2 layout: Metaspace pre-tokenizer instead of normalizers.
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                          "prepend_scheme": "first", "split": False}


def _llama2_metaspace_split_decoder(j):
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                          "prepend_scheme": "always", "split": True}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"},
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
         "split": True}]}
    j["added_tokens"][1]["lstrip"] = True


def _qwen3_no_ignore_merges_bytelevel_prefix(j):
    j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True
    j["model"]["ignore_merges"] = True


def _llama3_no_decoder(j):
    j["decoder"] = None
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "NFC"}, {"type": "Replace", "pattern": {"String": "ab"}, "content": "X"}]}


VARIANTS = {
    "gpt2-added-flags": ("gpt2", _gpt2_added_flags),
    "tinyllama-metaspace-first": ("tinyllama", _llama2_metaspace_first),
    "tinyllama-metaspace-split-decoder": ("tinyllama", _llama2_metaspace_split_decoder),
    "qwen3-prefix-space-ignore-merges": ("qwen3", _qwen3_no_ignore_merges_bytelevel_prefix),
    "llama3-no-decoder-replace": ("llama3.2", _llama3_no_decoder),
}

VARIANT_EXTRA = ["hello world", "say hello, world", "hellos", " hello", "x<tool>  y",
                 "a   <pad>b", "<|endoftext|>", "  <|endoftext|>  z", "ab cab", "<s> </s>",
                 " world world", "Hello world", "\u2581already", " \u2581 x"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_synthetic_variant_matches_hf(variant, tmp_path):
    base, mutate = VARIANTS[variant]
    j = json.loads((DATA_DIR / base / "tokenizer.json").read_text(encoding="utf-8"))
    mutate(j)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
    hf = tokenizers.Tokenizer.from_file(str(path))
    texts = VARIANT_EXTRA + CORPUS[::4]
    requests, expected = [], []
    for add_special in (True, False):
        for text, enc in zip(texts, hf.encode_batch(texts, add_special_tokens=add_special)):
            requests.append({"encode": text, "add_special_tokens": add_special})
            expected.append(("ids", enc.ids))
            for skip in (False, True):
                requests.append({"decode": enc.ids, "skip_special_tokens": skip})
                expected.append(("text", hf.decode(enc.ids, skip_special_tokens=skip)))
    replies = run_tool(path, requests)
    mismatches = []
    for req, (key, want), got in zip(requests, expected, replies):
        if got.get(key) != want or (key == "text" and got.get("incremental") != want):
            mismatches.append(f"{req!r}\n   hf:  {want!r}\n   c++: {got!r}")
    assert not mismatches, (f"{len(mismatches)}/{len(requests)} differ, e.g.\n" +
                            "\n".join(mismatches[:MAX_REPORTED]))
