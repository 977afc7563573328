//! The parity suite on the wgpu backend against the CPU reference. Requires a wgpu adapter:
//! on a machine without a GPU, Mesa's software Vulkan driver (`apt-get install
//! mesa-vulkan-drivers libvulkan1`) provides one. A missing adapter fails these tests; they do
//! not pass by skipping.

use backend_wgpu::WgpuBackend;
use hal::{Backend, BackendExt, DType, Layout, ReduceOp, View};
use hal_parity::{Suite, SuiteConfig, format_table};

fn gpu() -> WgpuBackend {
    WgpuBackend::new().unwrap_or_else(|e| panic!("the wgpu backend is required here: {e}"))
}

#[test]
fn wgpu_matches_the_cpu_reference_on_every_primitive() {
    parity_with(gpu());
}

/// The same suite with every optional adapter feature turned off (parameters in a buffer,
/// packed 16-bit storage, workgroup-memory reductions): the paths of adapters without them.
#[test]
fn wgpu_fallbacks_match_the_cpu_reference() {
    let gpu = WgpuBackend::with_options(backend_wgpu::WgpuOptions::fallbacks())
        .unwrap_or_else(|e| panic!("the wgpu backend is required here: {e}"));
    assert_eq!(gpu.features_in_use(), "none (fallbacks only)");
    parity_with(gpu);
}

fn parity_with(gpu: WgpuBackend) {
    let cpu = backend_cpu::CpuBackend::new();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let report = Suite::new(&gpu, &cpu, false, SuiteConfig { cases: 6, seed }).run();
    println!(
        "seed {seed} on {} using {}\n{}",
        gpu.info().name,
        gpu.features_in_use(),
        format_table(std::slice::from_ref(&report), &[])
    );
    assert!(report.rows.len() >= 25);
    assert!(
        report.passed(),
        "parity failures (seed {seed}):\n{}",
        format_table(std::slice::from_ref(&report), &[])
    );
}

/// llvmpipe stops any shader invocation's loops after 65535 iterations; long reductions and
/// segment sums must split their work so no thread comes near that (they once silently
/// summed only the first 13107 rows).
/// `hal::Backend` is `Send + Sync`: one thread allocating (each fresh buffer inside an
/// out-of-memory error scope) while another compiles kernels (each inside a validation scope)
/// must not interleave their scopes. wgpu keeps the scopes per thread only with its `std`
/// feature; without it they are one stack per device and this panicked in wgpu.
#[test]
fn a_handle_is_usable_from_two_threads_at_once() {
    use hal::ir::{Access, ProgramBuilder};
    let b = gpu();
    let other = b.clone();
    let allocating = std::thread::spawn(move || {
        let mut held = Vec::new();
        for i in 0..20000 {
            held.push(other.alloc(DType::F32, 16 + i).unwrap());
            if held.len() > 64 {
                held.clear();
            }
        }
    });
    for k in 0..300 {
        let mut p = ProgramBuilder::new("add_constant");
        let buf = p.buffer(DType::F32, Access::ReadWrite);
        let i = p.index();
        let x = p.load(buf, i);
        let c = p.const_f32(k as f32);
        let y = p.add(x, c);
        p.store(buf, i, y);
        b.compile(&p.build().unwrap()).unwrap();
    }
    allocating.join().expect("the allocating thread panicked");
}

#[test]
fn long_reductions_are_not_truncated() {
    let gpu = gpu();
    for n in [16_385usize, 200_000] {
        let ones = gpu.upload(&vec![1.0f32; n]).unwrap();
        let zeros = gpu.upload(&vec![0u32; n]).unwrap();
        let (sums, counts, total) = (
            gpu.alloc(DType::F32, 1).unwrap(),
            gpu.alloc(DType::F32, 1).unwrap(),
            gpu.alloc(DType::F32, 1).unwrap(),
        );
        let (l1, ln) = (Layout::contiguous(&[1]), Layout::contiguous(&[n]));
        gpu.segment_sum(
            View::new(&ones, &Layout::contiguous(&[n, 1])),
            View::new(&zeros, &ln),
            None,
            View::new(&sums, &Layout::contiguous(&[1, 1])),
            View::new(&counts, &l1),
        )
        .unwrap();
        gpu.reduce(
            ReduceOp::Sum,
            View::new(&ones, &ln),
            &[0],
            View::new(&total, &l1),
        )
        .unwrap();
        for (what, buf) in [
            ("segment sum", &sums),
            ("segment count", &counts),
            ("reduce", &total),
        ] {
            assert_eq!(
                gpu.read::<f32>(buf).unwrap(),
                vec![n as f32],
                "{what} over {n} ones"
            );
        }
        let idx = gpu.alloc(DType::U32, 1).unwrap();
        let mut v = vec![0.0f32; n];
        v[n - 3] = 5.0;
        let vb = gpu.upload(&v).unwrap();
        gpu.arg_reduce(
            hal::ArgReduceOp::ArgMax,
            View::new(&vb, &ln),
            0,
            View::new(&idx, &l1),
        )
        .unwrap();
        assert_eq!(gpu.read::<u32>(&idx).unwrap(), vec![(n - 3) as u32]);
    }
}

