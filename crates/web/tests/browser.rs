//! hal's primitives on the browser's WebGPU against the CPU backend in the same page, and the
//! icosphere solve on both: `wasm-bindgen-test` in headless Chromium (see the README's test
//! command; CI runs them through ChromeDriver).
//!
//! Inputs are fresh each run (the seed is printed; `WEB_TEST_SEED` is not readable in a
//! browser, so a failure names the seed in its message), with odd sizes, transposed views
//! and special values. Every read goes through `read_async`, the only read a page has.
#![cfg(target_arch = "wasm32")]

use backend_cpu::CpuBackend;
use backend_wgpu::{WgpuBackend, WgpuOptions};
use hal::ir::{Access, IrBinary, IrCmp, IrUnary, ProgramBuilder};
use hal::{Backend, BackendExt, BinaryOp, DType, Error, Layout, ReduceOp, UnaryOp, View};
use residual_compile::icosphere::SplitMix64;
use residual_compile::{KernelCache, Termination, solve_async};
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

async fn gpu() -> WgpuBackend {
    WgpuBackend::open(WgpuOptions::default())
        .await
        .expect("WebGPU compute in this browser")
}

/// A fresh seed, printed so a failure can be replayed by editing it in.
fn seed(test: &str) -> u64 {
    let s = (js_sys::Math::random() * 2f64.powi(53)) as u64;
    web_sys::console::log_1(&format!("{test}: seed {s}").into());
    s
}

/// `n` values in `[-4, 4)`, with the special values at the front when `special`.
fn values(rng: &mut SplitMix64, n: usize, special: bool) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n).map(|_| (rng.uniform() * 8.0 - 4.0) as f32).collect();
    if special {
        let s = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-40,
            -1e-40,
            f32::MIN_POSITIVE,
            3.0e38,
        ];
        for (slot, x) in v.iter_mut().zip(s) {
            *slot = x;
        }
    }
    v
}

/// Equal where both are NaN, else `|got - want| <= rel |want| + abs`.
fn close(g: f32, w: f32, rel: f32, abs: f32) -> bool {
    (g.is_nan() && w.is_nan())
        || g == w
        || (g.is_finite() && w.is_finite() && (g - w).abs() <= rel * w.abs() + abs)
}

/// [`close`] everywhere; the first failure named.
fn assert_close(what: &str, seed: u64, got: &[f32], want: &[f32], rel: f32, abs: f32) {
    assert_close_either(what, seed, got, [want, want], rel, abs);
}

/// `v` with its subnormals flushed to zeros of their signs.
fn flushed(v: &[f32]) -> Vec<f32> {
    let flush = |x: f32| {
        if x != 0.0 && x.abs() < f32::MIN_POSITIVE {
            0.0f32.copysign(x)
        } else {
            x
        }
    };
    v.iter().copied().map(flush).collect()
}

/// [`close`] to the CPU's result on the inputs as given, or within `f32::MIN_POSITIVE` more of
/// its result on the inputs with subnormals flushed (itself flushed): hal lets a GPU flush
/// subnormals to zero at any step (WGSL does) and nothing else (`hal::UnaryOp`'s rules).
fn assert_close_either(
    what: &str,
    seed: u64,
    got: &[f32],
    [want, want_flushed]: [&[f32]; 2],
    rel: f32,
    abs: f32,
) {
    assert_eq!(got.len(), want.len(), "{what} (seed {seed}): lengths");
    for (i, &g) in got.iter().enumerate() {
        let (w, f) = (want[i], want_flushed[i]);
        assert!(
            close(g, w, rel, abs) || close(g, f, rel, abs + f32::MIN_POSITIVE),
            "{what} (seed {seed}): element {i}: WebGPU {g:e}, CPU {w:e} ({f:e} with subnormals flushed)"
        );
    }
}

