"""Lists the GPU code a wheel's shared libraries carry: for each CUDA fat binary, its entries'
kind (SASS, machine code for one architecture, or PTX, which the driver can compile for newer
ones) and architecture. A GPU runs a library only with SASS of its own major architecture or
PTX of an older one.

    python python/examples/fatbin_archs.py faiss_gpu_cu12-1.14.1-...whl

PyPI's `faiss-gpu-cu12` from 1.9.0.post1 to 1.14.1.post1 carries SASS for sm_70 and sm_80
only and no PTX, so it cannot run on Hopper (sm_90: H100, H200); 1.8.0.2 and 1.9.0.0 carry
sm_60 to sm_90 (and need numpy < 2, libcudart.so.12 and libcublas.so.12).
"""

import struct
import sys
import zipfile

# A fat binary starts with this magic, then a version (u16), a header size (u16) and the size
# of its entries (u64); each entry: kind (u16: 1 PTX, 2 SASS), a u16, its header size (u32),
# its payload size (u64), then at byte 28 its architecture (u32, e.g. 80 for sm_80).
MAGIC = b"\x50\xed\x55\xba"


def entries(data):
    found = {}
    at = data.find(MAGIC)
    while at >= 0:
        _, header, size = struct.unpack_from("<HHQ", data, at + 4)
        p, end = at + header, at + header + size
        while p + 32 <= end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, p)
            arch = struct.unpack_from("<I", data, p + 28)[0]
            key = ("PTX" if kind == 1 else "SASS", arch)
            found[key] = found.get(key, 0) + 1
            if entry_header == 0:
                break
            p += entry_header + payload
        at = data.find(MAGIC, at + 1)
    return found


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with zipfile.ZipFile(sys.argv[1]) as z:
        for name in z.namelist():
            if ".so" in name:
                found = entries(z.read(name))
                if found:
                    kinds = ", ".join(f"{k} sm_{a} x{n}" for (k, a), n in sorted(found.items()))
                    print(f"{name}: {kinds}")


if __name__ == "__main__":
    main()