#[test]
fn wgpu_errors_are_errors() {
    let gpu = gpu();
    let too_big = gpu.max_binding_bytes() / 4 + 1;
    match gpu.alloc(DType::F32, too_big as usize) {
        Err(hal::Error::AllocationTooLarge { limit_bytes, .. }) => {
            assert_eq!(limit_bytes, gpu.max_binding_bytes())
        }
        other => panic!("expected AllocationTooLarge, got {other:?}"),
    }
    // An out-of-range load in a program is reported at the next synchronize.
    let mut b = hal::ir::ProgramBuilder::new("past_the_end");
    let x = b.buffer(DType::F32, hal::ir::Access::Read);
    let y = b.buffer(DType::F32, hal::ir::Access::Write);
    let i = b.index();
    let ten = b.const_u32(10);
    let j = b.add(i, ten);
    let v = b.load(x, j);
    b.store(y, i, v);
    let k = gpu.compile(&b.build().unwrap()).unwrap();
    let (xb, yb) = (
        gpu.alloc(DType::F32, 12).unwrap(),
        gpu.alloc(DType::F32, 12).unwrap(),
    );
    gpu.launch(&k, &[&xb, &yb], 4).unwrap();
    let err = gpu.synchronize().unwrap_err();
    assert!(
        matches!(err, hal::Error::IndexOutOfRange { bound: 12, .. }),
        "{err}"
    );
    gpu.synchronize().unwrap();
}

/// The vec4 path for f32 arithmetic on aligned contiguous operands, and the scalar fallback
/// next to it (an offset of 1 element, a length not a multiple of 4), against the CPU.
#[test]
fn vec4_arithmetic_matches_the_cpu() {
    let (gpu, cpu) = (gpu(), backend_cpu::CpuBackend::new());
    let data: Vec<f32> = (0..4100)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 37.0)
        .collect();
    let other: Vec<f32> = (0..4100)
        .map(|i| ((i * 104_729 % 997) as f32 + 1.0) / 91.0)
        .collect();
    for (offset, len) in [(0usize, 4096usize), (4, 4092), (1, 4096), (0, 4097)] {
        let l = Layout::contiguous(&[len]).narrow(0, 0, len).unwrap();
        let l = Layout { offset, ..l };
        for op in [
            hal::BinaryOp::Add,
            hal::BinaryOp::Sub,
            hal::BinaryOp::Mul,
            hal::BinaryOp::Div,
        ] {
            let run = |b: &dyn Fn() -> Vec<f32>| b();
            let g = run(&|| {
                let (x, y, o) = (
                    gpu.upload(&data).unwrap(),
                    gpu.upload(&other).unwrap(),
                    gpu.alloc(DType::F32, 4100).unwrap(),
                );
                gpu.binary(op, View::new(&x, &l), View::new(&y, &l), View::new(&o, &l))
                    .unwrap();
                gpu.read::<f32>(&o).unwrap()
            });
            let c = run(&|| {
                let (x, y, o) = (
                    cpu.upload(&data).unwrap(),
                    cpu.upload(&other).unwrap(),
                    cpu.alloc(DType::F32, 4100).unwrap(),
                );
                cpu.binary(op, View::new(&x, &l), View::new(&y, &l), View::new(&o, &l))
                    .unwrap();
                cpu.read::<f32>(&o).unwrap()
            });
            for i in 0..4100 {
                let tol = 2.5e-7 * c[i].abs();
                assert!(
                    (g[i] - c[i]).abs() <= tol,
                    "{op:?} offset {offset} len {len} element {i}: {} vs {}",
                    g[i],
                    c[i]
                );
            }
        }
    }
}