/// Each case below is one generic function, run on the WebGPU backend and on the CPU one.
/// `op(x)` over `x` as given.
async fn unary_on<B: Backend>(b: &B, op: UnaryOp, x: &[f32]) -> Vec<f32> {
    let l = Layout::contiguous(&[x.len()]);
    let (xb, out) = (b.upload(x).unwrap(), b.alloc(DType::F32, x.len()).unwrap());
    b.unary(op, View::new(&xb, &l), View::new(&out, &l))
        .unwrap();
    b.read_async(&out).await.unwrap()
}

/// `op(x, y)` with `x` seen as the transpose of a `[cols, rows]` matrix and `y`'s first
/// `cols` values broadcast down the rows.
async fn binary_on<B: Backend>(b: &B, op: BinaryOp, x: &[f32], y: &[f32]) -> Vec<f32> {
    let (rows, cols) = (17, 59);
    let xl = Layout::contiguous(&[cols, rows]).transpose(0, 1).unwrap();
    let yl = Layout::contiguous(&[1, cols])
        .broadcast_to(&[rows, cols])
        .unwrap();
    let ol = Layout::contiguous(&[rows, cols]);
    let (xb, yb) = (b.upload(x).unwrap(), b.upload(y).unwrap());
    let out = b.alloc(DType::F32, rows * cols).unwrap();
    let views = [
        View::new(&xb, &xl),
        View::new(&yb, &yl),
        View::new(&out, &ol),
    ];
    let [x, y, o] = views;
    b.binary(op, x, y, o).unwrap();
    b.read_async(&out).await.unwrap()
}

/// `op` over `axis` of the `[m, k]` matrix `a` seen transposed (`[k, m]`).
async fn reduce_on<B: Backend>(
    b: &B,
    op: ReduceOp,
    a: &[f32],
    [m, k]: [usize; 2],
    axis: usize,
) -> Vec<f32> {
    let at = Layout::contiguous(&[m, k]).transpose(0, 1).unwrap();
    let mut shape = vec![k, m];
    shape[axis] = 1;
    let ol = Layout::contiguous(&shape);
    let (ab, out) = (
        b.upload(a).unwrap(),
        b.alloc(DType::F32, shape[0] * shape[1]).unwrap(),
    );
    b.reduce(op, View::new(&ab, &at), &[axis], View::new(&out, &ol))
        .unwrap();
    b.read_async(&out).await.unwrap()
}

/// `a [m, k] @ b [k, n]`, `b` read transposed from an `[n, k]` buffer when `transposed`.
async fn matmul_on<B: Backend>(
    be: &B,
    a: &[f32],
    b: &[f32],
    [m, k, n]: [usize; 3],
    transposed: bool,
) -> Vec<f32> {
    let (la, lo) = (Layout::contiguous(&[m, k]), Layout::contiguous(&[m, n]));
    let lb = if transposed {
        Layout::contiguous(&[n, k]).transpose(0, 1).unwrap()
    } else {
        Layout::contiguous(&[k, n])
    };
    let (ab, bb) = (be.upload(a).unwrap(), be.upload(b).unwrap());
    let out = be.alloc(DType::F32, m * n).unwrap();
    be.matmul(
        View::new(&ab, &la),
        View::new(&bb, &lb),
        View::new(&out, &lo),
        1.0,
        0.0,
    )
    .unwrap();
    be.read_async(&out).await.unwrap()
}

