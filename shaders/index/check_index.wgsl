// Index validation on the device, before a gather, scatter-add or segment sum uses the
// indices: one thread per index. An index outside `0..bound` (an i32 below 0 is a u32 of at
// least 2^31, so one unsigned comparison covers both) marks this launch's verdict word, which
// the guarded kernel that follows reads to write nothing, and claims the device's fault
// record `[claimed, index, bound, op code]`, which the backend reads at the next synchronize.
// Block 0: the index view. Scalars: 0 the bound, 1 the op code, 14 the verdict word, 15 this
// launch's serial (what the verdict word is set to; the guarded kernel reads the same slots).

@group(0) @binding(1) var<storage, read> B1: array<u32>;
@group(0) @binding(2) var<storage, read_write> B2: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> B3: array<atomic<u32>>;

fn kernel(t: u32) {
    let raw = B1[off(0u, t)];
    if (raw >= s(0u)) {
        atomicStore(&B2[s(14u)], s(15u));
        if (atomicExchange(&B3[0], 1u) == 0u) {
            atomicStore(&B3[1], raw);
            atomicStore(&B3[2], s(0u));
            atomicStore(&B3[3], s(1u));
        }
    }
}
