#!/usr/bin/env bash
# Packs FAISS's GPU wheel for a Hopper host that has PyTorch for CUDA 13 and no network:
# faiss-gpu-cu12 1.9.0.0 (the last release with sm_90 code: see ../fatbin_archs.py) with
# numpy 1.26.4 (it was built against numpy 1), CUDA 12's runtime, and libcublas.so.12 as a
# shim over the host's cuBLAS 13 (cublas12_shim.c). Writes OUT/faiss-gpu.tar.xz.partNN, each
# under 30 MB so that the parts can travel in separate calls; on the host,
# `cat OUT/faiss-gpu.tar.xz.part* | tar xJ -C /tmp/faiss` unpacks site/ and lib/.
set -euo pipefail
out=${1:?usage: prepare.sh OUT}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
py=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
"${py[@]}" -d "$work/whl" faiss-gpu-cu12==1.9.0.0 numpy==1.26.4 nvidia-cuda-runtime-cu12==12.4.127
mkdir -p "$work/pack/site" "$work/pack/lib"
for w in "$work"/whl/faiss_gpu_cu12-*.whl "$work"/whl/numpy-*.whl; do unzip -q -o "$w" -d "$work/pack/site"; done
# Its loader would look for the CUDA 12 wheels' metadata to preload their libraries; the
# libraries come from lib/ (LD_LIBRARY_PATH) instead.
echo '[]' > "$work/pack/site/faiss/PRELOAD_SHARED_LIBRARIES.json"
unzip -q -o -j "$work"/whl/nvidia_cuda_runtime_cu12-*.whl '*/libcudart.so.12' -d "$work/pack/lib"
printf 'libcublas.so.12 { global: cublas*; local: *; };\n' > "$work/v.map"
gcc -O2 -shared -fPIC -o "$work/pack/lib/libcublas.so.12" "$here/cublas12_shim.c" \
    -Wl,--version-script="$work/v.map" -Wl,-soname,libcublas.so.12 -ldl
mkdir -p "$out"
tar -C "$work/pack" -cf - site lib | xz -9 -T0 | split -b 29M -d - "$out/faiss-gpu.tar.xz.part"
ls -la "$out"
