// A correctly rounded a * b + c for the reproducible kernels (hal::Precision::Reproducible).
// Where the device's fma() is fused (probed once per device; scalar 11 = 1 in modules composed
// before the probe) it is used as is.
// Scalar 12 must be 0, and a file including this one also includes keep.wgsl (its `keep`
// is the optimisation barrier used here).
// lavapipe computes fma() as a multiply and then an add, two roundings, so there it is built
// from separately rounded operations, which lavapipe never contracts: Dekker's exact product
// (Veltkamp splitting by 2^12 + 1), Knuth's TwoSum, and Boldo and Melquiond's rounding to odd
// ("Emulation of FMA and correctly rounded sums: proved algorithms using rounding to odd",
// IEEE Transactions on Computers 57(4), 2008). Exact unless the product overflows or its low
// part falls into the subnormal range.

fn split_high(a: f32) -> f32 {
    let c = keep(4097.0 * a);
    return keep(c - keep(c - a));
}

fn fma_emulated(a: f32, b: f32, c: f32) -> f32 {
    // a * b = p + e exactly.
    let p = keep(a * b);
    let ah = split_high(a);
    let al = keep(a - ah);
    let bh = split_high(b);
    let bl = keep(b - bh);
    let e = keep(keep(keep(keep(keep(ah * bh) - p) + keep(ah * bl)) + keep(al * bh)) + keep(al * bl));
    // c + p = th + tl exactly.
    let th = keep(c + p);
    let z = keep(th - c);
    let tl = keep(keep(c - keep(th - z)) + keep(p - z));
    // v = tl + e rounded to odd: when the sum was inexact and rounded to an even significand,
    // step one ulp toward the exact value.
    let v = keep(tl + e);
    let w = keep(v - tl);
    let err = keep(keep(tl - keep(v - w)) + keep(e - w));
    let bits = bitcast<u32>(v);
    var odd = v;
    if (err != 0.0 && (bits & 1u) == 0u) {
        if ((err > 0.0) == (v > 0.0)) {
            odd = bitcast<f32>(bits + 1u);
        } else {
            odd = bitcast<f32>(bits - 1u);
        }
    }
    return th + odd;
}

// The backend fills this slot once it has probed the device: with `fma()` alone where it is
// fused, with the emulation alone where it is not. NVIDIA's Vulkan compiler executes both
// sides of the run-time test below (a predicated emulation: a 10x slower nearest-centroid
// search), so the test is only for modules composed before the probe.
// @slot fma_choice
fn fma_exact(a: f32, b: f32, c: f32) -> f32 {
    if (s(11u) == 1u) {
        return fma(a, b, c);
    }
    return fma_emulated(a, b, c);
}
// @end
