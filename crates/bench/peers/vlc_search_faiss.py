# The FAISS side of `bench --suite vlc-search`, on the files the suite wrote, driven by the
# suite one request a line on stdin, each answered by one flat JSON object a line on stdout
# (so that the suite can alternate its own timed runs with these):
#   kmeans M         faiss.Kmeans with M centroids over the whole set (as vlc does): the
#                    median iteration, the whole training, the final energy;
#   build            IndexIVFPQ (BYTES subquantisers of 8 bits) and, where the dimension
#                    divides into them, IndexIVFPQFastScan (2 BYTES of 4 bits), LISTS lists;
#   search KIND N    every query at once, nprobe N, on "ivfpq" or "fastscan": the seconds
#                    and recall@k against the truth file.
# It prints {"kind": "about", ...} first. Usage: vlc_search_faiss.py BASE.npy QUERIES.npy
# TRUTH.npy LISTS BYTES THREADS ITERATIONS
import json
import sys
import time

import faiss
import numpy as np

base_path, q_path, truth_path = sys.argv[1:4]
lists, nbytes, threads, niter = (int(v) for v in sys.argv[4:8])
faiss.omp_set_num_threads(threads)
x = np.ascontiguousarray(np.load(base_path), dtype=np.float32)
q = np.ascontiguousarray(np.load(q_path), dtype=np.float32)
truth = np.load(truth_path)
n, d = x.shape
k = truth.shape[1]


def emit(**row):
    print(json.dumps(row), flush=True)


def kmeans(m):
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


indexes = {}


def build():
    made = [("ivfpq", faiss.IndexIVFPQ(faiss.IndexFlatL2(d), d, lists, nbytes, 8))]
    if d % (2 * nbytes) == 0:
        made.append(("fastscan", faiss.IndexIVFPQFastScan(faiss.IndexFlatL2(d), d, lists, 2 * nbytes, 4)))
    said = []
    for kind, index in made:
        index.cp.niter = niter
        t = time.perf_counter()
        index.train(x)
        index.add(x)
        said.append(f"{kind} built in {time.perf_counter() - t:.1f} s")
        indexes[kind] = index
    emit(kind="build", build="; ".join(said))


def search(kind, nprobe):
    index = indexes.get(kind)
    if index is None:
        emit(kind="missing")
        return
    index.nprobe = nprobe
    t = time.perf_counter()
    _, found = index.search(q, k)
    seconds = time.perf_counter() - t
    recall = float(np.mean([len(set(a) & set(f[f >= 0])) / k for a, f in zip(truth, found)]))
    emit(kind=kind, seconds=seconds, recall=recall)


emit(kind="about", what=f"faiss {faiss.__version__} on {faiss.omp_get_max_threads()} threads")
for line in sys.stdin:
    word = line.split()
    if word[0] == "kmeans":
        kmeans(int(word[1]))
    elif word[0] == "build":
        build()
    elif word[0] == "search":
        search(word[1], int(word[2]))
