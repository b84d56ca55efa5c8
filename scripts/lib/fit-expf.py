#!/usr/bin/env python3
"""Fit the polynomial of kernels/src/cpu/expf.rs: exp(r) ~ 1 + r + c2 r^2 +
c3 r^3 + c4 r^4 + c5 r^5 on |r| <= ln2 / 2, for the least largest relative
error (iteratively reweighted least squares, which converges to the
minimax fit). Needs numpy. Prints the coefficients and the error."""
import numpy as np

h = np.log(2) / 2 * 1.005
r = np.linspace(-h, h, 40001)
t = np.exp(r)
A = np.vstack([r**2, r**3, r**4, r**5]).T
w = np.ones_like(r)
for _ in range(300):
    W = w / t
    c, *_ = np.linalg.lstsq(A * W[:, None], (t - 1 - r) * W, rcond=None)
    err = (1 + r + A @ c - t) / t
    w = w * (np.abs(err) / np.abs(err).max() + 1e-3)
    w /= w.max()
print("c2..c5 =", [float(np.float32(x)) for x in c])
print("largest relative error:", np.abs(err).max())
