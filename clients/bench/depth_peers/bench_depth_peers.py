"""The public AttnRes GPU kernels on the depth-mix shapes of `bench_cuda_backend --only depth`,
on the same GPU, beside our figures (issue #49).

Peers (PyPI, pure-Python Triton kernels, installed from carried wheels):
- flash-attn-res 0.1.12: Phase 1 (`phase_1_batched_attention_triton_op`: S queries over the n
  bank entries -> the normalised mix in bf16 and its log-sum-exp) and Phase 2
  (`phase_2_online_softmax_merge_triton_op`: the partial merged in, bf16 out; no bias, no
  PreNorm). Its forward kernels are autotuned over six configs: pinned here to one
  (--warps, --stages; --autotune lets it choose) so that no autotuning spends the lease.
- fast-attnres 2.1.0 (imports as `attnres`): `attnres(values [S, T, d], query [d])`, the whole
  mix over the n + 1 sources in one pass (bf16 in and out; its forward is not autotuned).

Each is first checked against depth_reference.py (docs/ATTNRES.md §3 in float64) on the same
inputs; a peer whose output is off is reported and not timed. Then the median of --iters calls
between CUDA events, the bytes each call reads (its inputs) and writes (every tensor it
returns), GB/s against the copy rate of our bench's JSON (--ours), and our Phase 1 / Phase 2
beside them.

  bench_depth_peers.py --ours depth_ours.json [--json out.json]   (needs CUDA, torch, Triton)
  bench_depth_peers.py --self-check                                 (NumPy only: the reference)

Exit status: 0 when every peer ran and matched the reference, 1 otherwise (a peer that could not
be imported counts: the comparison is the point)."""

import argparse
import json
import statistics
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
import depth_reference as ref  # noqa: E402

