"""Converts the UCI handwritten digits that scikit-learn ships (sklearn/datasets/data/digits.csv.gz:
1,797 rows of 64 pixel values 0..16 and a label; CC BY 4.0, Alpaydin & Kaynak, UCI ML repository)
into digits.bin, the file the `digits` example reads:

    magic b"DIGITS01", u32 little-endian row count, then per row 64 pixel bytes and 1 label byte.

Run once: python3 crates/tensor-autograd/data/convert_digits.py (needs scikit-learn).
"""
import gzip, os, struct
import sklearn

source = os.path.join(os.path.dirname(sklearn.__file__), "datasets", "data", "digits.csv.gz")
rows = []
with gzip.open(source, "rt") as f:
    for line in f:
        line = line.strip()
        if not line:
            continue
        values = [int(float(v)) for v in line.split(",")]
        assert len(values) == 65 and all(0 <= v <= 16 for v in values[:64]) and 0 <= values[64] <= 9
        rows.append(values)
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.bin")
with open(out, "wb") as f:
    f.write(b"DIGITS01")
    f.write(struct.pack("<I", len(rows)))
    for r in rows:
        f.write(bytes(r))
print(f"wrote {len(rows)} rows to {out}")