/// The rows of `x: [rows, d]` gathered by `index: [picks, d]`, scattered back by the same
/// index (added), and `x`'s per-segment sums and counts.
async fn indexing_on<B: Backend>(
    b: &B,
    x: &[f32],
    index: &[u32],
    segment: &[u32],
    segments: usize,
) -> [Vec<f32>; 4] {
    let (rows, d) = (segment.len(), x.len() / segment.len());
    let picks = index.len() / d;
    let (lx, li) = (
        Layout::contiguous(&[rows, d]),
        Layout::contiguous(&[picks, d]),
    );
    let (ls, lc) = (
        Layout::contiguous(&[segments, d]),
        Layout::contiguous(&[segments]),
    );
    let lseg = Layout::contiguous(&[rows]);
    let (xb, ib, sb) = (
        b.upload(x).unwrap(),
        b.upload(index).unwrap(),
        b.upload(segment).unwrap(),
    );
    let alloc = |n| b.alloc(DType::F32, n).unwrap();
    let (gathered, scattered) = (alloc(picks * d), alloc(rows * d));
    let (sums, counts) = (alloc(segments * d), alloc(segments));
    b.gather(
        View::new(&xb, &lx),
        0,
        View::new(&ib, &li),
        View::new(&gathered, &li),
    )
    .unwrap();
    b.scatter_add(
        View::new(&gathered, &li),
        0,
        View::new(&ib, &li),
        View::new(&scattered, &lx),
    )
    .unwrap();
    b.segment_sum(
        View::new(&xb, &lx),
        View::new(&sb, &lseg),
        None,
        View::new(&sums, &ls),
        View::new(&counts, &lc),
    )
    .unwrap();
    let mut out = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for (slot, buffer) in out.iter_mut().zip([&gathered, &scattered, &sums, &counts]) {
        *slot = b.read_async(buffer).await.unwrap();
    }
    out
}

/// y = x > 0 ? sqrt(x) : fma(x, x, -1), then min(y, inf): an infinite constant on the way
/// (WebGPU refuses infinities as constant expressions; the lowering must make them at run
/// time).
fn select_sqrt_fma() -> hal::ir::Program {
    let mut p = ProgramBuilder::new("web_select_sqrt_fma");
    let xb = p.buffer(DType::F32, Access::Read);
    let yb = p.buffer(DType::F32, Access::Write);
    let i = p.index();
    let x = p.load(xb, i);
    let zero = p.const_f32(0.0);
    let minus_one = p.const_f32(-1.0);
    let big = p.const_f32(f32::INFINITY);
    let root = p.unary(IrUnary::Sqrt, x);
    let square = p.fma(x, x, minus_one);
    let positive = p.cmp(IrCmp::Gt, x, zero);
    let picked = p.select(positive, root, square);
    let y = p.binary(IrBinary::Min, picked, big);
    p.store(yb, i, y);
    p.build().unwrap()
}

async fn program_on<B: Backend>(b: &B, x: &[f32]) -> Vec<f32> {
    let kernel = b.compile(&select_sqrt_fma()).unwrap();
    let (xb, out) = (b.upload(x).unwrap(), b.alloc(DType::F32, x.len()).unwrap());
    b.launch(&kernel, &[&xb, &out], x.len()).unwrap();
    b.read_async(&out).await.unwrap()
}

