"""Compressed, searchable embedding indexes on the CPU, wgpu or CUDA.

``vlc`` compresses a set of embedding vectors into an index of anchors (cluster centres
found by annealed, outlier-robust k-means), each vector's anchor, and a product-quantised
code of its residual; the index is searched without decompressing it.

>>> import numpy as np, vlc
>>> x = np.random.default_rng(0).standard_normal((5000, 32), dtype=np.float32)
>>> index = vlc.compress(x, anchors=64, bytes=8, backend="cpu")
>>> distances, ids = index.search(x[:3], k=5, nprobe=8)
>>> distances.shape, ids.dtype
((3, 5), dtype('int64'))
>>> index.save("x.vlc"); vlc.Index.load("x.vlc").ntotal
5000

Vectors are given as 2-D numpy arrays (or anything ``numpy.asarray`` accepts) of float16,
float32 or float64; they are converted to float32 (without a copy where they already are
float32 in C order). Ids are integers from 0 to 2**63 - 1. Wrong dtypes are a ``TypeError``;
wrong shapes, non-finite values and bad parameters a ``ValueError``; file system errors an
``OSError``; a backend that cannot start a ``RuntimeError``. Long calls release the GIL.
"""

import os as _os
import sys as _sys

import numpy as _np

if _sys.platform.startswith("linux") and not (
    _os.environ.get("XDG_RUNTIME_DIR") or _os.environ.get("WAYLAND_DISPLAY")
):
    # Mesa's Vulkan device-select layer asks a Wayland compositor which GPU drives the display
    # and prints errors where there is none; its own switch turns it off (set before the
    # Vulkan loader reads the environment).
    _os.environ.setdefault("NODEVICE_SELECT", "1")

from . import _vlc  # noqa: E402

__version__ = _vlc.__version__
__all__ = ["Index", "compress", "load", "set_threads", "backends"]

_MAX_ID = 2**63 - 1


def _vectors(x, what, dim=None, allow_1d=False):
    """``x`` as a C-ordered float32 matrix, checked."""
    a = _np.asarray(x)
    if a.dtype.kind != "f":
        raise TypeError(
            f"{what} must be floating point (float16, float32 or float64), not {a.dtype}"
        )
    if a.ndim == 1 and allow_1d:
        a = a.reshape(1, -1)
    if a.ndim != 2:
        raise ValueError(f"{what} must be a 2-D array (vectors x dimension), not {a.ndim}-D")
    if dim is not None and a.shape[1] != dim:
        raise ValueError(f"{what} have dimension {a.shape[1]}, the index {dim}")
    return _np.ascontiguousarray(a, dtype=_np.float32)


