// Shared by the cooperative-matrix kernels (gemm_coop.wgsl, nearest_coop.wgsl), which define
// BK and the tiling SR x SC subgroups of TM x TN fragments: the workgroup tiles and how
// threads copy their shares of them from the packed operands (MA, MB: f16 read as words, eight
// halves a load) into workgroup memory.

const BM: u32 = SR * TM * 16u;
const BN: u32 = SC * TN * 16u;
// Padded row strides of the workgroup tiles, in halves.
const AS: u32 = BK + 8u;
const BS: u32 = BN + 8u;
// Loads of eight halves per thread per tile: A is BM rows of BK / 8, B is BK rows of BN / 8.
const AV: u32 = BM * BK / 2048u;
const BV: u32 = BN * BK / 2048u;

var<workgroup> SA: array<f16, BM * AS>;
var<workgroup> SB: array<f16, BK * BS>;
// Every workgroup variable here is a whole number of 16-byte units: fragment loads need
// 16-byte-aligned rows, and the driver packs the variables in an order of its choosing (a
// 4-byte flag ahead of the tiles shifted them by two halves, measured on an H200).
var<workgroup> skip: vec4<u32>;
// @slot low_tiles
// @end

// Eight halves from four words, in order.
fn halves(w: vec4<u32>) -> array<f16, 8> {
    let p = unpack2x16float(w.x);
    let q = unpack2x16float(w.y);
    let r = unpack2x16float(w.z);
    let t = unpack2x16float(w.w);
    return array<f16, 8>(f16(p.x), f16(p.y), f16(q.x), f16(q.y), f16(r.x), f16(r.y), f16(t.x), f16(t.y));
}

fn put_a(q: u32, w: vec4<u32>, lo: bool) {
    let i = (q / (BK / 8u)) * AS + (q % (BK / 8u)) * 8u;
    let v = halves(w);
    // @slot put_a_low
    // @end
    for (var e = 0u; e < 8u; e = e + 1u) { SA[i + e] = v[e]; }
}

fn put_b(q: u32, w: vec4<u32>, lo: bool) {
    let i = (q / (BN / 8u)) * BS + (q % (BN / 8u)) * 8u;
    let v = halves(w);
    // @slot put_b_low
    // @end
    for (var e = 0u; e < 8u; e = e + 1u) { SB[i + e] = v[e]; }
}

// The index (in loads of eight halves) in A of thread share `q` of the tile at `k0`.
fn a_at(base: u32, q: u32, k0: u32) -> u32 {
    return (base + (q / (BK / 8u)) * s(1u) + k0) / 8u + q % (BK / 8u);
}

fn b_at(base: u32, q: u32, k0: u32) -> u32 {
    return (base + (k0 + q / (BN / 8u)) * s(2u)) / 8u + q % (BN / 8u);
}

