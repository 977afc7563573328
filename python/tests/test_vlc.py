"""The `vlc` Python module against numpy's own arithmetic: search, add, remove, save and load,
metrics, conversions, and the exceptions bad input raises.

Run with `pytest python/tests` after installing the module (`pip install ./python`). The wgpu
tests need a Vulkan driver (lavapipe: Debian `mesa-vulkan-drivers libvulkan1`); without one
they fail rather than skip. `VLC_PY_BACKEND=cuda` (or `wgpu`) compresses and adds on that
backend instead of the CPU; `VLC_PY_SEED` replays a run's data (pytest -s prints it).
"""

import os
import threading

import numpy as np
import pytest

import vlc

SEED = int(os.environ.get("VLC_PY_SEED", np.random.SeedSequence().entropy % 2**32))
# The backend the tests compress and add on (`cuda` on a GPU host); the CPU by default.
BACKEND = os.environ.get("VLC_PY_BACKEND", "cpu")


def mixture(n, d, centres, spread, seed):
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centres, d)).astype(np.float32) * 3
    x = c[rng.integers(0, centres, n)] + spread * rng.standard_normal((n, d), dtype=np.float32)
    return x.astype(np.float32)


@pytest.fixture(scope="module")
def data():
    print(f"VLC_PY_SEED={SEED} VLC_PY_BACKEND={BACKEND}")
    return mixture(3001, 24, 40, 0.5, SEED)


@pytest.fixture(scope="module")
def index(data):
    return vlc.compress(data, anchors=48, bytes=8, backend=BACKEND, seed=SEED % 1000)


