# The FAISS side of `bench --suite vlc`: k-means with the same number of centroids and
# iterations, and IndexIVFPQ with the same bytes per vector, on the same .npy file.
# Prints one JSON line. Usage: vlc_faiss.py DATA.npy M ITERATIONS BYTES NPROBE QUERIES SEED
import json, sys, time
import numpy as np
import faiss

path, m, niter, nbytes, nprobe, nq, seed = sys.argv[1], *map(int, sys.argv[2:8])
x = np.ascontiguousarray(np.load(path).astype(np.float32))
n, d = x.shape
# The whole set each iteration (FAISS samples 256 points per centroid by default).
km = faiss.Kmeans(d, m, niter=niter, seed=seed, max_points_per_centroid=n, verbose=False)
t = time.perf_counter()
km.train(x)
train_s = time.perf_counter() - t
stats = km.iteration_stats
times = [s["time"] for s in stats]
per_iter = sorted(b - a for a, b in zip([0.0] + times[:-1], times))
# The energy of the final centroids: each point's squared distance to its nearest, averaged.
index = faiss.IndexFlatL2(d)
index.add(km.centroids)
dist, _ = index.search(x, 1)
energy = float(dist.mean())

# IVFPQ with the same coarse size and bytes per vector (8-bit codes; FAISS needs d % M == 0,
# so M is the largest divisor of d not above the byte budget).
M = max(b for b in range(1, nbytes + 1) if d % b == 0)
quantizer = faiss.IndexFlatL2(d)
ivfpq = faiss.IndexIVFPQ(quantizer, d, m, M, 8)
ivfpq.cp.niter = niter
ivfpq.cp.seed = seed
ivfpq.cp.max_points_per_centroid = n
t = time.perf_counter()
ivfpq.train(x)
ivfpq.add(x)
ivf_s = time.perf_counter() - t
ivfpq.nprobe = nprobe
step = max(n // nq, 1)
q = x[::step][:nq]
flat = faiss.IndexFlatL2(d)
flat.add(x)
_, truth = flat.search(q, 10)
_, found = ivfpq.search(q, 10)
recall = float(np.mean([len(set(t) & set(f)) / 10.0 for t, f in zip(truth, found)]))
# Reconstruction: coarse centroid + decoded residual, for every vector.
ivfpq.make_direct_map()
recon = ivfpq.reconstruct_n(0, n)
mse = float(((x - recon) ** 2).sum(axis=1).mean())
# The whole serialized index: coarse centroids, PQ codebooks, codes and the 64-bit ids.
index_bytes = int(faiss.serialize_index(ivfpq).nbytes)
print(json.dumps({
    "what": f"faiss {faiss.__version__} Kmeans + IndexIVFPQ(M={M}, 8 bits), {faiss.omp_get_max_threads()} threads",
    "energy": energy,
    "train_s": train_s,
    "iter_ms": 1e3 * per_iter[len(per_iter) // 2],
    "ivfpq_m": M,
    "ivfpq_recall": recall,
    "ivfpq_mse": mse,
    "ivfpq_build_s": ivf_s,
    "ivfpq_bytes": index_bytes,
}))
