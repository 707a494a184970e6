"""The depth mix of docs/ATTNRES.md §3 written out in NumPy, the reference the peer bench checks
the public AttnRes kernels against before it times them.

Sources: the n bank entries b_j [T, d] and the partial p [T, d]; a query w [d] (the RMSNorm gain
folded in). Every logit is w . x / rms(x), rms(x) = sqrt(mean(x^2) + eps).
- Phase 1, for S queries at once: m = max_j logit_j, s = sum_j e^(logit_j - m),
  o = sum_j e^(logit_j - m) b_j (unnormalised); normalised: o / s, log-sum-exp: m + log s.
- Phase 2: the partial's logit q merged by online softmax:
  h = (e^(m - M) o + e^(q - M) p) / (e^(m - M) s + e^(q - M)), M = max(m, q).
- Direct: softmax over the n + 1 sources in one go; equal to Phase 2 of Phase 1 in exact
  arithmetic (self_check() holds the two forms to each other)."""

import numpy as np


def logits(sources, query, eps):
    """sources [n, T, d], query [d] -> [n, T]."""
    x = sources.astype(np.float64)
    rms = np.sqrt(np.mean(x * x, axis=-1) + eps)
    return (x @ query.astype(np.float64)) / rms


def phase1(bank, queries, eps):
    """bank [n, T, d], queries [S, d] -> m, s [S, T], o [S, T, d] (unnormalised)."""
    m, s, o = [], [], []
    for w in queries:
        z = logits(bank, w, eps)  # [n, T]
        zm = z.max(axis=0)
        e = np.exp(z - zm)
        m.append(zm)
        s.append(e.sum(axis=0))
        o.append(np.einsum("nt,ntd->td", e, bank.astype(np.float64)))
    return np.stack(m), np.stack(s), np.stack(o)


def phase2(m, s, o, partial, query, eps, bias=0.0):
    """One sublayer's m, s [T], o [T, d] and the partial [T, d] -> the mix h [T, d]."""
    q = logits(partial[None], query, eps)[0] + bias
    big = np.maximum(m, q)
    a, b = np.exp(m - big), np.exp(q - big)
    return (a[:, None] * o + b[:, None] * partial.astype(np.float64)) / (a * s + b)[:, None]


def direct(sources, query, eps):
    """softmax_j(logit_j) weighted sum of sources [n, T, d] -> [T, d]."""
    z = logits(sources, query, eps)
    w = np.exp(z - z.max(axis=0))
    w /= w.sum(axis=0)
    return np.einsum("nt,ntd->td", w, sources.astype(np.float64))


def self_check(seed=0):
    """The two-phase form against the direct one at a few small shapes; returns the worst
    relative error (raises AssertionError past 1e-10)."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    for n, T, d, S in ((1, 3, 8, 1), (2, 5, 16, 2), (8, 7, 64, 3)):
        bank = rng.standard_normal((n, T, d))
        partial = rng.standard_normal((T, d)) * 3.0
        queries = rng.standard_normal((S, d))
        m, s, o = phase1(bank, queries, 1e-6)
        for l in range(S):
            two_phase = phase2(m[l], s[l], o[l], partial, queries[l], 1e-6)
            one_pass = direct(np.concatenate([bank, partial[None]]), queries[l], 1e-6)
            err = np.abs(two_phase - one_pass).max() / np.abs(one_pass).max()
            worst = max(worst, float(err))
            assert err < 1e-10, f"two-phase vs direct at n={n} T={T} d={d}: {err}"
            # Phase 1 normalised is the direct softmax over the bank alone.
            bank_only = direct(bank, queries[l], 1e-6)
            assert np.abs(o[l] / s[l][:, None] - bank_only).max() < 1e-10
    return worst
