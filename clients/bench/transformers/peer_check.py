#!/usr/bin/env python3
"""Correctness against the peer on a GPU machine: our engine (`attnres`, --device cuda and
--device cpu) and transformers itself on the same checkpoint directory, in bf16.

    peer_check.py MODEL_DIR --attnres BIN [--json OUT] [--prompt-len 32] [--new-tokens 64]
                  [--device cuda|cpu]   (cpu: everything on the CPU, to try the script out)

Checked, on a random prompt over the GPT-2 tokenizer's ids:
- greedy continuation of --new-tokens tokens: ours on CUDA (`attnres generate`, EOS ignored)
  against transformers' own greedy loop in bf16 on the GPU, its argmax taken over the ids the
  tokenizer can decode, as our sampler's is (the checkpoint's 151936 rows are the Qwen3
  shape, its tokenizer GPT-2's 50257 ids: the rest are padding rows, never sampled). A first divergence is reported
  with the top-2 margin of transformers' float32 logits at that position: a divergence at a
  near-tie (a margin under twice what bf16 rounding moves transformers' own logits of that
  row) is not a defect, one at a clear margin is.
- logits of every position of prompt + continuation (`attnres logits`: the prompt as one
  prefill step, each later token as a decode step through the KV cache), ours on CUDA and
  on the CPU, against transformers in bf16 and in float32 (the bf16 weights upcast):
  relative error max|a - b| / max|b|. Transformers' own bf16 error against its float32 run
  is printed beside ours, as the scale of bf16 rounding.
Exit status 1 when ours on CUDA is further from float32 than 3x transformers' own bf16
error, or the greedy tokens diverge at a clear margin.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np



def relative_error(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def first_divergence(a, b):
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None


def run_cli(cmd):
    """Runs attnres; on failure its stderr is printed before the error is raised."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        print(out.stderr[-4000:], file=sys.stderr)
        raise RuntimeError(f"{cmd[1]} exited with {out.returncode}")
    return out


def ours_greedy(bin_path, model_dir, prompt, n_new, device):
    out = run_cli(
        [bin_path, "generate", "--model", str(model_dir), "--device", device,
         "--prompt-ids", ",".join(map(str, prompt)), "--max-tokens", str(n_new),
         "--temperature", "0", "--ignore-eos", "--json"])
    return json.loads(out.stdout.strip().splitlines()[-1])["token_ids"]


def ours_logits(bin_path, model_dir, ids, prefill, device, tmp):
    path = Path(tmp) / f"logits_{device}.npy"
    run_cli(
        [bin_path, "logits", "--model", str(model_dir), "--device", device,
         "--token-ids", ",".join(map(str, ids)), "--prefill", str(prefill), "--out", str(path)])
    return np.load(path)


def hf_greedy(model, prompt, n_new, decodable, torch):
    ids = torch.tensor([prompt], device=model.device)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        tokens = []
        for _ in range(n_new):
            nxt = int(out.logits[0, -1, :decodable].float().argmax())
            tokens.append(nxt)
            out = model(input_ids=torch.tensor([[nxt]], device=model.device),
                        past_key_values=out.past_key_values, use_cache=True)
    return tokens


def hf_logits(model, ids, torch):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids], device=model.device)).logits[0].float().cpu().numpy()


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("--attnres", required=True, help="the attnres binary (a CUDA build)")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = p.parse_args(argv)

    import torch
    import transformers

    decodable = len(transformers.AutoTokenizer.from_pretrained(args.model_dir))
    prompt = [int(x) for x in
              np.random.default_rng(args.seed).integers(0, decodable, args.prompt_len)]
    result = {"model": args.model_dir, "prompt_len": args.prompt_len,
              "new_tokens": args.new_tokens, "decodable_ids": decodable}

    ours = ours_greedy(args.attnres, args.model_dir, prompt, args.new_tokens, args.device)
    bf16 = transformers.AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=torch.bfloat16).to(args.device).eval()
    theirs = hf_greedy(bf16, prompt, args.new_tokens, decodable, torch)
    seq = prompt + ours
    logits = {"hf_bf16": hf_logits(bf16, seq, torch)}
    del bf16
    f32 = transformers.AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=torch.float32).to(args.device).eval()
    logits["hf_f32"] = hf_logits(f32, seq, torch)
    del f32
    with tempfile.TemporaryDirectory() as tmp:
        for device in sorted({args.device, "cpu"}, reverse=True):
            logits[f"ours_{device}"] = ours_logits(args.attnres, args.model_dir, seq,
                                                   args.prompt_len, device, tmp)

    ref = logits["hf_f32"][:, : logits["ours_cpu"].shape[1]]
    for name in sorted({"hf_bf16", f"ours_{args.device}", "ours_cpu"}):
        result[f"rel_err_{name}_vs_hf_f32"] = relative_error(logits[name][:, : ref.shape[1]], ref)
    ours_dev = logits[f"ours_{args.device}"]
    result[f"rel_err_ours_{args.device}_vs_hf_bf16"] = relative_error(
        ours_dev, logits["hf_bf16"][:, : ref.shape[1]])
    result[f"rel_err_ours_{args.device}_vs_ours_cpu"] = relative_error(ours_dev, logits["ours_cpu"])
    # Ours against itself: generate's tokens against the argmax of `attnres logits` on the same
    # tokens (no transformers involved; a near-tie may differ, the two run different GEMMs).
    own = [int(np.argmax(ours_dev[args.prompt_len - 1 + i, :decodable])) for i in range(len(ours))]
    result["greedy_ours_first_divergence_from_own_logits"] = first_divergence(ours, own)
    k = first_divergence(ours, theirs)
    result["greedy_first_divergence"] = k
    clear_divergence = False
    if k is not None:
        pos = args.prompt_len - 1 + k
        top2 = np.sort(ref[pos, :decodable])[-2:]
        noise = float(np.max(np.abs(logits["hf_bf16"][pos, :decodable] - ref[pos, :decodable])))
        result["greedy_divergence_margin_f32"] = float(top2[1] - top2[0])
        result["greedy_divergence_bf16_noise"] = noise
        clear_divergence = result["greedy_divergence_margin_f32"] >= 2 * noise
    result["greedy_ours"] = ours
    result["greedy_transformers"] = theirs

    for key, value in result.items():
        if not isinstance(value, list):
            print(f"{key}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    bad = result[f"rel_err_ours_{args.device}_vs_hf_f32"] > 3 * result["rel_err_hf_bf16_vs_hf_f32"]
    print("peer check:", "FAILED" if bad or clear_divergence else "ok")
    return 1 if bad or clear_divergence else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