def exact_topk(x, q, k):
    d2 = ((q[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    return np.argsort(d2, axis=1, kind="stable")[:, :k]


def test_search_distances_are_those_of_the_reconstructions(index, data):
    q = data[:25] + 0.01
    dist, ids = index.search(q, k=7, nprobe=6)
    assert dist.shape == (25, 7) and ids.shape == (25, 7)
    assert dist.dtype == np.float32 and ids.dtype == np.int64
    assert (ids >= 0).all()
    # Asymmetric distance: the query against each hit's reconstruction, nearest first.
    for row in range(25):
        assert np.all(np.diff(dist[row]) >= -1e-4)
        for j in range(7):
            r = index.reconstruct(int(ids[row, j]))
            want = float(((q[row] - r) ** 2).sum())
            assert dist[row, j] == pytest.approx(want, rel=1e-4, abs=1e-4)


def test_recall_against_brute_force(index, data):
    q = data[::97]
    truth = exact_topk(data, q, 10)
    _, ids = index.search(q, k=10, nprobe=48)
    found = np.mean([len(set(t) & set(f)) / 10 for t, f in zip(truth, ids)])
    assert found > 0.5, found
    # Probing every list finds a stored vector's own reconstruction first (or one equal to it
    # within f32 rounding).
    rec = index.decompress()
    _, own = index.search(rec[:40], k=1, nprobe=48)
    d_own = ((rec[:40] - rec[own[:, 0]]) ** 2).sum(-1)
    assert (d_own < 1e-3).all()


def test_one_dimensional_query_is_one_row(index, data):
    dist, ids = index.search(data[3], k=4, nprobe=4)
    d2, i2 = index.search(data[3:4], k=4, nprobe=4)
    assert ids.shape == (1, 4)
    np.testing.assert_array_equal(ids, i2)
    np.testing.assert_array_equal(dist, d2)


def test_results_are_padded_past_the_vectors_found(data):
    small = vlc.compress(data[:200], anchors=20, bytes=4, backend=BACKEND, seed=1)
    dist, ids = small.search(data[:3], k=500, nprobe=1)
    assert ids.shape == (3, 500)
    # One list of 20 holds some of the 200 vectors (each query is an indexed vector, so its
    # list is rarely empty: only where rounding the anchors to f16 moved its nearest one).
    assert (ids >= 0).sum() > 0
    for row in range(3):
        filled = ids[row] >= 0
        count = filled.sum()
        assert count < 200
        assert filled[:count].all() and not filled[count:].any()
        assert np.isinf(dist[row, count:]).all() and (dist[row, count:] > 0).all()
        assert np.isfinite(dist[row, :count]).all()


def test_save_and_load_round_trip(index, data, tmp_path):
    path = tmp_path / "x.vlc"
    index.save(path)
    back = vlc.Index.load(str(path))
    assert back.ntotal == index.ntotal and back.d == 24 and back.anchors == 48
    assert back.bytes == 8 and back.metric == "l2" and back.file_size == os.path.getsize(path)
    assert back.seconds is None
    t = index.seconds
    assert set(t) == {"seeding", "annealing", "coding", "total"}
    assert 0 <= t["seeding"] and 0 <= t["annealing"] and 0 <= t["coding"]
    assert t["seeding"] + t["annealing"] + t["coding"] <= t["total"] * 1.001 + 1e-6
    np.testing.assert_array_equal(back.decompress(), index.decompress())
    np.testing.assert_array_equal(back.assignments, index.assignments)
    a = index.search(data[:30], k=5, nprobe=3)
    b = back.search(data[:30], k=5, nprobe=3)
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[0], b[0])
    # Saving over the file the index was mapped from is safe (the write is atomic).
    back.add(data[:5])
    back.save(path)
    again = vlc.load(path)
    assert again.ntotal == index.ntotal + 5
    np.testing.assert_array_equal(again.decompress()[: index.ntotal], index.decompress())


def test_add_assigns_ids_and_finds_new_vectors(data):
    base = vlc.compress(data[:2000], anchors=32, bytes=8, backend=BACKEND, seed=2)
    assert not base.has_ids
    base.add(data[2000:2100])
    assert base.ntotal == 2100
    np.testing.assert_array_equal(base.ids, np.arange(2100))
    new = data[2100:2110]
    given = np.arange(10, dtype=np.uint64) * 7 + 10**12
    base.add(new.astype(np.float64), ids=given)
    assert base.ntotal == 2110 and base.has_ids
    np.testing.assert_array_equal(base.ids[-10:], given.astype(np.int64))
    # Each added vector's reconstruction finds the vector itself at distance 0 (first, but
    # for ties within f32 rounding: the tables' sums cancel terms of size |anchor| |code|).
    rec = np.stack([base.reconstruct(2100 + j) for j in range(10)])
    dist, ids = base.search(rec, k=3, nprobe=32)
    position = {int(v): p for p, v in enumerate(base.ids)}
    for j in range(10):
        assert given[j] in ids[j]
        assert abs(dist[j, 0]) < 1e-3
        top = base.reconstruct(position[int(ids[j, 0])])
        assert ((top - rec[j]) ** 2).sum() < 1e-3
    # Ids after the largest when none are given.
    base.add(data[:2])
    np.testing.assert_array_equal(base.ids[-2:], [given.max() + 1, given.max() + 2])


def test_remove_by_id(data):
    ids = np.arange(len(data), dtype=np.int64) * 3 + 5
    ix = vlc.compress(data, anchors=30, bytes=8, backend=BACKEND, ids=ids, seed=3)
    np.testing.assert_array_equal(ix.ids, ids)
    gone = ids[::2]
    assert ix.remove(np.concatenate([gone, [-0, 4, 10**15]])) == len(gone)
    assert ix.ntotal == len(data) - len(gone)
    _, found = ix.search(data[:200], k=10, nprobe=30)
    assert not np.isin(found, gone).any()
    assert np.isin(found[found >= 0], ids[1::2]).all()
    assert ix.remove([]) == 0
    with pytest.raises(ValueError, match="fewer than"):
        ix.remove(ids)


def test_metrics(data):
    cos = vlc.compress(data, anchors=32, bytes=8, backend=BACKEND, metric="cosine", seed=4)
    assert cos.metric == "cosine"
    q = data[:20]
    d1, i1 = cos.search(q, k=5, nprobe=8)
    d2, i2 = cos.search(q * 7.5, k=5, nprobe=8)
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_allclose(d1, d2, rtol=1e-4, atol=1e-5)
    assert (d1 >= -1e-4).all() and (d1 <= 2 + 1e-4).all()
    ip = vlc.compress(data, anchors=32, bytes=8, backend=BACKEND, metric="ip", seed=4)
    d, ids = ip.search(q, k=6, nprobe=8)
    assert (np.diff(d, axis=1) <= 1e-4).all()
    rec = np.stack([ip.reconstruct(int(i)) for i in ids[0]])
    np.testing.assert_allclose(d[0], rec @ q[0], rtol=1e-3, atol=1e-3)


def test_input_conversions_give_the_same_index(data):
    # Exact mode: the same input gives the same index on every backend and run.
    x = data[:1500]
    opts = dict(anchors=16, bytes=4, backend=BACKEND, seed=5, exact=True)
    a = vlc.compress(x, **opts)
    b = vlc.compress(x.astype(np.float64), **opts)
    c = vlc.compress(np.asfortranarray(x), **opts)
    d = vlc.compress(x.tolist(), **opts)
    for other in (b, c, d):
        np.testing.assert_array_equal(other.decompress(), a.decompress())
    # A strided view is read as the values it shows.
    wide = np.zeros((1500, 48), np.float32)
    wide[:, ::2] = x
    e = vlc.compress(wide[:, ::2], **opts)
    np.testing.assert_array_equal(e.decompress(), a.decompress())
    h = vlc.compress(x.astype(np.float16), **opts)
    assert h.ntotal == 1500


def test_bad_input_raises_python_exceptions(index, data, tmp_path):
    with pytest.raises(TypeError, match="floating point"):
        vlc.compress(data.astype(np.int32), anchors=4)
    with pytest.raises(TypeError, match="floating point"):
        vlc.compress(data.astype(np.complex64), anchors=4)
    with pytest.raises(ValueError, match="2-D"):
        vlc.compress(data[:, :, None], anchors=4)
    with pytest.raises(ValueError, match="2-D"):
        vlc.compress(data[0], anchors=4)
    bad = data[:100].copy()
    bad[17, 3] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        vlc.compress(bad, anchors=4, backend=BACKEND)
    with pytest.raises(ValueError):
        vlc.compress(data[:10], anchors=11, backend=BACKEND)
    with pytest.raises(ValueError, match="at least 1"):
        vlc.compress(data, anchors=0)
    with pytest.raises(ValueError):
        vlc.compress(data[:100], anchors=4, metric="manhattan", backend=BACKEND)
    with pytest.raises(ValueError, match="unknown backend"):
        vlc.compress(data[:100], anchors=4, backend="tpu")
    with pytest.raises(ValueError, match="ids for"):
        vlc.compress(data[:100], anchors=4, backend=BACKEND, ids=np.arange(99))
    with pytest.raises(ValueError, match="outside"):
        vlc.compress(data[:100], anchors=4, backend=BACKEND, ids=np.arange(100) - 1)
    with pytest.raises(ValueError, match="outside"):
        vlc.compress(data[:100], anchors=4, backend=BACKEND, ids=np.full(100, 2**64 - 1, np.uint64))
    with pytest.raises(TypeError, match="integers"):
        vlc.compress(data[:100], anchors=4, backend=BACKEND, ids=np.zeros(100))
    with pytest.raises(ValueError, match="dimension"):
        index.search(data[:2, :5], k=3)
    with pytest.raises(ValueError, match="at least 1"):
        index.search(data[:2], k=0)
    with pytest.raises(ValueError, match="at least 1"):
        index.search(data[:2], k=3, nprobe=0)
    with pytest.raises(TypeError):
        index.search(data[:2], k=2.5)
    # Results that cannot fit in memory are refused before any work, not a crash.
    with pytest.raises(MemoryError):
        index.search(data[:1000], k=2**60)
    with pytest.raises(ValueError, match="dimension"):
        index.add(data[:3, :10])
    with pytest.raises(IndexError):
        index.reconstruct(index.ntotal)
    with pytest.raises(FileNotFoundError):
        vlc.Index.load(tmp_path / "missing.vlc")
    junk = tmp_path / "junk.vlc"
    junk.write_bytes(b"not an index at all" * 10)
    with pytest.raises(ValueError):
        vlc.Index.load(junk)
    with pytest.raises(OSError):
        index.save(tmp_path / "no" / "such" / "folder" / "x.vlc")
    with pytest.raises(TypeError):
        vlc.Index(object())


def test_failed_calls_leave_the_index_unchanged(index, data):
    before = index.decompress()
    n = index.ntotal
    with pytest.raises(ValueError):
        index.add(np.full((3, 24), np.inf, np.float32))
    with pytest.raises(ValueError):
        index.remove(np.arange(n))
    assert index.ntotal == n
    np.testing.assert_array_equal(index.decompress(), before)


def test_progress_reports_phases_and_raises_what_the_callback_raises(data):
    seen = []
    vlc.compress(
        data[:800],
        anchors=8,
        bytes=4,
        backend=BACKEND,
        iterations=6,
        progress=lambda *a: seen.append(a),
    )
    phases = [p for p, done, _, e in seen if done == 0 and e is None]
    assert phases == ["seeding", "annealing", "coding"]
    energies = [(done, e) for p, done, _, e in seen if e is not None]
    assert [d for d, _ in energies] == list(range(7))
    assert all(np.isfinite(e) and e > 0 for _, e in energies)

    def fail(*_):
        raise KeyError("stop")

    with pytest.raises(KeyError, match="stop"):
        vlc.compress(data[:800], anchors=8, bytes=4, backend=BACKEND, progress=fail)


def test_long_calls_release_the_gil(data):
    big = np.tile(data, (4, 1)) + 0.001 * np.arange(4 * len(data), dtype=np.float32)[:, None]
    count = [0]
    done = threading.Event()

    def spin():
        while not done.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        before = count[0]
        vlc.compress(big, anchors=64, bytes=8, backend=BACKEND, iterations=10)
        during = count[0] - before
    finally:
        done.set()
        t.join()
    assert during > 10000, during


def test_wgpu_backend_is_present_and_exact_mode_matches_the_cpu(data):
    assert "wgpu" in vlc.backends(), "the wgpu backend needs a Vulkan driver (lavapipe)"
    x = data[:1200]
    cpu = vlc.compress(x, anchors=12, bytes=4, backend="cpu", exact=True, seed=11)
    gpu = vlc.compress(x, anchors=12, bytes=4, backend="wgpu", exact=True, seed=11)
    assert cpu.exact and gpu.exact
    np.testing.assert_array_equal(gpu.assignments, cpu.assignments)
    np.testing.assert_array_equal(gpu.decompress(), cpu.decompress())
    grown = vlc.compress(x, anchors=12, bytes=4, backend="cpu", exact=True, seed=11)
    cpu.add(data[1200:1300], backend="cpu")
    grown.add(data[1200:1300], backend="wgpu")
    np.testing.assert_array_equal(grown.assignments, cpu.assignments)


def test_device_search_agrees_with_the_host_and_follows_changes(index, data):
    # The GPU search on wgpu (lavapipe here), or on the backend the run names.
    device = BACKEND if BACKEND != "cpu" else "wgpu"
    rng = np.random.default_rng(SEED)
    q = data[rng.integers(0, len(data), 300)] + 0.05 * rng.standard_normal((300, 24), dtype=np.float32)
    for k, nprobe in [(10, 6), (40, 48)]:
        hd, hi = index.search(q, k=k, nprobe=nprobe)
        dd, di = index.search(q, k=k, nprobe=nprobe, backend=device)
        # The device's base distances come from |q|^2 + |a|^2 - 2 q.a: rounding of order
        # 2^-24 |q|^2 where the host's are exact.
        scale = (q.astype(np.float64) ** 2).sum(1, keepdims=True)
        assert (np.abs(dd - hd) <= 1e-4 * np.abs(hd) + 1e-5 * scale).all()
        # Ids differ only where distances tie within rounding.
        assert (di == hi).mean() >= 0.99
    # An added vector is found by the next device search (the uploaded lists are renewed).
    grown = vlc.compress(data[:1000], anchors=16, bytes=8, backend=BACKEND, seed=6)
    grown.search(q[:5], k=3, nprobe=4, backend=device)
    grown.add(data[1000:1010], ids=np.arange(10) + 5000)
    rec = np.stack([grown.reconstruct(1000 + j) for j in range(10)])
    _, ids = grown.search(rec, k=3, nprobe=16, backend=device)
    for j in range(10):
        assert 5000 + j in ids[j]
    with pytest.raises(ValueError):
        index.search(q, k=3, backend="tpu")
    with pytest.raises(TypeError):
        index.search(q, k=3, backend=3)


def test_rerank_with_kept_vectors(data):
    # With the vectors kept (float16), re-ranking every probed candidate is exact search
    # over them, on the host and on the device, and survives save, load and add.
    device = BACKEND if BACKEND != "cpu" else "wgpu"
    x = data[:2000]
    plain = vlc.compress(x, anchors=24, bytes=4, backend=BACKEND, seed=3)
    kept = vlc.compress(x, anchors=24, bytes=4, backend=BACKEND, seed=3, refine=True)
    assert kept.has_refine and not plain.has_refine
    assert kept.file_size >= plain.file_size + 2 * x.size
    rng = np.random.default_rng(SEED + 7)
    q = x[rng.integers(0, len(x), 200)] + 0.3 * rng.standard_normal((200, 24), dtype=np.float32)
    x16 = x.astype(np.float16).astype(np.float64)
    d2 = ((q[:, None, :].astype(np.float64) - x16[None]) ** 2).sum(-1)
    truth = np.sort(d2, axis=1)[:, :10]
    for backend in ["cpu", device]:
        dist, ids = kept.search(q, k=10, nprobe=24, backend=backend, rerank=1024)
        own = np.take_along_axis(d2, ids, axis=1)
        assert np.allclose(own, truth, rtol=1e-5, atol=1e-5), backend
        assert np.allclose(dist, own, rtol=1e-4, atol=1e-4), backend
    # A pool of candidates lifts recall over the codes alone.
    exact = np.argsort(d2, axis=1, kind="stable")[:, :10]
    recall = lambda ids: np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, exact)])
    _, codes = kept.search(q, k=10, nprobe=8)
    _, pooled = kept.search(q, k=10, nprobe=8, rerank=200)
    assert recall(pooled) > recall(codes) + 0.2
    with pytest.raises(ValueError, match="keeps its vectors"):
        plain.search(q, k=10, rerank=50)
    with pytest.raises(ValueError):
        kept.search(q, k=10, rerank=-1)
    with pytest.raises(ValueError):
        plain.set_refine(x[:100])
    plain.set_refine(x)
    assert plain.has_refine
    plain.drop_refine()
    assert not plain.has_refine


def test_refine_survives_save_load_and_add(data, tmp_path):
    x = data[:1500]
    kept = vlc.compress(x, anchors=16, bytes=4, backend=BACKEND, seed=4, refine=True)
    kept.save(tmp_path / "k.vlc")
    loaded = vlc.Index.load(tmp_path / "k.vlc")
    assert loaded.has_refine
    loaded.add(data[1500:1600], ids=np.arange(100) + 9000)
    dist, ids = loaded.search(data[1500:1600], k=1, nprobe=16, rerank=len(loaded))
    np.testing.assert_array_equal(ids[:, 0], np.arange(100) + 9000)
    assert (dist[:, 0] <= 1e-3).all()
