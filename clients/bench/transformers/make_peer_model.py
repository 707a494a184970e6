#!/usr/bin/env python3
"""A random Qwen3 checkpoint of the Qwen3-0.6B shape, written by transformers itself, for the
peer comparison on a GPU machine (which has torch and transformers but maybe not our test
dependencies): both our engine and transformers then load these very files.

    make_peer_model.py OUT_DIR [--layers 28] [--max-positions 40960]

Weights: transformers' own random initialisation (normal, std = initializer_range), in bf16;
the GPT-2 tokenizer from engine/model/assets (its 50257 ids; the other rows of the 151936-row
embedding are never produced by it). Speed does not depend on the values.
"""

import argparse
import shutil
import sys
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[3] / "engine" / "model" / "assets" / "gpt2"


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--max-positions", type=int, default=40960)
    args = p.parse_args(argv)

    import torch
    import transformers

    config = transformers.Qwen3Config(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=args.layers,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
        max_position_embeddings=args.max_positions, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=50256, eos_token_id=50256)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    out = Path(args.out_dir)
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ASSETS / name, out / name)
    print(f"{out}: Qwen3, {args.layers} layers, d 1024, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, bf16")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