def _ids(ids, count=None):
    """``ids`` as an int64 vector, checked (``count`` of them where given)."""
    a = _np.asarray(ids)
    if a.size == 0:
        a = a.astype(_np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"ids must be integers, not {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"ids must be a 1-D array, not {a.ndim}-D")
    if count is not None and len(a) != count:
        raise ValueError(f"{len(a)} ids for {count} vectors")
    if a.size and (a.min() < 0 or (a.dtype.kind == "u" and a.max() > _MAX_ID)):
        bad = a[(a < 0) | (a > _MAX_ID)][0] if a.dtype.kind == "u" else a[a < 0][0]
        raise ValueError(f"id {bad} is outside 0 to 2**63 - 1")
    return _np.ascontiguousarray(a, dtype=_np.int64)


def _count(value, what, least):
    if isinstance(value, bool) or not isinstance(value, (int, _np.integer)):
        raise TypeError(f"{what} must be an integer, not {type(value).__name__}")
    if value < least:
        raise ValueError(f"{what} must be at least {least}, not {value}")
    return int(value)


def _backend(name):
    if not isinstance(name, str):
        raise TypeError(f"backend must be a string, not {type(name).__name__}")
    return name


def _printer():
    """A progress callback that writes a line per phase and per annealing iteration."""

    def report(phase, done, total, energy):
        if energy is not None:
            print(f"vlc: iteration {done}/{total}: energy {energy:.6f}", file=_sys.stderr)
        elif done == 0:
            print(f"vlc: {phase}" + (f" ({total} steps)" if total else ""), file=_sys.stderr)
        else:
            print(f"vlc: {phase} {done}/{total}", file=_sys.stderr)

    return report


class Index:
    """A compressed index: anchors, each vector's anchor and residual code, and ids.

    Made by :func:`compress` or :meth:`Index.load`. Searching reads it in place; :meth:`add`
    and :meth:`remove` change it (in memory: :meth:`save` writes it).
    """

    __slots__ = ("_inner",)

    def __init__(self, inner):
        if not isinstance(inner, _vlc.Index):
            raise TypeError("make an Index with vlc.compress(...) or vlc.Index.load(path)")
        self._inner = inner

    @classmethod
    def load(cls, path):
        """Opens (memory-maps) and validates an index file written by ``save`` or ``vlc``."""
        return cls(_vlc.Index.load(_os.fspath(path)))

    def save(self, path):
        """Writes the index to ``path`` atomically: an existing file stays whole until the new
        one is complete (saving over the file the index was loaded from is safe)."""
        self._inner.save(_os.fspath(path))

    def search(self, queries, k=10, nprobe=1, backend="cpu", rerank=0):
        """The ``k`` nearest indexed vectors of each query.

        Each query is compared with its ``nprobe`` nearest anchors, whose members are scored
        by their residual codes. Returns ``(distances, ids)``, each ``queries x k`` (float32
        and int64), nearest first: squared L2 distances, for a cosine index 1 - cos, for an
        inner-product index the inner product (largest first). Where the probed lists hold
        fewer than ``k`` vectors the row is padded with id -1 and distance inf (-inf for inner
        product). A 1-D ``queries`` is one query.

        ``backend``: ``"cpu"`` searches on the host's threads; ``"cuda"`` or ``"wgpu"`` run
        every step on that GPU (the index's lists and tables are uploaded on the first such
        search and kept until the index changes; ``k`` or ``nprobe`` above 1024 search on the
        host); ``"auto"`` takes a GPU where one starts, as ``compress`` does. GPU distances
        come from a matrix product (``|q|^2 + |a|^2 - 2 q.a`` for each probed anchor), so they
        differ from the host's in their last bits, and near-ties may order differently.

        ``rerank``: where the index keeps its vectors (``compress(..., refine=True)`` or
        ``set_refine``), the number of candidates (at least ``k``) to gather by their codes
        and re-rank by their exact distances to the query before keeping the ``k`` nearest;
        0 (the default) returns the codes' ranking. Re-ranking a few hundred candidates lifts
        recall to what the probed lists hold.
        """
        k = _count(k, "k", 1)
        nprobe = _count(nprobe, "nprobe", 1)
        rerank = _count(rerank, "rerank", 0)
        if rerank and not self.has_refine:
            raise ValueError(
                "rerank needs an index that keeps its vectors: compress(..., refine=True) "
                "or index.set_refine(x)"
            )
        q = _vectors(queries, "the queries", self.d, allow_1d=True)
        return self._inner.search(q, k, nprobe, _backend(backend), rerank)

    def set_refine(self, x):
        """Keeps ``x`` (the index's vectors, in the order they were compressed and added) in
        the index, as float16, for ``search(..., rerank=...)``: 2 bytes per dimension per
        vector more in memory and in the file. Added vectors are kept too."""
        self._inner.set_refine(_vectors(x, "the vectors", self.d))

    def drop_refine(self):
        """Drops the vectors kept for re-ranking (the codes stay)."""
        self._inner.drop_refine()

    @property
    def has_refine(self):
        """Whether the index keeps its vectors for re-ranking."""
        return self._inner.has_refine

    def add(self, x, ids=None, backend="auto"):
        """Adds ``x``'s vectors without retraining: each is assigned to its nearest anchor and
        its residual coded with the current codebooks, on ``backend``. Their ids are ``ids``
        where given; otherwise the next positions (or, where the index stores ids, the ids
        after its largest)."""
        x = _vectors(x, "the vectors", self.d)
        if ids is not None:
            ids = _ids(ids, len(x))
        self._inner.add(x, ids, _backend(backend))

    def remove(self, ids):
        """Removes the vectors with these ids; returns how many were removed. At least as many
        vectors as anchors must remain."""
        return self._inner.remove(_ids(ids))

    def decompress(self):
        """Every vector reconstructed (anchor plus decoded residual), ``ntotal x d`` float32."""
        return self._inner.decompress()

    def reconstruct(self, position):
        """The reconstruction of the vector at ``position`` (0 to ``ntotal`` - 1)."""
        return self._inner.reconstruct(_count(position, "position", 0))

    @property
    def seconds(self):
        """The compression's time by phase, ``{"seeding", "annealing", "coding", "total"}`` in
        seconds, for an index this process compressed (``None`` for one loaded from a file)."""
        return self._inner.seconds

    @property
    def ntotal(self):
        """Number of vectors indexed."""
        return self._inner.ntotal

    @property
    def d(self):
        """Dimension of the vectors."""
        return self._inner.d

    @property
    def anchors(self):
        """Number of anchors (inverted lists)."""
        return self._inner.anchors

    @property
    def bytes(self):
        """Bytes of residual code per vector."""
        return self._inner.bytes

    @property
    def metric(self):
        """``"l2"``, ``"cosine"`` or ``"ip"``."""
        return self._inner.metric

    @property
    def energy(self):
        """The training's k-means energy (mean squared distance to the anchors)."""
        return self._inner.energy

    @property
    def mse(self):
        """Mean squared reconstruction error, as last measured."""
        return self._inner.mse

    @property
    def exact(self):
        """Whether the index was built in exact (bit-reproducible) mode."""
        return self._inner.exact

    @property
    def ids(self):
        """The vectors' ids in position order (int64; positions where none were given)."""
        return self._inner.ids

    @property
    def has_ids(self):
        """Whether the index stores ids of its own (otherwise ids are positions)."""
        return self._inner.has_ids

    @property
    def assignments(self):
        """Each vector's anchor, in position order (uint32)."""
        return self._inner.assignments

    @property
    def anchor_vectors(self):
        """The anchors, ``anchors x d`` float32 (stored as float16)."""
        return self._inner.anchor_vectors

    @property
    def file_size(self):
        """Bytes the index takes in a file."""
        return self._inner.file_size

    def __len__(self):
        return len(self._inner)

    def __repr__(self):
        return repr(self._inner)


def compress(
    x,
    anchors=256,
    bytes=8,
    *,
    backend="auto",
    iterations=25,
    seed=0,
    metric="l2",
    exact=False,
    tolerance=0.0,
    ids=None,
    progress=False,
    refine=False,
):
    """Compresses the vectors ``x`` (``n x d``) into an :class:`Index`.

    ``anchors``: cluster centres (inverted lists), 1 to n. ``bytes``: bytes of residual code
    per vector (a divisor-friendly value such as 8, 16 or 32; 0 keeps anchors only).
    ``backend``: ``"auto"`` (CUDA, else a hardware GPU through wgpu, else the CPU), ``"cpu"``,
    ``"wgpu"`` or ``"cuda"``. ``iterations``: annealing updates. ``seed``: the random seed.
    ``metric``: ``"l2"``, ``"cosine"`` (vectors normalised first) or ``"ip"``. ``exact``:
    identical results on every backend (slower). ``tolerance``: stop early when the energy's
    relative change falls below it. ``ids``: one integer id per vector (default: positions).
    ``progress``: ``True`` prints each phase and iteration to stderr; a callable is called as
    ``progress(phase, done, total, energy)``: at the start of each phase (``"seeding"``,
    ``"annealing"``, ``"coding"``) with ``done`` 0 and ``energy`` None, after each annealing
    iteration with its number (0: the assignment to the seeds) and energy, after each coding
    step. An exception it raises is raised when the compression ends. ``refine``: keep the
    vectors too (float16, ``2 d`` bytes each) so that ``search`` can re-rank its candidates
    by exact distance (``rerank=``).

    A C-ordered float32 array is read where it lies, not copied (other arrays are converted
    first); no other thread may change it until ``compress`` returns.
    """
    anchors = _count(anchors, "anchors", 1)
    bytes = _count(bytes, "bytes", 0)
    iterations = _count(iterations, "iterations", 0)
    seed = _count(seed, "seed", 0)
    if seed > 2**64 - 1:
        raise ValueError("seed must fit in 64 bits")
    if not isinstance(metric, str):
        raise TypeError(f"metric must be a string, not {type(metric).__name__}")
    _backend(backend)
    x = _vectors(x, "the vectors")
    if ids is not None:
        ids = _ids(ids, len(x))
    if progress is True:
        progress = _printer()
    elif progress is False or progress is None:
        progress = None
    elif not callable(progress):
        raise TypeError("progress must be True, False or a callable")
    inner = _vlc.compress(
        x,
        anchors,
        bytes,
        backend,
        iterations,
        seed,
        metric,
        bool(exact),
        float(tolerance),
        ids,
        progress,
        bool(refine),
    )
    return Index(inner)


def load(path):
    """Opens an index file: the same as :meth:`Index.load`."""
    return Index.load(path)


def set_threads(threads):
    """Sets the threads search and the CPU backend use (0: one per core). Call it before the
    first compression or search: the thread pool is built once per process."""
    _vlc.set_threads(_count(threads, "threads", 0))


def backends():
    """The backends that start on this machine, best first (``"cuda"``, ``"wgpu"``,
    ``"cpu"``)."""
    return _vlc.backends_present()
