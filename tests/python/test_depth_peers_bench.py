"""clients/bench/depth_peers/bench_depth_peers.py runs only on a lent GPU (issue #49); what can
be checked here: its reference (docs/ATTNRES.md §3 in NumPy) holds its two-phase form to the
direct softmax and catches a wrong merge, and its table puts our figures beside the peers' with
the right time ratios and rates."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "bench" / "depth_peers"))
import bench_depth_peers  # noqa: E402
import depth_reference as ref  # noqa: E402


def test_reference_two_phase_form_equals_the_direct_softmax():
    assert ref.self_check() < 1e-12


def test_reference_self_check_catches_a_wrong_merge(monkeypatch):
    original = ref.phase2
    # A merge that forgets the Phase-1 maximum's rescaling.
    monkeypatch.setattr(ref, "phase2", lambda m, s, o, p, q, eps, bias=0.0:
                        original(m * 0.5, s, o, p, q, eps, bias))
    with pytest.raises(AssertionError):
        ref.self_check()


def test_reference_phase1_matches_a_hand_computed_case():
    bank = np.array([[[1.0, 0.0]], [[0.0, 2.0]]])  # n = 2, T = 1, d = 2
    query = np.array([[1.0, 1.0]])
    m, s, o = ref.phase1(bank, query, 0.0)
    # rms: 1/sqrt(2) and 2/sqrt(2); logits: sqrt(2) for both sources.
    assert np.allclose(m, [[np.sqrt(2)]]) and np.allclose(s, [[2.0]])
    assert np.allclose(o / s[:, :, None], [[[0.5, 1.0]]])


def test_table_puts_ours_beside_the_peers_with_ratios(capsys):
    ours = [dict(phase=1, tokens=1024, entries=4, d=1024, queries=2, us=10.0, read_bytes=9e6,
                 written_bytes=1e6),
            dict(phase=2, tokens=1024, entries=4, d=1024, queries=2, us=6.0, read_bytes=4e6,
                 written_bytes=4e6)]
    shape = dict(d=1024, tokens=1024, entries=4, queries=2, matches_reference=True)
    peers = [dict(shape, peer="flash-attn-res", op="phase1", us=20.0, read_bytes=1e6,
                  written_bytes=1e6),
             dict(shape, peer="flash-attn-res", op="phase2", us=3.0, read_bytes=1e6,
                  written_bytes=1e6),
             dict(shape, peer="fast-attnres", op="one-pass", us=32.0, read_bytes=1e6,
                  written_bytes=1e6),
             dict(d=2048, tokens=1024, entries=4, queries=2, peer="fast-attnres", op="one-pass",
                  matches_reference=False, check_ratio=3.0)]
    bench_depth_peers.print_table(peers, ours, bandwidth=2e12)
    out = capsys.readouterr().out
    assert "phase1 ours/flash 0.50; phase2 ours/flash 2.00; phase1+2 ours/fast one-pass 0.50" in out
    # Ours' Phase 1: 10 MB in 10 us = 1000 GB/s, half the copy rate.
    assert any("ours" in line and "1000" in line and "50%" in line for line in out.splitlines())
    assert any("2048" in line and "off" in line for line in out.splitlines())
