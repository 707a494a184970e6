#!/usr/bin/env python3
"""Load benchmark: N concurrent streaming clients against a running server's OpenAI API.

    python3 clients/bench/stream_load.py --url http://127.0.0.1:8000 --clients 256 \
        --max-tokens 32 --prompt-words 32

Every client sends one streaming /v1/completions request at once (a burst) and reads it to
the end. Prints request and token throughput, TTFT and inter-token latency percentiles, and
the number of failed requests (any non-200, in-band error, or short output). Exit code 1 when
any request failed. A benchmark, not a test: the figures go to docs/BENCHMARKS.md.
(`attnres bench serve` will replace this with vLLM's full methodology.)
"""

import argparse
import asyncio
import statistics
import sys
import time

import openai


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


async def one_request(client, model, i, args):
    prompt = " ".join(f"w{(i * 31 + j) % 97}" for j in range(args.prompt_words))
    start = time.perf_counter()
    first = None
    stamps = []
    tokens = 0
    try:
        stream = await client.completions.create(
            model=model, prompt=prompt, max_tokens=args.max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
            if chunk.choices and chunk.choices[0].text:
                now = time.perf_counter()
                first = first or now
                stamps.append(now)
    except openai.APIError as e:
        return {"ok": False, "why": repr(e)}
    end = time.perf_counter()
    if tokens != args.max_tokens:
        return {"ok": False, "why": f"{tokens} tokens instead of {args.max_tokens}"}
    return {"ok": True, "ttft": (first or end) - start, "e2e": end - start, "tokens": tokens,
            "itl": [b - a for a, b in zip(stamps, stamps[1:])]}


async def main_async(args):
    client = openai.AsyncOpenAI(base_url=args.url + "/v1", api_key=args.api_key, max_retries=0,
                                timeout=args.timeout)
    model = (await client.models.list()).data[0].id
    start = time.perf_counter()
    results = await asyncio.gather(*(one_request(client, model, i, args)
                                     for i in range(args.clients)), return_exceptions=True)
    duration = time.perf_counter() - start
    ok = [r for r in results if isinstance(r, dict) and r["ok"]]
    failed = [r for r in results if not (isinstance(r, dict) and r["ok"])]
    ttft = [r["ttft"] * 1e3 for r in ok]
    itl = [g * 1e3 for r in ok for g in r["itl"]]
    tokens = sum(r["tokens"] for r in ok)
    print(f"clients {args.clients}, max_tokens {args.max_tokens}, prompt ~{args.prompt_words} words")
    print(f"successful requests   {len(ok)}")
    print(f"failed requests       {len(failed)}")
    print(f"duration (s)          {duration:.2f}")
    print(f"request throughput    {len(ok) / duration:.2f} req/s")
    print(f"output throughput     {tokens / duration:.1f} tok/s")
    for name, values in (("TTFT (ms)", ttft), ("ITL (ms)", itl)):
        mean = statistics.fmean(values) if values else float("nan")
        print(f"{name:<21} mean {mean:.1f}  median {percentile(values, 50):.1f}  "
              f"p99 {percentile(values, 99):.1f}")
    for r in failed[:5]:
        print("failure:", r if isinstance(r, dict) else repr(r), file=sys.stderr)
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompt-words", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--api-key", default="unused")
    sys.exit(asyncio.run(main_async(parser.parse_args())))


if __name__ == "__main__":
    main()
