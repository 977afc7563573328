//! The index reader under structured fuzzing, with the checksum re-sealed: valid indices
//! are mutated where it hurts (header counts set to limits, section offsets and lengths,
//! bytes flipped, files cut or grown), the CRC-32 recomputed for most of them (a checksum
//! guards against damage, not an adversary), and each result parsed, then, if it parses,
//! decompressed and searched. Every case must end without a panic, within a second, and
//! allocate at most a small multiple of the file's size while parsing (counted by the global
//! allocator below).
//!
//! CI runs it for a few seconds; `VLC_FUZZ_SECONDS=600 cargo test --release -p vlc-anneal
//! --test fuzz_index -- --nocapture` is the ten-minute run, and prints the count of cases.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};
use vlc_anneal::{Config, Index, Matrix, compress};

/// The system allocator, counting the bytes live now and the most live since a reset.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged to the system allocator.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The most bytes allocated at once during `f`, beyond what was live before it.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let out = f();
    (out, PEAK.load(Relaxed).saturating_sub(base))
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Valid indices of several shapes: the mutations' starting points.
fn seeds() -> Vec<Vec<u8>> {
    let cpu = backend_cpu::CpuBackend::new();
    let mut out = Vec::new();
    for (n, d, m, bytes) in [
        (50, 4, 1, 0),
        (120, 6, 5, 3),
        (300, 8, 17, 8),
        (64, 3, 64, 1),
    ] {
        let data = vlc_anneal::synthetic::gaussian_mixture(n, d, 4, 0.2, n as u64);
        let mut cfg = Config::new(m);
        cfg.pq_bytes = bytes;
        cfg.iterations = 2;
        let index = compress(&cpu, &data, &cfg, &mut |_| {}).unwrap().index;
        let dir = std::env::temp_dir().join(format!("vlc-fuzz-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("i.vlc");
        index.save(&path).unwrap();
        out.push(std::fs::read(&path).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
    out
}

/// Values that break careless size arithmetic.
const INTERESTING: [u64; 14] = [
    0,
    1,
    2,
    7,
    255,
    256,
    65535,
    1 << 31,
    (1 << 32) - 1,
    1 << 32,
    (1 << 32) + 3,
    1 << 62,
    i64::MAX as u64,
    u64::MAX,
];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = b.len();
        match rng.below(7) {
            // A header count (n at 16 as u64; d, m, pq_bytes, codewords, bits at 24..48).
            0 => {
                let v = INTERESTING[rng.below(INTERESTING.len())];
                if rng.below(2) == 0 {
                    b[16..24].copy_from_slice(&v.to_le_bytes());
                } else {
                    let at = 24 + 4 * rng.below(6);
                    b[at..at + 4].copy_from_slice(&(v as u32).to_le_bytes());
                }
            }
            // A section table field: kind, offset or length.
            1 => {
                let sections = u32::from_le_bytes(b[12..16].try_into().unwrap()) as usize;
                let entry = 80 + 24 * rng.below(sections.clamp(1, 5));
                let field = [0, 8, 16][rng.below(3)];
                let v = match rng.below(3) {
                    0 => INTERESTING[rng.below(INTERESTING.len())],
                    1 => rng.below(len) as u64,
                    _ => rng.next(),
                };
                if entry + field + 8 <= len {
                    b[entry + field..entry + field + 8].copy_from_slice(&v.to_le_bytes());
                }
            }
            // The section count.
            2 => {
                let v = INTERESTING[rng.below(INTERESTING.len())] as u32;
                b[12..16].copy_from_slice(&v.to_le_bytes());
            }
            3 => {
                let at = rng.below(len);
                b[at] ^= 1 << rng.below(8);
            }
            4 => {
                let at = rng.below(len);
                b[at] = rng.next() as u8;
            }
            // Cut, keeping the end marker's room, or grow.
            5 if len > 96 => {
                let keep = 88 + rng.below(len - 88);
                let tail = b[len - 8..].to_vec();
                b.truncate(keep);
                b.extend_from_slice(&tail);
            }
            _ => {
                let extra = rng.below(64);
                let at = len - 8;
                b.splice(at..at, std::iter::repeat_n(0u8, extra));
            }
        }
    }
    // Re-sealed most of the time, so the parser proper is reached.
    if rng.below(10) < 9 && b.len() >= 8 {
        let end = b.len();
        let crc = crc32fast::hash(&b[..end - 8]);
        b[end - 8..end - 4].copy_from_slice(&crc.to_le_bytes());
    }
    b
}

/// The most a parse may allocate: the file (held in memory), the decoded anchors and
/// codebooks and the subspace bounds (each at most twice their section), and a constant.
fn parse_budget(file: usize) -> usize {
    8 * file + (64 << 10)
}

struct Stats {
    cases: usize,
    parsed: usize,
    worst: Duration,
    worst_ratio: f64,
}

/// Milliseconds since the test started at which the current case began (0: none running).
static CASE_STARTED_MS: AtomicUsize = AtomicUsize::new(0);

/// Aborts the process, naming the seed, when one case runs past 10 s: a hang is a failure
/// with a message, not a CI run that never ends.
fn watchdog(seed: u64, origin: Instant) {
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(500));
            let started = CASE_STARTED_MS.load(Relaxed);
            let now = origin.elapsed().as_millis() as usize;
            if started > 0 && now.saturating_sub(started) > 10_000 {
                eprintln!("fuzz_index: a case of seed {seed} ran past 10 s (a hang)");
                std::process::abort();
            }
        }
    });
}

