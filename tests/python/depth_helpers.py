"""Shared pieces of the depth-attention tests: the engine's matrices (JSON lists with null, or
gRPC row-major floats with NaN) as NumPy arrays, the reference's expectations for a prompt and
its generated tokens, and the comparison with a stated tolerance.

Expectations come from tests/reference/attnres_ref.py (the direct softmax form of docs/ATTNRES.md,
independent of the engine): Model.depth_matrices(ids) gives position t's matrix [mixes,
width] with mix k's alpha in the columns of its sources (bank + [partial] in columns
[0, n_sources) for 2a / 2b; see the reference for the §2d modes) and NaN elsewhere;
Model.depth_sources() labels the columns.
  prompt_mean  = mean over the prompt positions of their matrices
  per_token[k] = the matrix of position len(prompt) + k - 1 (the forward that produced token k)
"""

import numpy as np

# Absolute, on weights in [0, 1] (the engine computes in f32, the reference in float64 from
# the same stored weights; bf16 checkpoints magnify the f32 rounding through the layers).
F32_TOL = 1e-4
BF16_TOL = 2e-2


def json_matrix(rows) -> np.ndarray:
    return np.array([[np.nan if v is None else float(v) for v in row] for row in rows])


def proto_matrix(m) -> np.ndarray:
    assert len(m.values) == m.rows * m.cols, (m.rows, m.cols, len(m.values))
    return np.array(m.values, dtype=np.float64).reshape(m.rows, m.cols)


def sublayer_labels(model) -> list[str]:
    """What the engine calls the reference's mixes ("layers.3.attn" -> "layer 3 attention",
    delta_v's "layers.3.attn_v" -> "layer 3 attention (V stream)")."""
    kinds = {"attn": "attention", "mlp": "mlp", "attn_v": "attention (V stream)"}
    out = []
    for name in model.depth_names():
        if name == "final":
            out.append("final")
        else:
            _, i, kind = name.split(".")
            out.append(f"layer {i} {kinds[kind]}")
    return out


def expected(model, prompt, generated):
    """(prompt mean [mixes, width], per-token matrices) for `generated` tokens after `prompt`."""
    ids = list(prompt) + list(generated)
    mats = model.depth_matrices(ids[:-1] if generated else ids)
    mean = mats[: len(prompt)].mean(axis=0)
    per_token = [mats[len(prompt) + k - 1] for k in range(len(generated))]
    return mean, per_token


def check_matrix(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    assert np.array_equal(np.isnan(got), np.isnan(want)), (
        f"{what}: unused cells differ\n got {np.isnan(got).astype(int)}\n"
        f" want {np.isnan(want).astype(int)}")
    err = float(np.nanmax(np.abs(got - want)))
    assert err <= tol, f"{what}: max |engine - reference| = {err:.3g} > {tol:g}"
    sums = np.nansum(got, axis=1)
    assert np.allclose(sums, 1.0, atol=max(tol, 1e-5)), f"{what}: rows sum to {sums}"


def check_depth_json(depth: dict, model, prompt, generated, tol: float, per_token: bool,
                     what: str) -> None:
    """A choice's depth_attention object against the reference."""
    mean, tokens = expected(model, prompt, generated)
    assert depth["sublayers"] == sublayer_labels(model), depth["sublayers"]
    assert depth["sources"] == model.depth_sources(), depth["sources"]
    assert len(depth["sources"]) == mean.shape[1]
    check_matrix(json_matrix(depth["prompt_mean"]), mean, tol, f"{what} prompt_mean")
    if not per_token:
        assert "per_token" not in depth, f"{what}: per_token without asking"
        return
    assert len(depth["per_token"]) == len(generated), f"{what}: one matrix per token"
    for k, (got, want) in enumerate(zip(depth["per_token"], tokens)):
        check_matrix(json_matrix(got), want, tol, f"{what} token {k}")