#[wasm_bindgen_test]
async fn elementwise_ops_match_the_cpu_with_special_values() {
    let (gpu, cpu) = (gpu().await, CpuBackend::new());
    let s = seed("elementwise");
    let mut rng = SplitMix64(s);
    let x = values(&mut rng, 1003, true);
    let y = values(&mut rng, 1003, true);
    let (xf, yf) = (flushed(&x), flushed(&y));
    let u = 2f32.powi(-24);
    let (fn_rel, fn_abs) = (4.0 * u + 2f32.powi(-18), 2f32.powi(-19));
    for (op, rel, abs) in [
        (UnaryOp::Neg, 0.0, 0.0),
        (UnaryOp::Abs, 0.0, 0.0),
        (UnaryOp::Relu, 0.0, 0.0),
        (UnaryOp::Floor, 0.0, 0.0),
        (UnaryOp::Ceil, 0.0, 0.0),
        (UnaryOp::Round, 0.0, 0.0),
        (UnaryOp::Sign, 0.0, 0.0),
        (UnaryOp::Square, 0.0, 0.0),
        (UnaryOp::Recip, 2.0 * u, 0.0),
        (UnaryOp::Exp, fn_rel, fn_abs),
        (UnaryOp::Exp2, fn_rel, fn_abs),
        (UnaryOp::Log, fn_rel, fn_abs),
        (UnaryOp::Log2, fn_rel, fn_abs),
        (UnaryOp::Sqrt, fn_rel, fn_abs),
        (UnaryOp::Rsqrt, fn_rel, fn_abs),
        (UnaryOp::Sin, fn_rel, fn_abs),
        (UnaryOp::Cos, fn_rel, fn_abs),
        (UnaryOp::Tanh, fn_rel, fn_abs),
        (UnaryOp::Sigmoid, fn_rel, fn_abs),
        (UnaryOp::Silu, fn_rel, fn_abs),
        (UnaryOp::Gelu, fn_rel, fn_abs),
    ] {
        let mut got = unary_on(&gpu, op, &x).await;
        let want = unary_on(&cpu, op, &x).await;
        let want_flushed = flushed(&unary_on(&cpu, op, &xf).await);
        if matches!(op, UnaryOp::Sin | UnaryOp::Cos) {
            // As the parity suite: of a huge argument only a finite value in [-1, 1] is asked.
            for (i, &xi) in x.iter().enumerate() {
                if xi.is_finite() && xi.abs() > 1e4 {
                    let g = got[i];
                    assert!(
                        (-1.0..=1.0).contains(&g),
                        "{op:?}({xi:e}) = {g:e} (seed {s})"
                    );
                    got[i] = want[i];
                }
            }
        }
        assert_close_either(
            &format!("{op:?}"),
            s,
            &got,
            [&want, &want_flushed],
            rel,
            abs,
        );
    }
    for op in [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max] {
        let got = binary_on(&gpu, op, &x, &y).await;
        let want = binary_on(&cpu, op, &x, &y).await;
        let want_flushed = flushed(&binary_on(&cpu, op, &xf, &yf).await);
        assert_close_either(
            &format!("{op:?}"),
            s,
            &got,
            [&want, &want_flushed],
            2.0 * u,
            0.0,
        );
    }
}

#[wasm_bindgen_test]
async fn reductions_and_products_match_the_cpu() {
    let (gpu, cpu) = (gpu().await, CpuBackend::new());
    let s = seed("reduce and matmul");
    let mut rng = SplitMix64(s);
    let (m, k, n) = (67, 45, 29);
    let a = values(&mut rng, m * k, false);
    let b = values(&mut rng, k * n, false);
    for (op, axis) in [(ReduceOp::Sum, 0), (ReduceOp::Sum, 1), (ReduceOp::Max, 1)] {
        let got = reduce_on(&gpu, op, &a, [m, k], axis).await;
        let want = reduce_on(&cpu, op, &a, [m, k], axis).await;
        // 2^-17 sum|x| with |x| < 4 over at most 67 terms, plus u|ref|.
        let abs = 2f32.powi(-17) * 4.0 * m as f32;
        assert_close(
            &format!("{op:?} over axis {axis}"),
            s,
            &got,
            &want,
            2f32.powi(-24),
            abs,
        );
    }
    for transposed in [false, true] {
        let got = matmul_on(&gpu, &a, &b, [m, k, n], transposed).await;
        let want = matmul_on(&cpu, &a, &b, [m, k, n], transposed).await;
        // 2^-18 k (|a| @ |b|) <= 2^-18 k * k * 16, plus u|ref|.
        let abs = 2f32.powi(-18) * (k * k) as f32 * 16.0;
        let what = format!("a @ b (b transposed: {transposed})");
        assert_close(&what, s, &got, &want, 2f32.powi(-24), abs);
    }
}

#[wasm_bindgen_test]
async fn gather_scatter_and_segment_sums_match_the_cpu() {
    let (gpu, cpu) = (gpu().await, CpuBackend::new());
    let s = seed("indexing");
    let mut rng = SplitMix64(s);
    let (rows, d, picks, segments) = (41, 7, 97, 5);
    let x = values(&mut rng, rows * d, false);
    let index: Vec<u32> = (0..picks * d)
        .map(|_| (rng.next_u64() % rows as u64) as u32)
        .collect();
    let segment: Vec<u32> = (0..rows)
        .map(|_| (rng.next_u64() % segments as u64) as u32)
        .collect();
    let got = indexing_on(&gpu, &x, &index, &segment, segments).await;
    let want = indexing_on(&cpu, &x, &index, &segment, segments).await;
    // Gathers and counts are exact; a scatter adds at most `picks` terms of |x| < 4 per
    // element in any order; segment sums are within Sum's tolerance.
    let scatter_abs = 2.0 * picks as f32 * 2.0 * 2f32.powi(-24) * picks as f32 * 4.0;
    let sum_abs = 2f32.powi(-17) * 4.0 * rows as f32;
    for (i, (what, rel, abs)) in [
        ("gather", 0.0, 0.0),
        ("scatter_add", 0.0, scatter_abs),
        ("segment_sum sums", 2f32.powi(-24), sum_abs),
        ("segment_sum counts", 0.0, 0.0),
    ]
    .into_iter()
    .enumerate()
    {
        assert_close(what, s, &got[i], &want[i], rel, abs);
    }
}

