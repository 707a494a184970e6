// How a block of weights gets its f16 scale (and min) when it is quantized: the candidates
// searched and the squared error they are ranked by. engine/core/quant_format.cpp calls these
// for every block; the NumPy quantizer of the tests (tests/reference/quantized_formats.py)
// implements the same rule independently and must agree bit for bit.
//
// Every value below is computed in IEEE arithmetic with round to nearest even and no fused
// multiply-add (this file's .cpp is built with -ffp-contract=off), so the choice is a pure
// function of the block's f32 values:
//   f16(v)       v (f32) rounded to the nearest f16, ties to even; a double is first rounded
//                to f32, then to f16.
//   quantized q  symmetric: clamp(nearbyint(x / d), -qmax, qmax) in f32, 0 where d == 0;
//                asymmetric: clamp(nearbyint((x - m) / d), 0, qmax) in f32, 0 where d == 0.
//   error        the sum over the block of (double(x) - double(w))^2, w the f32 weight the
//                kernels read back (symmetric: d * q; asymmetric: d * q + m, the product exact,
//                the sum rounded to f32). The sum is taken in a fixed order: lane l in [0, 8)
//                adds the terms j = l, l + 8, l + 16, ... in turn, then the eight lanes are
//                added in order 0..7.
// The first candidate is the absmax (symmetric) or min-max (asymmetric) choice; a later one
// replaces the best so far only when its error is strictly smaller, so the choice never has a
// larger error than that rule's, and ties go to the earlier candidate.
#pragma once

namespace attnres {

// Blocks the choosers take: n a positive multiple of 8, at most this.
constexpr int kQuantSearchMaxBlock = 256;

// A symmetric scale for q in [-qmax, qmax] (qmax >= 1), an f16 value returned as float.
// Candidates, in order: d0 = f16(amax / qmax) (amax = max |x|), then for i = -10 .. 10 (i != 0)
// d_i = f16(amax / f32(qmax + i / 5)) (scales up to 2 / qmax larger than d0, or smaller, which
// clips the largest weights): the candidate with the smallest error. An all-zero
// block gives 0. Candidates f16 cannot hold are skipped; throws when d0 is one of them (a
// weight of magnitude beyond ~qmax x 65504). Every x must be finite.
float choose_symmetric_scale(const float* x, int n, int qmax);

// An asymmetric scale and min for q in [0, qmax] (qmax >= 1), both f16 values (d >= 0).
struct AsymmetricScale {
  float d;
  float m;
};
// Candidates, in order: the min-max choice m0 = f16(min x), d0 = f16(r / qmax) with
// r = max(f32(max x - m0), 0) (m0 may round above a block of equal values); then for
// i = -3 .. 3: unless i == 0, (d_i = f16(r / f32(qmax + 2 i / 5)), m0),
// then the least-squares refit of that candidate (for i == 0, of the min-max one): with its q,
// the (d, m) minimizing sum (x - d q - m)^2 in double, det = n S(q^2) - S(q)^2,
//   d = (n S(xq) - S(q) S(x)) / det,   m = (S(q^2) S(x) - S(q) S(xq)) / det
// (S(x), S(xq): double sums in the error's lane order; S(q), S(q^2): exact), each rounded to
// f16, tried when det > 0 and f16(d) > 0 with both finite. The candidate with the smallest
// error wins. Throws when m0 or d0 overflow f16. Every x must be finite.
AsymmetricScale choose_asymmetric_scale(const float* x, int n, int qmax);

// The errors the choosers rank candidates by (definitions above).
double symmetric_error(const float* x, int n, int qmax, float d);
double asymmetric_error(const float* x, int n, int qmax, float d, float m);

}  // namespace attnres
