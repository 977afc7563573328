// CSR structure validation on the device, before a sparse matrix-vector product: thread `t`
// checks row offset `t` (the first is 0, none decreases, the last is at most the stored
// entries) and column index `t` (below the column count, for the entries rows use). A
// violation marks this launch's verdict word, which the guarded product reads to write
// nothing, and claims the fault record `[claimed, value, bound, op code]` (see
// check_index.wgsl).
// Bindings: 1 row offsets (rows + 1), 2 column indices, 3 verdicts, 4 the fault record.
// Scalars: 0 rows, 1 columns, 2 stored entries, 4 and 5 the op codes (offsets, columns),
// 14 the verdict word, 15 this launch's serial.

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read> B2: array<u32>;
@group(0) @binding(3) var<storage, read_write> B3: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> B4: array<atomic<u32>>;

fn report(value: u32, bound: u32, code: u32) {
    atomicStore(&B3[s(14u)], s(15u));
    if (atomicExchange(&B4[0], 1u) == 0u) {
        atomicStore(&B4[1], value);
        atomicStore(&B4[2], bound);
        atomicStore(&B4[3], code);
    }
}

fn kernel(t: u32) {
    let rows = s(0u);
    let nnz = s(2u);
    if (t <= rows) {
        let o = B1[t];
        if ((t == 0u && o != 0u) || (t < rows && o > B1[t + 1u]) || (t == rows && o > nnz)) {
            report(o, nnz, s(4u));
        }
    }
    // Entries past the last row's end are never read: they need no check.
    if (t < min(B1[rows], nnz) && B2[t] >= s(1u)) {
        report(B2[t], s(1u), s(5u));
    }
}
