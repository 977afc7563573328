"""The icosphere problem of residual-compile, solved by scipy.optimize.least_squares (trf, sparse
analytic Jacobian) from the start file `bench --suite nlls` writes. Prints one JSON line.

Residuals (the same as crates/residual-compile/src/icosphere.rs):
  edge    |v_a - v_b| - L                      (one per edge)
  sphere  w1 (|v| - 1)                         (one per vertex)
  bending w2 (n1 - n2), n1 = unit((b-a) x (c-a)), n2 = unit((a-b) x (d-b))   (three per edge)
Cost 0.5 * sum of squares, as scipy and Ceres define it.
"""
import json, sys, time
import numpy as np
import scipy
from scipy.optimize import least_squares
from scipy.sparse import csr_matrix

path, w1, w2, tol = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
raw = open(path, "rb").read()
nv, ne = np.frombuffer(raw[:8], dtype="<u4")
x0 = np.frombuffer(raw[8:8 + nv * 24], dtype="<f8").copy()
edges = np.frombuffer(raw[8 + nv * 24:8 + nv * 24 + ne * 16], dtype="<u4").reshape(ne, 4).astype(np.int64)
rest = np.frombuffer(raw[8 + nv * 24 + ne * 16:], dtype="<f8")[0]
A, B, C, D = edges.T


def skew(v):
    z = np.zeros(v.shape[:-1] + (3, 3))
    z[..., 0, 1], z[..., 0, 2] = -v[..., 2], v[..., 1]
    z[..., 1, 0], z[..., 1, 2] = v[..., 2], -v[..., 0]
    z[..., 2, 0], z[..., 2, 1] = -v[..., 1], v[..., 0]
    return z


def unit_normal(p, q):
    """n = unit(p x q) and dn/dp, dn/dq."""
    u = np.cross(p, q)
    nu = np.linalg.norm(u, axis=1)[:, None]
    n = u / nu
    proj = (np.eye(3)[None] - n[:, :, None] * n[:, None, :]) / nu[:, :, None]
    # d(p x q)/dp = -[q]x, d(p x q)/dq = [p]x
    return n, proj @ -skew(q), proj @ skew(p)


def residuals(x):
    v = x.reshape(-1, 3)
    d = v[A] - v[B]
    edge = np.linalg.norm(d, axis=1) - rest
    sphere = w1 * (np.linalg.norm(v, axis=1) - 1.0)
    n1, _, _ = unit_normal(v[B] - v[A], v[C] - v[A])
    n2, _, _ = unit_normal(v[A] - v[B], v[D] - v[B])
    return np.concatenate([edge, sphere, (w2 * (n1 - n2)).ravel()])


def jacobian(x):
    v = x.reshape(-1, 3)
    rows, cols, vals = [], [], []
    cols3 = lambda idx: (3 * idx[:, None] + np.arange(3)[None, :])
    # edge rows 0..ne
    d = v[A] - v[B]
    u = d / np.linalg.norm(d, axis=1)[:, None]
    r = np.arange(ne)
    for idx, s in ((A, 1.0), (B, -1.0)):
        rows.append(np.repeat(r, 3)); cols.append(cols3(idx).ravel()); vals.append((s * u).ravel())
    # sphere rows
    r = ne + np.arange(nv)
    vn = v / np.linalg.norm(v, axis=1)[:, None]
    rows.append(np.repeat(r, 3)); cols.append(cols3(np.arange(nv)).ravel()); vals.append((w1 * vn).ravel())
    # bending rows: 3 per edge
    n1, dp1, dq1 = unit_normal(v[B] - v[A], v[C] - v[A])
    n2, dp2, dq2 = unit_normal(v[A] - v[B], v[D] - v[B])
    blocks = {  # d(n1 - n2)/d(vertex)
        "a": -dp1 - dq1 - dp2,
        "b": dp1 + dp2 + dq2,
        "c": dq1,
        "d": -dq2,
    }
    base = ne + nv + 3 * np.arange(ne)
    for name, idx in (("a", A), ("b", B), ("c", C), ("d", D)):
        J = w2 * blocks[name]  # (ne, 3 rows, 3 cols)
        rr = (base[:, None, None] + np.arange(3)[None, :, None]).repeat(3, axis=2)
        cc = np.broadcast_to(cols3(idx)[:, None, :], (ne, 3, 3))
        rows.append(rr.ravel()); cols.append(cc.ravel()); vals.append(J.ravel())
    m = ne + nv + 3 * ne
    return csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(m, 3 * nv))


if len(sys.argv) > 5 and sys.argv[5] == "check":
    # The analytic Jacobian against central differences at the start.
    J = jacobian(x0).toarray()
    h = 1e-6
    for k in range(0, 3 * nv, max(1, nv // 7)):
        e = np.zeros_like(x0); e[k] = h
        fd = (residuals(x0 + e) - residuals(x0 - e)) / (2 * h)
        assert np.allclose(fd, J[:, k], atol=1e-6), (k, np.abs(fd - J[:, k]).max())
    print("jacobian ok")
    sys.exit(0)

t = time.perf_counter()
res = least_squares(residuals, x0, jac=jacobian, method="trf", tr_solver="lsmr", ftol=tol, xtol=tol, gtol=tol, max_nfev=2000)
t = time.perf_counter() - t
print(json.dumps({"seconds": t, "cost": float(res.cost), "initial_cost": float(0.5 * np.sum(residuals(x0) ** 2)),
                  "nfev": int(res.nfev), "status": int(res.status), "what": "scipy " + scipy.__version__ + " least_squares trf (lsmr; analytic sparse Jacobian)"}))