fn run(seconds: f64, seed: u64) -> Stats {
    let origin = Instant::now();
    watchdog(seed, origin);
    let seeds = seeds();
    let mut rng = Rng(seed | 1);
    let mut stats = Stats {
        cases: 0,
        parsed: 0,
        worst: Duration::ZERO,
        worst_ratio: 0.0,
    };
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < deadline {
        let pick = rng.below(seeds.len());
        let bytes = mutate(&mut rng, &seeds[pick]);
        let len = bytes.len();
        let started = Instant::now();
        CASE_STARTED_MS.store(origin.elapsed().as_millis() as usize + 1, Relaxed);
        let (parsed, peak) = peak_during(|| Index::from_bytes(bytes.clone(), "fuzz"));
        assert!(
            peak <= parse_budget(len),
            "seed {seed}, case {}: parsing {len} bytes allocated {peak} bytes",
            stats.cases
        );
        stats.worst_ratio = stats.worst_ratio.max(peak as f64 / len as f64);
        if let Ok(index) = parsed {
            stats.parsed += 1;
            let h = &index.header;
            if h.n.saturating_mul(h.d) <= 1 << 20 {
                let _ = index.decompress();
            }
            let q = Matrix::new(2, h.d.min(1 << 16), vec![0.5; 2 * h.d.min(1 << 16)]).unwrap();
            for (k, nprobe) in [(3, 2), (usize::MAX, usize::MAX), (1, 0)] {
                let _ = index.search(&q, k, nprobe);
            }
        }
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "seed {seed}, case {}: {took:?} for {len} bytes",
            stats.cases
        );
        stats.worst = stats.worst.max(took);
        stats.cases += 1;
        CASE_STARTED_MS.store(0, Relaxed);
    }
    stats
}

#[test]
fn mutated_indices_with_valid_checksums_parse_fast_and_small() {
    let seconds: f64 = std::env::var("VLC_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let seed = hal_parity::fresh_seed("VLC_FUZZ_SEED");
    let s = run(seconds, seed);
    println!(
        "{} cases in {seconds} s ({} parsed as valid), slowest {:?}, most allocated while parsing {:.2}x the file",
        s.cases, s.parsed, s.worst, s.worst_ratio
    );
    assert!(s.cases > 100, "only {} cases ran", s.cases);
}
