// CSR matrix-vector product, one thread per row: y = alpha A x + beta y (beta 0 ignores y).
// Bindings: 1 row offsets, 2 column indices, 3 values, 4 x, 5 y. Scalars: 0 alpha, 1 beta.

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read> B2: array<u32>;
@group(0) @binding(3) var<storage, read> B3: array<f32>;
@group(0) @binding(4) var<storage, read> B4: array<f32>;
@group(0) @binding(5) var<storage, read_write> B5: array<f32>;

// After a device-side index check, the backend replaces this with a read of the launch's
// verdict word: a kernel whose indices failed writes nothing.
// @slot guard
fn skipped() -> bool { return false; }
// @end

fn kernel(t: u32) {
    if (skipped()) { return; }
    var acc = 0.0;
    for (var k = B1[t]; k < B1[t + 1u]; k = k + 1u) {
        acc = acc + B3[k] * B4[B2[k]];
    }
    var v = sf(0u) * acc;
    if (sf(1u) != 0.0) { v = v + sf(1u) * B5[t]; }
    B5[t] = v;
}