#[wasm_bindgen_test]
async fn an_ir_program_matches_the_cpu() {
    let (gpu, cpu) = (gpu().await, CpuBackend::new());
    let s = seed("IR program");
    let data = values(&mut SplitMix64(s), 517, true);
    let got = program_on(&gpu, &data).await;
    let want = program_on(&cpu, &data).await;
    let want_flushed = flushed(&program_on(&cpu, &flushed(&data)).await);
    let u = 2f32.powi(-24);
    let (rel, abs) = (4.0 * u + 2f32.powi(-18), 2f32.powi(-19));
    assert_close_either("IR program", s, &got, [&want, &want_flushed], rel, abs);
}

#[wasm_bindgen_test]
async fn a_bad_index_is_reported_by_the_next_read_and_blocking_reads_are_refused() {
    let gpu = gpu().await;
    let x = gpu.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    let index = gpu.upload(&[0u32, 7]).unwrap();
    let out = gpu.alloc(DType::F32, 2).unwrap();
    let (lx, li) = (Layout::contiguous(&[3]), Layout::contiguous(&[2]));
    gpu.gather(
        View::new(&x, &lx),
        0,
        View::new(&index, &li),
        View::new(&out, &li),
    )
    .unwrap();
    match gpu.read_async::<f32>(&out).await {
        Err(Error::IndexOutOfRange { .. }) => {}
        other => panic!("a gather with index 7 of 3 rows read back {other:?}"),
    }
    // The fault is reported once; the device goes on.
    assert_eq!(
        gpu.read_async::<f32>(&x).await.unwrap(),
        vec![1.0, 2.0, 3.0]
    );
    match gpu.read::<f32>(&x) {
        Err(Error::Unsupported { detail, .. }) => assert!(detail.contains("read_bytes_async")),
        other => panic!("a blocking read in a browser gave {other:?}"),
    }
}

#[wasm_bindgen_test]
async fn the_icosphere_solves_on_webgpu_to_the_cpu_cost() {
    let gpu = gpu().await;
    let mut finals = Vec::new();
    for on_gpu in [true, false] {
        let (_, _, mut problem) = web::icosphere_problem(3).unwrap();
        let mut seen = 0;
        let mut observe = |p: residual_compile::Progress<'_>| {
            assert_eq!(p.parameters.len(), 642 * 3);
            seen += 1;
            std::ops::ControlFlow::Continue(())
        };
        let options = web::options();
        let summary = if on_gpu {
            solve_async(
                &gpu,
                &mut problem,
                &options,
                &KernelCache::new(),
                Some(&mut observe),
            )
            .await
        } else {
            let cpu = CpuBackend::new();
            solve_async(
                &cpu,
                &mut problem,
                &options,
                &KernelCache::new(),
                Some(&mut observe),
            )
            .await
        }
        .unwrap();
        assert_eq!(summary.termination, Termination::FunctionTolerance);
        assert!(seen >= summary.iterations.saturating_sub(1) && seen > 0);
        assert!(summary.final_cost < summary.initial_cost / 50.0);
        finals.push(summary.final_cost);
    }
    let rel = (finals[0] - finals[1]).abs() / finals[1];
    assert!(
        rel < 1e-3,
        "WebGPU final cost {} against the CPU's {}",
        finals[0],
        finals[1]
    );
}