/// A loop that allocates and drops the same shapes each iteration creates no device buffers
/// after the first (the pool serves them), and a reused buffer still reads as zeros.
#[test]
fn steady_state_loop_allocates_nothing_and_reused_buffers_are_zero() {
    let gpu = gpu();
    let step = |i: usize| {
        let x = gpu.upload(&vec![1.5f32 + i as f32; 3000]).unwrap();
        let out = gpu.alloc(DType::F32, 1).unwrap();
        // A long sum: per-chunk partials are scratch buffers inside the backend.
        gpu.reduce(
            ReduceOp::Sum,
            View::new(&x, &Layout::contiguous(&[3000])),
            &[0],
            View::new(&out, &Layout::contiguous(&[1])),
        )
        .unwrap();
        gpu.read::<f32>(&out).unwrap()[0]
    };
    assert_eq!(step(0), 4500.0);
    let created = gpu.buffers_created();
    for i in 1..4 {
        assert_eq!(step(i), (1.5 + i as f32) * 3000.0);
    }
    assert_eq!(
        gpu.buffers_created(),
        created,
        "the loop created device buffers"
    );
    let dirty = gpu.upload(&vec![7u32; 777]).unwrap();
    drop(dirty);
    let before = gpu.buffers_created();
    let fresh = gpu.alloc(DType::U32, 777).unwrap();
    assert_eq!(
        gpu.buffers_created(),
        before,
        "the freed buffer was not reused"
    );
    assert!(gpu.read::<u32>(&fresh).unwrap().iter().all(|&v| v == 0));
}

/// An in-place update (`x = x + y`: one buffer read and written) stages the read side in a
/// copy; the copies come from the pool too, so repeating it creates no device buffers.
#[test]
fn in_place_updates_allocate_nothing_after_the_first() {
    let gpu = gpu();
    let l = Layout::contiguous(&[1001]);
    let x = gpu.upload(&vec![0.5f32; 1001]).unwrap();
    let y = gpu.upload(&vec![0.25f32; 1001]).unwrap();
    let add = || {
        gpu.binary(
            hal::BinaryOp::Add,
            View::new(&x, &l),
            View::new(&y, &l),
            View::new(&x, &l),
        )
        .unwrap()
    };
    add();
    gpu.synchronize().unwrap();
    let created = gpu.buffers_created();
    for _ in 0..5 {
        add();
    }
    assert_eq!(gpu.read::<f32>(&x).unwrap(), vec![2.0f32; 1001]);
    assert_eq!(
        gpu.buffers_created(),
        created,
        "in-place adds created buffers"
    );
}

/// Index operands are checked on the device (no read-back per call): a bad index is reported
/// by the next synchronize, naming the operation, the index and the bound, and the operation
/// it guards writes nothing; operations after it still run.
#[test]
fn bad_indices_are_reported_at_synchronize_and_write_nothing() {
    hal_parity::device_checks::bad_indices_are_reported_at_synchronize(&gpu());
}

/// top_k's and ivf_scan's bad operands: errors at the call or the next synchronize.
#[test]
fn bad_selection_inputs_are_errors() {
    hal_parity::device_checks::bad_selection_inputs_are_errors(&gpu(), false);
}

/// Recordings are captured (see backend-wgpu's `capture`): host traffic inside is refused,
/// and a replay encodes the same dispatches on the same buffers, with a fresh zeroed buffer
/// where the recording allocated one and index checks reported as the calls would report them.
#[test]
fn host_traffic_inside_a_recording_is_refused_and_the_backend_recovers() {
    hal_parity::device_checks::host_traffic_inside_a_recording_is_refused(&gpu());
}

#[test]
fn captured_recordings_replay_faithfully() {
    hal_parity::device_checks::captured_recordings_replay_faithfully(&gpu());
    // Without immediates every dispatch reads its parameters from binding 0: a capture gives
    // each its own parameter buffer.
    let fallbacks = WgpuBackend::with_options(backend_wgpu::WgpuOptions::fallbacks())
        .expect("the wgpu backend");
    hal_parity::device_checks::captured_recordings_replay_faithfully(&fallbacks);
}

