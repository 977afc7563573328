"""Times vlc from Python: one compression, then batched search at several nprobe on each
search backend, with recall@10 against exact neighbours (brute force with PyTorch on a GPU
where there is one, else numpy in chunks).

    python python/examples/bench.py --synthetic 1000000,384 --anchors 1024 --bytes 16
    python python/examples/bench.py --synthetic 1000000,384 --search-backend cpu,cuda,wgpu
    python python/examples/bench.py --data vectors.npy --queries-file q.npy --backend cpu
    python python/examples/bench.py --data base.npy --queries-file q.npy --truth gt.npy \
        --search-backend cuda --rerank 0,100 --torch-peer
    python python/examples/bench.py --synthetic 10000000,128 --anchors 4096 --backend cuda --memory

Synthetic data is a Gaussian mixture (as many centres as anchors), queries drawn from the
same mixture and not indexed. `--rerank` lists candidate pools to re-rank by exact distance
(0: the codes' ranking; any other value compresses with `refine=True`). `--torch-peer` times
PyTorch's brute-force search on the GPU in the same run (fp32 without TF32, and fp16), the
anchor where FAISS's GPU wheel cannot run. `--memory` only compresses, and reports the
process's GPU memory (nvidia-smi, every 20 ms) at its peak during the compression against
the figure just before it, and the host's peak resident set. Prints one line per phase;
with --json, the figures as JSON.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time

import numpy as np

import vlc


def mixture(n, d, centres, seed, intrinsic=0):
    """A Gaussian mixture in d dimensions, or, with `intrinsic` r, one in r dimensions mapped
    into d by a random linear map (points near an r-dimensional subspace, as embeddings lie
    near a low-dimensional set: there, unlike in the full-rank mixture, where a cluster's
    points are all about equally far apart, the nearest neighbours stand out)."""
    rng = np.random.default_rng(seed)
    r = intrinsic or d
    c = rng.standard_normal((centres, r), dtype=np.float32)
    lift = rng.standard_normal((r, d), dtype=np.float32) / np.sqrt(r) if intrinsic else None
    out = np.empty((n, d), np.float32)
    step = 65536
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        z = c[rng.integers(0, centres, hi - lo)]
        z += 0.35 * rng.standard_normal((hi - lo, r), dtype=np.float32)
        out[lo:hi] = z if lift is None else z @ lift
    return out


class GpuMemory:
    """This process's GPU memory as nvidia-smi reports it (MiB), polled every 20 ms from a
    thread while inside the `with`: `peak` the largest figure seen."""

    def __init__(self):
        self.peak, self._stop = 0, threading.Event()

    @staticmethod
    def now():
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True).stdout
        return sum(int(m) for p, m in (line.split(",") for line in out.splitlines() if line.strip()) if int(p) == os.getpid())

    def _poll(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.02)

    def __enter__(self):
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def memory_run(x, a):
    """`--memory`: one compression, its GPU memory against the data's and the index's size."""
    vlc.compress(x[: max(4 * a.anchors, 20000)], anchors=a.anchors, bytes=a.bytes, backend=a.backend, iterations=2)
    before = GpuMemory.now()
    t = time.perf_counter()
    with GpuMemory() as gpu:
        index = vlc.compress(x, anchors=a.anchors, bytes=a.bytes, backend=a.backend, seed=a.seed)
    sec = time.perf_counter() - t
    data_mib, index_mib = x.nbytes / 2**20, index.file_size / 2**20
    grown = gpu.peak - before
    out = {"compress_s": sec, "phases_s": index.seconds, "gpu_before_mib": before, "gpu_peak_mib": gpu.peak,
           "data_mib": data_mib, "index_mib": index_mib, "ratio": grown / (data_mib + index_mib),
           "host_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    print(f"compress: {sec:.2f} s ({index}); phases {index.seconds}", file=sys.stderr)
    print(f"GPU memory: {before} MiB before, {gpu.peak} MiB at the peak: {grown} MiB for "
          f"{data_mib:.0f} MiB of data and a {index_mib:.0f} MiB index ({out['ratio']:.2f}x); "
          f"host peak resident {out['host_peak_rss_mib']:.0f} MiB", file=sys.stderr)
    return out


class TorchBruteForce:
    """PyTorch brute force on the GPU: the base vectors resident in `dtype`, `|x|^2 - 2 q.x`
    (no TF32) for chunks of queries whose scores take about 2 GB, `topk`."""

    def __init__(self, x, dtype):
        import torch

        self.torch, self.dev = torch, torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = False
        self.xt = torch.from_numpy(x).to(self.dev).to(dtype)
        self.xn = (self.xt.float() ** 2).sum(1).to(dtype)
        self.chunk = max(1, (2 << 30) // (x.shape[0] * self.xt.element_size()))

    def search(self, q, k):
        ids = []
        for lo in range(0, len(q), self.chunk):
            qt = self.torch.from_numpy(q[lo : lo + self.chunk]).to(self.dev).to(self.xt.dtype)
            d = self.torch.addmm(self.xn[None, :], qt, self.xt.T, alpha=-2)
            ids.append(d.topk(k, dim=1, largest=False).indices)
        return self.torch.cat(ids).cpu().numpy()

    def close(self):
        """Frees the device memory (PyTorch's cache would keep it from vlc's allocations)."""
        del self.xt, self.xn
        self.torch.cuda.empty_cache()


def exact_top(x, q, k):
    """Indices of each query's k nearest rows of x (squared L2): PyTorch in float32 on a GPU
    where there is one, else numpy in chunks."""
    try:
        import torch

        if torch.cuda.is_available():
            brute = TorchBruteForce(x, torch.float32)
            ids = brute.search(q, k)
            brute.close()
            return ids
    except ImportError:
        pass
    xn = (x * x).sum(1)
    out = []
    for lo in range(0, len(q), 256):
        d = xn[None, :] - 2 * q[lo : lo + 256] @ x.T
        part = np.argpartition(d, k, axis=1)[:, :k]
        order = np.take_along_axis(d, part, 1).argsort(1)
        out.append(np.take_along_axis(part, order, 1))
    return np.concatenate(out)


def torch_peer(x, q, k, truth, reps, out):
    """PyTorch brute force on the GPU in float32 and float16, timed from host arrays to host
    results (the base vectors resident on the device, as an index is), median of `reps`."""
    import torch

    for name, dt in [("torch-fp32", torch.float32), ("torch-fp16", torch.float16)]:
        brute = TorchBruteForce(x, dt)
        brute.search(q, k)
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            ids = brute.search(q, k)
            times.append(time.perf_counter() - t)
        brute.close()
        sec = float(np.median(times))
        recall = float(np.mean([len(set(t_[:k]) & set(f)) / k for t_, f in zip(truth, ids)]))
        out["search"].append({"backend": name, "nprobe": 0, "rerank": 0, "qps": len(q) / sec, "recall": recall})
        print(f"{name} brute force: {len(q) / sec:10.0f} queries/s, recall@{k} {recall:.4f}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help=".npy of vectors (float, n x d)")
    ap.add_argument("--queries-file", help=".npy of queries (default: the last --queries rows, not indexed)")
    ap.add_argument("--synthetic", help="N,D: a Gaussian mixture instead of --data")
    ap.add_argument("--intrinsic", type=int, default=0, help="the synthetic mixture in this many dimensions, mapped linearly into D")
    ap.add_argument("--queries", type=int, default=10000)
    ap.add_argument("--anchors", type=int, default=1024)
    ap.add_argument("--bytes", type=int, default=16)
    ap.add_argument("--backend", default="auto", help="where the compression runs")
    ap.add_argument("--search-backend", default="cpu", help="where searches run, comma-separated (cpu: the host's threads)")
    ap.add_argument("--nprobe", default="1,4,16,64")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--rerank", default="0", help="candidate pools re-ranked by exact distance, comma-separated (0: none)")
    ap.add_argument("--truth", help=".npy of each query's true nearest ids (nearest first), instead of computing them")
    ap.add_argument("--torch-peer", action="store_true", help="time PyTorch brute force on the GPU too")
    ap.add_argument("--reps", type=int, default=3, help="searches timed per nprobe (median)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--memory", action="store_true", help="compress only, and report its GPU memory (nvidia-smi)")
    a = ap.parse_args()
    if a.threads:
        vlc.set_threads(a.threads)
    t = time.perf_counter()
    if a.synthetic:
        n, d = (int(v) for v in a.synthetic.split(","))
        x = mixture(n + a.queries, d, a.anchors, a.seed, a.intrinsic)
        x, q = x[:n], x[n:]
    elif a.data:
        x = np.load(a.data, mmap_mode="r")
        if a.queries_file:
            q = np.ascontiguousarray(np.load(a.queries_file), dtype=np.float32)
        else:
            x, q = x[: -a.queries], x[-a.queries :]
        x = np.ascontiguousarray(x, dtype=np.float32)
        q = np.ascontiguousarray(q, dtype=np.float32)
    else:
        ap.error("give --data or --synthetic")
    print(f"data: {x.shape[0]} x {x.shape[1]}, {len(q)} queries ({time.perf_counter() - t:.1f} s)", file=sys.stderr)
    if a.memory:
        out = memory_run(x, a)
        if a.json:
            print(json.dumps(out))
        return
    t = time.perf_counter()
    truth = np.load(a.truth)[:, : a.k] if a.truth else exact_top(x, q, a.k)
    print(f"exact top-{a.k}: {time.perf_counter() - t:.1f} s", file=sys.stderr)
    reranks = [int(v) for v in a.rerank.split(",")]

    out = {"n": int(x.shape[0]), "d": int(x.shape[1]), "queries": int(len(q)),
           "anchors": a.anchors, "bytes": a.bytes, "backend": a.backend, "search": []}
    # A small compression first, so that the timed one does not include starting the backend
    # or compiling its kernels.
    vlc.compress(x[: max(4 * a.anchors, 20000)], anchors=a.anchors, bytes=a.bytes, backend=a.backend, iterations=2)
    t = time.perf_counter()
    index = vlc.compress(x, anchors=a.anchors, bytes=a.bytes, backend=a.backend, seed=a.seed)
    out["compress_s"] = time.perf_counter() - t
    if any(reranks):
        t = time.perf_counter()
        index.set_refine(x)
        out["refine_s"] = time.perf_counter() - t
    out["energy"], out["mse"], out["file_bytes"] = index.energy, index.mse, index.file_size
    out["phases_s"] = index.seconds
    print(f"compress: {out['compress_s']:.2f} s ({index}); energy {index.energy:.5f}, MSE {index.mse:.5f}; phases {index.seconds}", file=sys.stderr)
    for where in a.search_backend.split(","):
        # The first search on a GPU uploads the index's lists and tables: untimed.
        t = time.perf_counter()
        index.search(q[:100], a.k, 1, backend=where)
        print(f"search on {where}: first call {time.perf_counter() - t:.2f} s", file=sys.stderr)
        for rerank in reranks:
            if rerank:
                # The first re-ranked search uploads the kept vectors: untimed.
                index.search(q[:100], a.k, 1, backend=where, rerank=rerank)
            for nprobe in (int(v) for v in a.nprobe.split(",")):
                times = []
                for _ in range(a.reps):
                    t = time.perf_counter()
                    _, ids = index.search(q, a.k, nprobe, backend=where, rerank=rerank)
                    times.append(time.perf_counter() - t)
                sec = float(np.median(times))
                recall = float(np.mean([len(set(t_) & set(f)) / a.k for t_, f in zip(truth, ids)]))
                out["search"].append({"backend": where, "nprobe": nprobe, "rerank": rerank, "qps": len(q) / sec, "recall": recall})
                print(f"{where} nprobe {nprobe:4} rerank {rerank:4}: {len(q) / sec:10.0f} queries/s, recall@{a.k} {recall:.4f}", file=sys.stderr)
    if a.torch_peer:
        torch_peer(x, q, a.k, truth, a.reps, out)
    if a.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