EPS = 1e-6
RTOL, ATOL = 2e-2, 2e-2  # bf16 outputs (8 bits of mantissa) over inputs of order 1


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 8192])
    p.add_argument("--entries", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--dims", type=int, nargs="+", default=[1024, 2048])
    p.add_argument("--queries", type=int, default=2, help="S, the queries of one Phase 1")
    p.add_argument("--iters", type=int, default=20)
    # One program per token holds its n x d sources in registers: 8 warps keep d 2048 at 64
    # floats a thread (4 would spill).
    p.add_argument("--warps", type=int, default=8, help="flash-attn-res's pinned num_warps")
    p.add_argument("--stages", type=int, default=2, help="flash-attn-res's pinned num_stages")
    p.add_argument("--autotune", action="store_true",
                   help="let flash-attn-res autotune over its six configs instead (slow)")
    p.add_argument("--check-tokens", type=int, default=1024,
                   help="outputs are checked on the first this many tokens of each shape")
    p.add_argument("--ours", type=Path, help="bench_cuda_backend --only depth --json output")
    p.add_argument("--json", type=Path, help="write every row here")
    p.add_argument("--self-check", action="store_true",
                   help="check the NumPy reference's two forms against each other and exit")
    return p.parse_args(argv)


def load_peers(args):
    """{name: module or the reason it is unavailable}."""
    peers = {}
    try:
        import triton
        import flash_attn_res
        from flash_attn_res.kernels import phase_1, phase_2
        if not args.autotune:
            pinned = [triton.Config({}, num_warps=args.warps, num_stages=args.stages)]
            for kernel in (phase_1.phase_1_batched_attention_forward_kernel,
                           phase_2.phase_2_online_softmax_merge_forward_kernel):
                flash_attn_res.set_autotune_configs(kernel, pinned)
        peers["flash-attn-res"] = flash_attn_res
    except Exception as e:  # an import error names what is missing
        peers["flash-attn-res"] = f"unavailable: {type(e).__name__}: {e}"
    try:
        import attnres as fast_attnres
        peers["fast-attnres"] = fast_attnres
    except Exception as e:
        peers["fast-attnres"] = f"unavailable: {type(e).__name__}: {e}"
    return peers


def median_us(torch, fn, iters):
    for _ in range(3):  # warm-ups: Triton compiles on the first call of a shape
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def nbytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def close(torch, got, want):
    """(ok, worst |got - want| / (atol + rtol |want|))."""
    err = (got.double().cpu() - torch.from_numpy(want)).abs()
    ratio = (err / (ATOL + RTOL * torch.from_numpy(want).abs())).max().item()
    return ratio <= 1.0, ratio


def run_shape(torch, peers, args, d, T, n, rows, failures):
    S = args.queries
    g = torch.Generator(device="cuda").manual_seed(1000 * d + 10 * n + T)
    bank = torch.randn((n, T, d), device="cuda", generator=g).to(torch.bfloat16)
    partial = torch.randn((T, d), device="cuda", generator=g).to(torch.bfloat16)
    queries = (torch.randn((S, d), device="cuda", generator=g) / d**0.5).to(torch.bfloat16)
    # The reference on the first check_tokens tokens, from the same bf16 values.
    c = min(T, args.check_tokens)
    bank_np = bank[:, :c].double().cpu().numpy()
    partial_np = partial[:c].double().cpu().numpy()
    q_np = queries.double().cpu().numpy()
    m, s, o = ref.phase1(bank_np, q_np, EPS)
    want_p1 = o / s[:, :, None]
    want_p2 = ref.phase2(m[0], s[0], o[0], partial_np, q_np[0], EPS)
    shape = {"d": d, "tokens": T, "entries": n, "queries": S}

    def record(peer, op, fn, outputs, inputs, ok, ratio):
        row = dict(shape, peer=peer, op=op, check_ratio=ratio, matches_reference=ok)
        if ok:
            row["us"] = median_us(torch, fn, args.iters)
            row["read_bytes"] = nbytes(inputs)
            row["written_bytes"] = nbytes(outputs)
        else:
            failures.append(f"{peer} {op} at d {d} T {T} n {n}: off the reference ({ratio:.2f})")
        rows.append(row)

    flash = peers["flash-attn-res"]
    if not isinstance(flash, str):
        from flash_attn_res.ops import phase_1 as p1_ops
        from flash_attn_res.ops import phase_2 as p2_ops
        q32 = queries.float()
        bank4 = bank.unsqueeze(1)  # [n, B = 1, T, d]
        p1 = lambda: p1_ops._phase_1_batched_attention_forward_with_aux_triton_op(bank4, q32, EPS)
        out = p1()
        ok, ratio = close(torch, out[0][:, 0, :c], want_p1)
        record("flash-attn-res", "phase1", p1, out, [bank4, q32], ok, ratio)
        normalised, lse = out[0][0], out[1][0]  # sublayer 0: [B, T, d], [B, T]
        part3 = partial.unsqueeze(0)
        p2 = lambda: p2_ops._phase_2_online_softmax_merge_forward_with_aux_triton_op(
            part3, q32[0], normalised, lse, EPS)
        out2 = p2()
        ok, ratio = close(torch, out2[0][0, :c], want_p2)
        record("flash-attn-res", "phase2", p2, out2, [part3, q32[0], normalised, lse], ok, ratio)

    fast = peers["fast-attnres"]
    if not isinstance(fast, str):
        values = torch.cat([bank, partial.unsqueeze(0)])  # [n + 1, T, d]: the partial last
        one_pass = lambda: fast.attnres(values, queries[0], eps=EPS)
        out = one_pass()
        ok, ratio = close(torch, out[:c], want_p2)
        record("fast-attnres", "one-pass", one_pass, [out], [values, queries[0]], ok, ratio)


def print_table(rows, ours, bandwidth):
    def rate(r):
        if "us" not in r:
            return "      -"
        gbs = (r["read_bytes"] + r["written_bytes"]) / (r["us"] * 1e-6) / 1e9
        frac = f" {100 * gbs * 1e9 / bandwidth:4.0f}%" if bandwidth else ""
        return f"{gbs:7.0f}{frac}"

    print(f"\n{'d':>5} {'T':>6} {'n':>2}  {'who':<15} {'op':<9} {'us':>9} {'read MB':>9} "
          f"{'write MB':>9} {'GB/s':>7} {'of copy':>6}")
    keyed = {}
    for r in ours:
        keyed.setdefault((r["d"], r["tokens"], r["entries"]), []).append(
            dict(r, peer="ours", op=f"phase{r['phase']}", matches_reference=True))
    for r in rows:
        keyed.setdefault((r["d"], r["tokens"], r["entries"]), []).append(r)
    for key in sorted(keyed):
        for r in keyed[key]:
            us = f"{r['us']:9.1f}" if "us" in r else "      off"
            mb = (f"{r['read_bytes'] / 1e6:9.1f} {r['written_bytes'] / 1e6:9.1f}"
                  if "us" in r else f"{'-':>9} {'-':>9}")
            print(f"{key[0]:5d} {key[1]:6d} {key[2]:2d}  {r['peer']:<15} {r['op']:<9} {us} {mb} "
                  f"{rate(r)}")
        # Ours against each peer on the same work: Phase 1, Phase 2, and both phases against
        # the one-pass mix.
        by = {(r["peer"], r["op"]): r.get("us") for r in keyed[key]}
        ours1, ours2 = by.get(("ours", "phase1")), by.get(("ours", "phase2"))
        notes = []
        if ours1 and by.get(("flash-attn-res", "phase1")):
            notes.append(f"phase1 ours/flash {ours1 / by[('flash-attn-res', 'phase1')]:.2f}")
        if ours2 and by.get(("flash-attn-res", "phase2")):
            notes.append(f"phase2 ours/flash {ours2 / by[('flash-attn-res', 'phase2')]:.2f}")
        if ours1 and ours2 and by.get(("fast-attnres", "one-pass")):
            notes.append(f"phase1+2 ours/fast one-pass "
                         f"{(ours1 + ours2) / by[('fast-attnres', 'one-pass')]:.2f}")
        if notes:
            print(f"{'':16}time ratios (below 1: ours faster): {'; '.join(notes)}")


def main(argv=None):
    args = parse_args(argv)
    worst = ref.self_check()
    print(f"reference: two-phase against direct softmax, worst relative error {worst:.1e}")
    if args.self_check:
        return 0
    ours, bandwidth = [], 0.0
    if args.ours:
        if args.ours.exists():
            data = json.loads(args.ours.read_text())
            ours, bandwidth = data["rows"], data["copy_bandwidth_bytes_per_s"]
        else:
            print(f"no {args.ours}: our figures are not beside the peers'")
    try:
        import torch
    except ImportError as e:
        print(f"no torch here ({e}): the peers cannot run")
        return 1
    if not torch.cuda.is_available():
        print("no CUDA device: the peers cannot run")
        return 1
    peers = load_peers(args)
    failures = [f"{name} {p}" for name, p in peers.items() if isinstance(p, str)]
    for name, p in peers.items():
        print(f"{name}: {p if isinstance(p, str) else getattr(p, '__file__', 'loaded')}")
    rows = []
    for d in args.dims:
        for T in args.tokens:
            for n in args.entries:
                run_shape(torch, peers, args, d, T, n, rows, failures)
                torch.cuda.empty_cache()
    print_table(rows, ours, bandwidth)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                         "copy_bandwidth_bytes_per_s": bandwidth,
                                         "peers": rows, "ours": ours}, indent=1))
    for f in failures:
        print(f"FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