/// Every f16 bit pattern through the 16-bit load and store paths (native `array<f16>` where
/// the adapter has shader-f16, packed words otherwise), and f32 values at the f16 rounding
/// boundaries, subnormals and overflow: bit for bit as the CPU (NaN as NaN).
#[test]
fn f16_storage_is_exact_on_every_path() {
    let cpu = backend_cpu::CpuBackend::new();
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let mut edges: Vec<f32> = Vec::new();
    for h in (0..=u16::MAX).step_by(7) {
        let v = f32::from_bits(((h as u32) << 13) ^ 0x3000_0000);
        edges.extend([
            v,
            f32::from_bits(v.to_bits() + 1),
            f32::from_bits(v.to_bits() + 0x1000),
        ]);
    }
    edges.extend([
        65504.0, 65519.0, 65520.0, 1e9, -1e9, 5.96e-8, 2.98e-8, 2.99e-8, 0.0, -0.0,
    ]);
    let (halves, floats) = (bytemuck_bytes(&all), bytemuck_bytes(&edges));
    let reference = f16_round_trip(&cpu, halves, floats);
    for gpu in [
        gpu(),
        WgpuBackend::with_options(backend_wgpu::WgpuOptions::fallbacks()).unwrap(),
    ] {
        let got = f16_round_trip(&gpu, halves, floats);
        let same_f32 = |a: &[u8], b: &[u8]| {
            let (x, y) = (
                f32::from_le_bytes(a.try_into().unwrap()),
                f32::from_le_bytes(b.try_into().unwrap()),
            );
            x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
        };
        for (i, (a, b)) in got.0.chunks(4).zip(reference.0.chunks(4)).enumerate() {
            assert!(
                same_f32(a, b),
                "f16 {i:#06x} loads as {a:?}, CPU {b:?} ({})",
                gpu.features_in_use()
            );
        }
        let nan16 = |h: u16| (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
        for (i, (a, b)) in got.1.chunks(2).zip(reference.1.chunks(2)).enumerate() {
            let (x, y) = (
                u16::from_le_bytes(a.try_into().unwrap()),
                u16::from_le_bytes(b.try_into().unwrap()),
            );
            assert!(
                x == y || (nan16(x) && nan16(y)),
                "{} stores as f16 {x:#06x}, CPU {y:#06x} ({})",
                edges[i],
                gpu.features_in_use()
            );
        }
    }
}

/// f16 bits widened to f32 and f32 values narrowed to f16 by `copy`, as bytes.
fn f16_round_trip<B: Backend>(b: &B, halves: &[u8], floats: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let (n, m) = (halves.len() / 2, floats.len() / 4);
    let (h, f) = (
        b.upload_bytes(DType::F16, halves).unwrap(),
        b.upload_bytes(DType::F32, floats).unwrap(),
    );
    let (wide, narrow) = (
        b.alloc(DType::F32, n).unwrap(),
        b.alloc(DType::F16, m).unwrap(),
    );
    let (ln, lm) = (Layout::contiguous(&[n]), Layout::contiguous(&[m]));
    b.copy(View::new(&h, &ln), View::new(&wide, &ln)).unwrap();
    b.copy(View::new(&f, &lm), View::new(&narrow, &lm)).unwrap();
    (b.read_bytes(&wide).unwrap(), b.read_bytes(&narrow).unwrap())
}

fn bytemuck_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: u16 and f32 have no padding; the slice is read as plain bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

/// Matrix products with few outputs and a long k take the dot-product kernel (subgroup
/// shuffles where the adapter has them, a workgroup tree otherwise): matrix-vector, vector-
/// matrix, a batch, beta, a k long enough to be sliced, against the CPU.
#[test]
fn skinny_matmul_matches_the_cpu() {
    let cpu = backend_cpu::CpuBackend::new();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    // (batch, m, n, k): a column vector, a row vector, small outputs, k past 65536.
    let shapes = [
        (1, 37, 1, 1500),
        (1, 1, 29, 2049),
        (3, 5, 7, 1111),
        (1, 2, 3, 70_001),
    ];
    for gpu in [
        gpu(),
        WgpuBackend::with_options(backend_wgpu::WgpuOptions::fallbacks()).unwrap(),
    ] {
        for &(batch, m, n, k) in &shapes {
            let a: Vec<f32> = (0..batch * m * k).map(|_| next()).collect();
            // b stored as [batch, n, k] and viewed transposed, so its k stride is 1.
            let bt: Vec<f32> = (0..batch * n * k).map(|_| next()).collect();
            let o: Vec<f32> = (0..batch * m * n).map(|_| next()).collect();
            let la = Layout::contiguous(&[batch, m, k]);
            let lb = Layout::contiguous(&[batch, n, k])
                .permute(&[0, 2, 1])
                .unwrap();
            let lo = Layout::contiguous(&[batch, m, n]);
            let views = [&la, &lb, &lo];
            let want = product(&cpu, [&a, &bt, &o], views);
            let got = product(&gpu, [&a, &bt, &o], views);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                // |a|, |b| <= 0.5: the hal bound 2^-18 k (|a| @ |b|) is at most 2^-20 k * 1.5.
                let bound = 1.5 * k as f32 / 4.0 * 2f32.powi(-18) + 1e-6;
                assert!(
                    (g - w).abs() <= bound,
                    "({batch}, {m}, {n}, {k}) output {i}: {g} vs {w} ({})",
                    gpu.features_in_use()
                );
            }
        }
    }
}

