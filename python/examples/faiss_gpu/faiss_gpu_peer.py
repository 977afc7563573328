"""FAISS on the GPU on the data `bench.py` reads, as the peer of vlc's GPU search: IVF-PQ
(16 and 64 bytes a vector), IVF with float16 vectors (the memory of vlc's kept vectors), IVF
with float32 vectors, and brute force, each built on the whole base, then batched search of
every query at several nprobe (median of `--reps`), with recall@10 against the given truth.

    python faiss_gpu_peer.py --data base.npy --queries-file q.npy --truth gt.npy --lists 1024

It runs FAISS's own GPU wheel as `prepare.sh` packs it (faiss-gpu-cu12 1.9.0.0 on numpy 1),
in a process apart from PyTorch and vlc: `PYTHONPATH=/tmp/faiss/site LD_LIBRARY_PATH=
/tmp/faiss/lib:<cuBLAS 13's folder> python3 faiss_gpu_peer.py ...`. Prints one line per
measurement; with --json, the figures as JSON.
"""

import argparse
import json
import sys
import time

import faiss
import numpy as np


def timed(f):
    t = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--queries-file", required=True)
    ap.add_argument("--truth", required=True)
    ap.add_argument("--lists", type=int, default=1024)
    ap.add_argument("--nprobe", default="1,2,4,8,16,32,64")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--kinds", default="pq16,pq64,sq16,flat,brute")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    x = np.ascontiguousarray(np.load(a.data), dtype=np.float32)
    q = np.ascontiguousarray(np.load(a.queries_file), dtype=np.float32)
    truth = np.load(a.truth)[:, : a.k]
    d = x.shape[1]
    res = faiss.StandardGpuResources()
    out = {"faiss": faiss.__version__, "n": len(x), "d": d, "queries": len(q), "runs": []}
    print(f"faiss {faiss.__version__} on {faiss.get_num_gpus()} GPU(s); {x.shape}, {len(q)} queries", file=sys.stderr)
    for kind in a.kinds.split(","):
        quantizer = None
        if kind.startswith("pq"):
            m = int(kind[2:])
            cfg = faiss.GpuIndexIVFPQConfig()
            cfg.useFloat16LookupTables = m > 32
            index = faiss.GpuIndexIVFPQ(res, d, a.lists, m, 8, faiss.METRIC_L2, cfg)
        elif kind == "sq16":
            index = faiss.GpuIndexIVFScalarQuantizer(res, d, a.lists, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_L2)
        elif kind == "flat":
            index = faiss.GpuIndexIVFFlat(res, d, a.lists, faiss.METRIC_L2)
        else:
            index = faiss.GpuIndexFlatL2(res, d)
        _, train_s = timed(lambda: index.train(x))
        _, add_s = timed(lambda: index.add(x))
        print(f"{kind}: train {train_s:.2f} s, add {add_s:.2f} s", file=sys.stderr)
        for nprobe in ([0] if kind == "brute" else [int(v) for v in a.nprobe.split(",")]):
            if nprobe:
                index.nprobe = nprobe
            index.search(q[:100], a.k)
            times = []
            for _ in range(a.reps):
                (_, ids), s = timed(lambda: index.search(q, a.k))
                times.append(s)
            sec = float(np.median(times))
            recall = float(np.mean([len(set(t) & set(f)) / a.k for t, f in zip(truth, ids)]))
            out["runs"].append({"kind": kind, "nprobe": nprobe, "qps": len(q) / sec, "recall": recall,
                                "train_s": train_s, "add_s": add_s})
            print(f"faiss {kind} nprobe {nprobe:4}: {len(q) / sec:10.0f} queries/s, recall@{a.k} {recall:.4f}", file=sys.stderr)
        del index
    if a.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
