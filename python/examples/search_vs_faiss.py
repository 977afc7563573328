"""vlc's batched search against FAISS's IndexIVFPQ (and IndexIVFPQFastScan) on the same
vectors, lists and bytes per vector, in the same process, on the same threads.

    pip install faiss-cpu
    python python/examples/search_vs_faiss.py --synthetic 100000,384 --lists 1024 --bytes 16

Both indexes get the same number of inverted lists and bytes of code per vector (IVFPQ:
`bytes` subquantisers of 8 bits; FastScan: `2 bytes` subquantisers of 4 bits, run where the
dimension divides into them). Each search
is the whole query set at once (batched), timed as the median of --reps runs after one
warm-up; recall@k is against exact neighbours (brute force, numpy). Prints a table; --json
writes the figures.
"""

import argparse
import json
import sys
import time

import numpy as np

import vlc

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench import exact_top, mixture  # noqa: E402


def timed(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)), out


def recall(truth, ids, k):
    return float(np.mean([len(set(t) & set(f[f >= 0])) / k for t, f in zip(truth, ids)]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synthetic", default="100000,384", help="N,D Gaussian mixture")
    ap.add_argument("--data", help=".npy of vectors instead (the last --queries rows are the queries)")
    ap.add_argument("--queries", type=int, default=10000)
    ap.add_argument("--lists", type=int, default=1024)
    ap.add_argument("--bytes", type=int, default=16)
    ap.add_argument("--nprobe", default="1,2,4,8,16,32,64")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=25, help="vlc annealing and FAISS k-means")
    ap.add_argument("--json")
    a = ap.parse_args()
    import faiss

    faiss.omp_set_num_threads(a.threads)
    vlc.set_threads(a.threads)
    if a.data:
        x = np.ascontiguousarray(np.load(a.data), dtype=np.float32)
        x, q = x[: -a.queries], x[-a.queries :]
    else:
        n, d = (int(v) for v in a.synthetic.split(","))
        x = mixture(n + a.queries, d, 4 * a.lists, 0)
        x, q = x[:n], x[n:]
    d = x.shape[1]
    truth = exact_top(x, q, a.k)
    print(f"{x.shape[0]} x {d}, {len(q)} queries, {a.lists} lists, {a.bytes} bytes, {a.threads} threads", file=sys.stderr)

    t = time.perf_counter()
    ours = vlc.compress(x, anchors=a.lists, bytes=a.bytes, backend="cpu", iterations=a.iterations)
    t_ours = time.perf_counter() - t
    t = time.perf_counter()
    coarse = faiss.IndexFlatL2(d)
    ivfpq = faiss.IndexIVFPQ(coarse, d, a.lists, a.bytes, 8)
    ivfpq.cp.niter = a.iterations
    ivfpq.train(x)
    ivfpq.add(x)
    t_faiss = time.perf_counter() - t
    fast = None
    if d % (2 * a.bytes) == 0:
        coarse2 = faiss.IndexFlatL2(d)
        fast = faiss.IndexIVFPQFastScan(coarse2, d, a.lists, 2 * a.bytes, 4)
        fast.cp.niter = a.iterations
        fast.train(x)
        fast.add(x)
    else:
        print(f"FastScan not run: {d} dimensions do not split into {2 * a.bytes} subquantisers", file=sys.stderr)
    print(f"build: vlc {t_ours:.1f} s, IVFPQ {t_faiss:.1f} s; file {ours.file_size} bytes", file=sys.stderr)

    rows = []
    print(f"{'nprobe':>6} | {'vlc q/s':>10} {'recall':>7} | {'IVFPQ q/s':>10} {'recall':>7} | {'FastScan q/s':>12} {'recall':>7} | vlc/IVFPQ")
    for nprobe in (int(v) for v in a.nprobe.split(",")):
        s_ours, (_, ids) = timed(lambda: ours.search(q, a.k, nprobe), a.reps)
        ivfpq.nprobe = nprobe
        s_f, (_, fids) = timed(lambda: ivfpq.search(q, a.k), a.reps)
        if fast is not None:
            fast.nprobe = nprobe
            s_fs, (_, fsids) = timed(lambda: fast.search(q, a.k), a.reps)
        else:
            s_fs, fsids = float("inf"), truth[:, :0]
        row = {
            "nprobe": nprobe,
            "vlc_qps": len(q) / s_ours, "vlc_recall": recall(truth, ids, a.k),
            "ivfpq_qps": len(q) / s_f, "ivfpq_recall": recall(truth, fids, a.k),
            "fastscan_qps": len(q) / s_fs, "fastscan_recall": recall(truth, fsids, a.k) if fast else None,
        }
        rows.append(row)
        print(f"{nprobe:6} | {row['vlc_qps']:10.0f} {row['vlc_recall']:7.4f} | {row['ivfpq_qps']:10.0f} "
              f"{row['ivfpq_recall']:7.4f} | {row['fastscan_qps']:12.0f} {row['fastscan_recall'] or 0:7.4f} | "
              f"{row['vlc_qps'] / row['ivfpq_qps']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"n": int(x.shape[0]), "d": d, "lists": a.lists, "bytes": a.bytes,
                       "threads": a.threads, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