/// `1.5 a @ b + 0.5 o` on `be`, read back.
fn product<B: Backend>(be: &B, data: [&[f32]; 3], views: [&Layout; 3]) -> Vec<f32> {
    let [a, b, o] = data.map(|d| be.upload(d).unwrap());
    let [la, lb, lo] = views;
    be.matmul(
        View::new(&a, la),
        View::new(&b, lb),
        View::new(&o, lo),
        1.5,
        0.5,
    )
    .unwrap();
    be.read::<f32>(&o).unwrap()
}

/// 16-bit outputs of elementwise kernels: whole words of two elements where the output starts
/// on a word and has an even length, the per-element path otherwise (odd offset, odd length);
/// f16 and bf16, with and without the optional features, against the CPU bit for bit, and
/// the elements around the written range untouched.
#[test]
fn sixteen_bit_elementwise_outputs_match_the_cpu() {
    let cpu = backend_cpu::CpuBackend::new();
    let src: Vec<f32> = (0..1031)
        .map(|i| ((i * 7919 % 2001) as f32 - 1000.0) / 7.0)
        .collect();
    for gpu in [
        gpu(),
        WgpuBackend::with_options(backend_wgpu::WgpuOptions::fallbacks()).unwrap(),
    ] {
        for dt in [DType::F16, DType::BF16] {
            for (offset, len) in [(0usize, 1024usize), (2, 1000), (1, 1024), (0, 1023), (3, 1)] {
                let l = Layout {
                    offset,
                    ..Layout::contiguous(&[len])
                };
                let want = elementwise_16(&cpu, dt, &src, &l);
                let got = elementwise_16(&gpu, dt, &src, &l);
                let first_difference = got.iter().zip(&want).position(|(g, w)| g != w);
                assert_eq!(
                    first_difference,
                    None,
                    "{dt} offset {offset} length {len} ({}): bytes differ from the CPU's (byte {:?} of 4 x {} buffers)",
                    gpu.features_in_use(),
                    first_difference,
                    2 * src.len()
                );
            }
        }
    }
}

/// fill, copy (f32 to 16-bit), in-place negation and a product into a 16-bit buffer of 1031 elements
/// (prefilled with a marker) through view `l`; the buffer's bytes after each.
fn elementwise_16<B: Backend>(b: &B, dt: DType, src: &[f32], l: &Layout) -> Vec<u8> {
    let n = src.len();
    let x = b.upload(src).unwrap();
    let xl = Layout {
        offset: 5,
        ..l.clone()
    };
    let out = b.alloc(dt, n).unwrap();
    let all = Layout::contiguous(&[n]);
    let mut bytes = Vec::new();
    b.fill(View::new(&out, &all), -3.0).unwrap();
    b.fill(View::new(&out, l), 0.1).unwrap();
    bytes.extend(b.read_bytes(&out).unwrap());
    b.copy(View::new(&x, &xl), View::new(&out, l)).unwrap();
    bytes.extend(b.read_bytes(&out).unwrap());
    // Exactly rounded ops only (exp and the like may differ by an ulp between backends).
    b.unary(hal::UnaryOp::Neg, View::new(&out, l), View::new(&out, l))
        .unwrap();
    bytes.extend(b.read_bytes(&out).unwrap());
    b.binary(
        hal::BinaryOp::Mul,
        View::new(&x, &xl),
        View::new(&out, l),
        View::new(&out, l),
    )
    .unwrap();
    bytes.extend(b.read_bytes(&out).unwrap());
    bytes
}

