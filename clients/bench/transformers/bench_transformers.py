#!/usr/bin/env python3
"""The peer figures of issues #13 and #14: a Hugging Face checkpoint under transformers on the
same GPU, in the same run as our CUDA benches (kernels/cuda/gpu_lease.sh, step peerbench).

    bench_transformers.py MODEL_DIR [--batch 1 64] [--context 1024] [--new-tokens 64]
                          [--prefill 1024 8192] [--device cuda] [--json FILE] [--no-compile]

Decode (transformers at its best for decode: a static KV cache and a compiled forward, what
`generate(cache_implementation="static")` sets up on a GPU): for each batch size, B random
prompts of --context tokens, generate() of --new-tokens tokens (greedy, EOS ignored) with a
streamer that notes when each step's tokens reach the host; ms per step = the median interval
between steps over two calls, after two unmeasured calls (compilation and warm-up).
Prefill: the forward of one random prompt of T tokens (no cache, only the last row's logits),
median of 5 after 2 warm-ups; tokens/s.

Works with transformers 4.5x and 5.x (it uses generate() and a plain forward, whose keyword
names did not change). Prints one line per figure and, with --json, writes them all.
"""

import argparse
import json
import statistics
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--new-tokens", type=int, default=64, help="tokens per generate() call")
    p.add_argument("--prefill", type=int, nargs="*", default=[1024, 8192])
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--no-compile", action="store_true",
                   help="leave the forward eager (when torch.compile fails on this machine)")
    return p.parse_args(argv)


def synchronize(torch, device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(torch, device, fn):
    synchronize(torch, device)
    start = time.perf_counter()
    fn()
    synchronize(torch, device)
    return time.perf_counter() - start


def load(torch, transformers, model_dir, device):
    # `dtype` since transformers 4.56 (`torch_dtype` before, deprecated in 5.x); an older
    # version keeps f32, so cast whatever came back.
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    return model.to(device=device, dtype=torch.bfloat16).eval()


class TokenClock:
    """A generate() streamer that only notes when each step's tokens reach the host (generate
    copies them with .cpu(), a synchronisation, before handing them over)."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def decode_ms_per_step(torch, model, device, batch, context, new_tokens, compile_forward):
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(batch)
    prompts = torch.randint(0, vocab, (batch, context), generator=generator).to(device)
    mask = torch.ones_like(prompts)
    # min_new_tokens = max_new_tokens: EOS cannot end a row early.
    config = dict(do_sample=False, cache_implementation="static", pad_token_id=0,
                  max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    if not compile_forward:
        config["disable_compile"] = True

    def steps_ms():
        clock = TokenClock()
        model.generate(input_ids=prompts, attention_mask=mask, streamer=clock, **config)
        # times[0]: the prompt handed over; times[1]: the first token (prefill); then one
        # per decode step.
        return [(b - a) * 1e3 for a, b in zip(clock.times[1:], clock.times[2:])]

    for _ in range(2):  # compilation, cache allocation, warm-up
        steps_ms()
    return statistics.median(steps_ms() + steps_ms())


def prefill_tokens_per_s(torch, model, device, tokens):
    generator = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=generator).to(device)

    def forward():
        model(input_ids=ids, use_cache=False, logits_to_keep=1)

    for _ in range(2):
        timed(torch, device, forward)
    seconds = statistics.median(timed(torch, device, forward) for _ in range(5))
    return tokens / seconds, seconds * 1e3


def main(argv):
    args = parse_args(argv)
    import torch
    import transformers

    figures = {"model_dir": args.model_dir, "transformers": transformers.__version__,
               "torch": torch.__version__, "device": args.device, "decode": [], "prefill": []}
    if args.device.startswith("cuda"):
        figures["gpu"] = torch.cuda.get_device_name(0)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{figures.get('gpu', args.device)}: {args.model_dir}", flush=True)
    model = load(torch, transformers, args.model_dir, args.device)
    with torch.inference_mode():
        for batch in args.batch:
            ms = decode_ms_per_step(torch, model, args.device, batch, args.context,
                                    args.new_tokens, not args.no_compile)
            figures["decode"].append({"batch": batch, "context": args.context, "ms_per_step": ms})
            print(f"  decode batch {batch:3d}, context {args.context}: {ms:.3f} ms/step "
                  f"({batch / ms * 1e3:.0f} tok/s)", flush=True)
        for tokens in args.prefill:
            rate, ms = prefill_tokens_per_s(torch, model, args.device, tokens)
            figures["prefill"].append({"tokens": tokens, "ms": ms, "tokens_per_s": rate})
            print(f"  prefill {tokens:5d} tokens: {ms:.2f} ms, {rate:.0f} tok/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
