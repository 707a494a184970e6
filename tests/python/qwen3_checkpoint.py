"""A random-weight Qwen3 checkpoint that carries the real Qwen3 tokenizer and chat template
(../shared/data/tokenizers/qwen3), so the server picks the hermes tool-call parser and the
qwen3 reasoning parser from the template, as it does for a real Qwen3 model."""

import json
import shutil
from pathlib import Path

from make_checkpoint import make_checkpoint

REPO = Path(__file__).resolve().parents[2]
QWEN3 = REPO.parent / "shared" / "data" / "tokenizers" / "qwen3"
QWEN3_VOCAB = 151936
BOS = 151643
IM_END = 151645  # <|im_end|>, the end of an assistant turn


def make_qwen3_checkpoint(out: Path, seed: int, layers: int = 2) -> Path:
    path = make_checkpoint(out, "qwen3", seed=seed, layers=layers, vocab_size=QWEN3_VOCAB)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(QWEN3 / name, path / name)
    config = json.loads((path / "config.json").read_text())
    config.update(bos_token_id=BOS, eos_token_id=IM_END, max_position_embeddings=4096)
    (path / "config.json").write_text(json.dumps(config))
    (path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS, "eos_token_id": [IM_END, BOS]}))
    return path


# Tools whose arguments take bounded values, so a random model's constrained call ends within a
# few tokens.
CITY_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"enum": ["Oslo", "Zürich", "東京"]},
                                  "days": {"enum": [1, 2, 3]}},
                   "required": ["city", "days"], "additionalProperties": False}}}
NOW_TOOL = {"type": "function", "function": {
    "name": "now", "description": "The time",
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}