/// The fused nearest-centroid search (`Precision::Exact`, nearest_centroid.wgsl) gives the
/// reference's answers, bit for bit, also where centroids come in nearly equal pairs and
/// points sit halfway between them: rows whose runner-up score lies within the rounding bound
/// of the best are decided by exact distances. Fresh random data every run.
#[test]
fn wgpu_nearest_answers_like_the_reference_on_near_ties() {
    let (n, d, pairs) = (3001usize, 72usize, 45usize);
    let seed = hal_parity::fresh_seed("NEAR_TIES_SEED");
    eprintln!("data seed {seed} (NEAR_TIES_SEED={seed} repeats it)");
    let mut counter = 0u64;
    let mut uniform = || {
        counter += 1;
        let range = hal::Distribution::Uniform {
            low: -0.5,
            high: 0.5,
        };
        hal::random::random_value(range, seed, counter)
    };
    let m = 2 * pairs;
    let mut centroids = Vec::with_capacity(m * d);
    for _ in 0..pairs {
        let base: Vec<f32> = (0..d).map(|_| 10.0 * uniform()).collect();
        let twin: Vec<f32> = base.iter().map(|&v| v + 1e-4 * uniform()).collect();
        centroids.extend_from_slice(&base);
        centroids.extend_from_slice(&twin);
    }
    let mut points = Vec::with_capacity(n * d);
    for i in 0..n {
        let p = i % pairs;
        for k in 0..d {
            let (a, b) = (centroids[2 * p * d + k], centroids[(2 * p + 1) * d + k]);
            points.push(if i % 4 == 3 {
                10.0 * uniform()
            } else {
                0.5 * (a + b) + 1e-6 * uniform()
            });
        }
    }
    fn search<B: Backend>(
        b: &B,
        points: &[f32],
        centroids: &[f32],
        n: usize,
        m: usize,
        d: usize,
    ) -> (Vec<u32>, Vec<u32>) {
        let (x, c) = (b.upload(points).unwrap(), b.upload(centroids).unwrap());
        let (index, distance) = (
            b.alloc(DType::U32, n).unwrap(),
            b.alloc(DType::F32, n).unwrap(),
        );
        b.nearest_centroid(
            View::new(&x, &Layout::contiguous(&[n, d])),
            View::new(&c, &Layout::contiguous(&[m, d])),
            View::new(&index, &Layout::contiguous(&[n])),
            View::new(&distance, &Layout::contiguous(&[n])),
        )
        .unwrap();
        let bits = b
            .read::<f32>(&distance)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        (b.read::<u32>(&index).unwrap(), bits)
    }
    let reference = backend_cpu::CpuBackend::new().with_precision(hal::Precision::Reproducible);
    let (want_index, want_bits) = search(&reference, &points, &centroids, n, m, d);
    let (got_index, got_bits) = search(&gpu(), &points, &centroids, n, m, d);
    let differ = got_index
        .iter()
        .zip(&want_index)
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(
        differ, 0,
        "{differ} of {n} assignments differ from the reference"
    );
    assert!(got_bits == want_bits, "distances differ from the reference");
}

/// lavapipe stops a shader's loops after 65535 iterations in all and carries on with wrong
/// values: attention past the lengths its kernels fit is refused there (an error naming the
/// cap), never computed wrong; within them, and on a GPU at any length, it runs.
#[test]
fn attention_past_a_cpu_adapters_loop_cap_is_refused() {
    use hal::{AttentionInputs, AttentionParams};
    let gpu = gpu();
    let run = |t: usize| -> hal::Result<()> {
        let d = 64;
        let values: Vec<f32> = (0..t * d).map(|i| (i % 17) as f32 / 17.0 - 0.5).collect();
        let l = Layout::contiguous(&[1, 1, t, d]);
        let ll = Layout::contiguous(&[1, 1, t]);
        let q = gpu.upload(&values)?;
        let out = gpu.alloc(DType::F32, t * d)?;
        let lse = gpu.alloc(DType::F32, t)?;
        let x = AttentionInputs {
            q: View::new(&q, &l),
            k: View::new(&q, &l),
            v: View::new(&q, &l),
            mask: None,
        };
        gpu.attention(
            x,
            View::new(&out, &l),
            View::new(&lse, &ll),
            &AttentionParams::new(d),
        )?;
        gpu.synchronize()
    };
    run(320).expect("within the cap");
    match (gpu.info().kind, run(1024)) {
        (hal::DeviceKind::Software, Err(hal::Error::Unsupported { detail, .. })) => {
            assert!(detail.contains("loop"), "{detail}")
        }
        (hal::DeviceKind::Software, other) => panic!("a CPU adapter ran tk = 1024: {other:?}"),
        (_, r) => r.expect("a GPU runs any length"),
    }
}
