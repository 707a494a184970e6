"""The float64 reference forward on dequantized weights, with the linears over quantized
weights reading their inputs as the CPU kernels quantize them (kernels/cpu/cpu_linear_quant.h):
per row, per block of 32, dx = f32(max|x| / 127), q = clamp(rint(x / dx), -127, 127) in f32
arithmetic, x read as dx * q.

Rounding boundaries. The engine's activations are f32 and differ from the reference's float64
ones by ~1e-6 relative, so x / dx (|x / dx| <= 127) can differ by ~1e-4; an activation whose
x / dx lies that close to a half-integer may round to either neighbour, and one int8 step of
one activation moves the logits by 1e-3 to 3e-2 relative (more than everything else that
separates the two computations together). Such activations are common, not rare: in a bf16
checkpoint the first layer's input is the RMSNorm of an embedding row (int8 multiples of one
scale per block when the embedding is quantized, bf16 values otherwise) times bf16 gains, and
x / dx is often exactly k + 1/2 there; f32 RMSNorm rounds those to either side.

So a comparison fits those roundings (fit_boundary_rounding): every activation within
BOUNDARY_MARGIN of a boundary may round either way, chosen position by position (a position's
logits depend on earlier positions only) to bring the reference closest to the engine. The
choices are few (a handful per model), so a kernel that computes something else stays off by
what it gets wrong; only how it rounds on a boundary is left to the kernel tests
(tests/cpp/kernels/cpu/cpu_linear_quant_test.cpp, QuantActivations).
"""

import itertools
import json

import numpy as np

import attnres_ref as ref
import quantized_formats as qf

BOUNDARY_MARGIN = 2e-4  # |x / dx - (k + 1/2)| below this: either rounding is the kernel's
MAX_CHOICES_PER_POSITION = 10  # 2^10 reference runs at most for one position


class QuantizedReference(ref.Model):
    """ref.Model whose linears over the matrices named in `quantized` read their inputs
    quantized as above. `rounding` maps a boundary activation's key (see boundary_key) to +1
    (round up) or -1 (down); the rest round to nearest, ties to even. `boundary` lists the
    keys of the activations within BOUNDARY_MARGIN of a boundary that this forward met."""

    def __init__(self, config, tensors, quantized, rounding=None):
        super().__init__(config, tensors)
        self.quantized = set(quantized)
        self.rounding = rounding or {}
        self.boundary = []

    def _linear_input(self, x, weight):
        if weight not in self.quantized:
            return super()._linear_input(x, weight)
        x32 = np.asarray(x, dtype=np.float32)
        blocks = x32.reshape(*x32.shape[:-1], -1, qf.BLOCK)
        dx = (np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(dx == 0, 0, blocks / dx)
        q = np.rint(r)
        for idx in zip(*np.nonzero(np.abs(r - np.floor(r) - 0.5) < BOUNDARY_MARGIN)):
            key = boundary_key(weight, idx, blocks[idx])
            if key not in self.boundary:
                self.boundary.append(key)
            if key in self.rounding:
                q[idx] = np.floor(r[idx]) + (1 if self.rounding[key] > 0 else 0)
        q = np.clip(q, -127, 127)
        return (q.astype(np.float64) * dx.astype(np.float64)).reshape(x.shape)


# Linears that read one input, which the engine quantizes once: keyed by the first.
SHARED_INPUT = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}


def boundary_key(weight, idx, value):
    """One activation: (the linear whose input it is, position, block, index in the block,
    its f32 value). q/k/v (and gate/up) share their input and so its keys; the value keeps
    apart inputs that differ (delta_v's v_proj reads another one)."""
    *prefix, name, _ = weight.split(".")
    linear = ".".join([*prefix, SHARED_INPUT.get(name, name)])
    return (linear, int(idx[0]), *map(int, idx[1:]), float(value))


def reference_on(model_dir, tensors, quantized, rounding=None):
    """The reference forward of the model in model_dir over `tensors` (dequantized weights),
    the matrices named in `quantized` read as the quantized linears read them."""
    config = json.loads((model_dir / "config.json").read_text())
    config.pop("quantization_config", None)
    return QuantizedReference(config, tensors, quantized, rounding)


def fit_boundary_rounding(make_reference, ids, engine):
    """The rounding of the boundary activations that brings the reference closest to the
    engine's logits [len(ids), vocab], position by position. make_reference(rounding) gives
    a QuantizedReference. Returns (the reference's logits with it, the rounding: one
    entry per boundary activation decided)."""

    def run(rounding):
        model = make_reference(rounding)
        logits = model.logits(ids)
        per_position = np.abs(logits - engine).max(axis=1) / np.abs(logits).max()
        return logits, per_position, model.boundary

    _, _, seen = run({})
    rounding = {}
    for p in range(len(ids)):
        while True:  # a choice can move later layers' activations at p onto a boundary
            open_keys = [k for k in seen if k[1] == p and k not in rounding]
            if not open_keys:
                break
            assert len(open_keys) <= MAX_CHOICES_PER_POSITION, (
                f"{len(open_keys)} boundary activations at position {p}")
            best = None
            for dirs in itertools.product((-1, 1), repeat=len(open_keys)):
                trial = {**rounding, **dict(zip(open_keys, dirs))}
                _, per_position, met = run(trial)
                if best is None or per_position[p] < best[0]:
                    best = (per_position[p], trial, met)
            rounding, seen = best[1], best[2]
    logits, _, _ = run(rounding)
    return logits, rounding
