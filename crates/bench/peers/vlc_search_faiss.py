# The FAISS side of `bench --suite vlc-search`, on the files the suite wrote: faiss.Kmeans at
# each anchor count (the whole set every iteration, as vlc does), then IndexIVFPQ (BYTES
# subquantisers of 8 bits) and IndexIVFPQFastScan (2 BYTES of 4 bits, where the dimension
# divides into them) with LISTS lists, each searched with every query at once at each nprobe
# (median of REPS after one untimed search). Prints one flat JSON object per line.
# Usage: vlc_search_faiss.py BASE.npy QUERIES.npy TRUTH.npy LISTS BYTES NPROBES THREADS REPS
#        ITERATIONS KMEANS_ANCHORS   (NPROBES and KMEANS_ANCHORS comma-separated, the latter
#        possibly empty)
import json
import sys
import time

import faiss
import numpy as np

base_path, q_path, truth_path = sys.argv[1:4]
lists, nbytes = int(sys.argv[4]), int(sys.argv[5])
nprobes = [int(v) for v in sys.argv[6].split(",") if v]
threads, reps, niter = int(sys.argv[7]), int(sys.argv[8]), int(sys.argv[9])
kmeans = [int(v) for v in sys.argv[10].split(",") if v] if len(sys.argv) > 10 else []

faiss.omp_set_num_threads(threads)
x = np.ascontiguousarray(np.load(base_path), dtype=np.float32)
q = np.ascontiguousarray(np.load(q_path), dtype=np.float32)
truth = np.load(truth_path)
n, d = x.shape
k = truth.shape[1]
print(json.dumps({"kind": "about", "what": f"faiss {faiss.__version__} on {faiss.omp_get_max_threads()} threads"}))


def emit(**row):
    print(json.dumps(row), flush=True)


for m in kmeans:
    km = faiss.Kmeans(d, m, niter=niter, seed=1, max_points_per_centroid=n, verbose=False)
    t = time.perf_counter()
    km.train(x)
    train_s = time.perf_counter() - t
    times = [s["time"] for s in km.iteration_stats]
    per_iter = sorted(b - a for a, b in zip([0.0] + times[:-1], times))
    flat = faiss.IndexFlatL2(d)
    flat.add(km.centroids)
    dist, _ = flat.search(x, 1)
    emit(kind="kmeans", m=m, iter_ms=1e3 * per_iter[len(per_iter) // 2], train_s=train_s,
         energy=float(dist.mean()))


def recall(found):
    return float(np.mean([len(set(t) & set(f[f >= 0])) / k for t, f in zip(truth, found)]))


def build(index):
    index.cp.niter = niter
    t = time.perf_counter()
    index.train(x)
    index.add(x)
    return time.perf_counter() - t


indexes = [("ivfpq", faiss.IndexIVFPQ(faiss.IndexFlatL2(d), d, lists, nbytes, 8))]
if d % (2 * nbytes) == 0:
    indexes.append(("fastscan", faiss.IndexIVFPQFastScan(faiss.IndexFlatL2(d), d, lists, 2 * nbytes, 4)))
built = []
for kind, index in indexes:
    built.append(f"{kind} built in {build(index):.1f} s")
emit(kind="build", build="; ".join(built))
for kind, index in indexes:
    for nprobe in nprobes:
        index.nprobe = nprobe
        index.search(q, k)
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            _, found = index.search(q, k)
            times.append(time.perf_counter() - t)
        emit(kind=kind, nprobe=nprobe, qps=len(q) / float(np.median(times)), recall=recall(found))
