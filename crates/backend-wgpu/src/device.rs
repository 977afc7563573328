//! Opening the adapter and device: the features in use, the limits, the probes.

use crate::buffer::{BufferInner, Pool, WgpuBuffer};
use crate::fault::VERDICT_WORDS;
use crate::ops::matmul::route::fused_epilogues;
use crate::pipeline::{Kernel, PARAMS_BYTES, Spec};
use crate::queue::Batch;
use crate::{NAME, WgpuBackend, capture, coop, lock, profile, program, wgsl};
use hal::{Backend, Capabilities, DType, DeviceInfo, DeviceKind, Error, Precision, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Which of the adapter's optional features the backend uses. Each has a fallback that runs
/// everywhere; turning one off (tests do, to run the fallbacks on an adapter that has them)
/// changes speed, never results beyond the tolerances `hal` states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgpuOptions {
    /// Launch parameters as immediates (Vulkan push constants) instead of a buffer written
    /// before every dispatch.
    pub immediates: bool,
    /// f16 buffers as `array<f16>` (`shader-f16`): plain 16-bit loads and stores instead of
    /// packed words and atomic read-modify-writes. Arithmetic stays f32 either way.
    pub native_f16: bool,
    /// Subgroup reductions (`subgroupAdd`, ...) instead of workgroup-memory trees.
    pub subgroups: bool,
    /// Cooperative matrices (tensor cores) for f16 and bf16 products and for products under
    /// [`Precision::Fast`] and [`Precision::Compensated`], where the adapter offers 16 x 16 x 16
    /// tiles of f16 with f32 accumulation and 32-lane subgroups (wgpu's experimental
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX`); needs `subgroups` too (the fast nearest-centroid
    /// search re-checks its candidates with subgroup sums).
    pub cooperative_matrix: bool,
    /// `f64` values in shaders (`shader-f64` with `shader-int64`, which NVIDIA's Vulkan
    /// driver and lavapipe offer): `f64` buffers and programs. Without them both are refused.
    pub f64: bool,
}

impl Default for WgpuOptions {
    fn default() -> Self {
        WgpuOptions {
            immediates: true,
            native_f16: true,
            subgroups: true,
            cooperative_matrix: true,
            f64: true,
        }
    }
}

impl WgpuOptions {
    /// Every optional feature off: the paths an adapter without them takes.
    pub fn fallbacks() -> Self {
        WgpuOptions {
            immediates: false,
            native_f16: false,
            subgroups: false,
            cooperative_matrix: false,
            f64: false,
        }
    }
}

pub(crate) struct Inner {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: wgpu::AdapterInfo,
    pub(crate) limits: wgpu::Limits,
    pub(crate) features: wgpu::Features,
    /// Words of launch parameters passed as immediates (0: the device has none, or they are
    /// turned off).
    pub(crate) immediate_words: u32,
    pub(crate) pipelines: Mutex<HashMap<(Spec, u32), Arc<Kernel>>>,
    /// Launch parameters of a dispatch on a device without immediates. One buffer serves every
    /// such dispatch: each writes it and is submitted alone right after (see [`Batch`]), and
    /// queue writes land in submission order, so no dispatch sees another's parameters.
    pub(crate) params: wgpu::Buffer,
    /// Commands encoded but not yet submitted.
    pub(crate) batch: Mutex<Batch>,
    pub(crate) kernels: hal::ir::KernelCache<program::WgpuKernel>,
    /// Errors wgpu reported outside an error scope, returned by the next synchronize.
    pub(crate) deferred: Arc<Mutex<Option<String>>>,
    /// Fault flags of IR launches not yet checked (read at the next synchronize).
    /// The fault record every IR launch writes its first out-of-range access into:
    /// `[buffer + 1, index, bound]`, all 0 while there is none (see `program.rs`).
    pub(crate) faults: WgpuBuffer,
    /// An IR launch or index check happened since the fault record was last read.
    pub(crate) faults_unread: std::sync::atomic::AtomicBool,
    /// One word per recent index check ([`VERDICT_WORDS`], used round robin): set to the
    /// check's serial when it finds a bad index, read by the kernel it guards.
    pub(crate) verdicts: WgpuBuffer,
    /// Serial of the next index check (never 0, the verdict words' initial value).
    pub(crate) check_serial: std::sync::atomic::AtomicU32,
    pub(crate) pool: Arc<Mutex<Pool>>,
    pub(crate) buffers_created: std::sync::atomic::AtomicU64,
    /// Whether WGSL's `fma` is fused on this device (probed on first need; lavapipe's is not).
    pub(crate) fma_fused: std::sync::OnceLock<bool>,
    /// `alloc_for_write` fills its buffers with all-ones bits (NaN) (see `poison_for_write`).
    pub(crate) poison_for_write: std::sync::atomic::AtomicBool,
    /// With cooperative matrices: the tiling of single-pass products (settable for tuning).
    pub(crate) coop: Option<Mutex<coop::CoopTiles>>,
    /// Per-dispatch timestamps, under `HAL_WGPU_PROFILE` (see [`profile`]).
    pub(crate) profiler: Option<Mutex<profile::Profiler>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(p) = &self.profiler {
            let mut p = lock(p);
            if !p.is_empty() {
                eprint!("{}", p.take_report(1));
            }
        }
    }
}

pub(crate) fn info(gpu: &WgpuBackend) -> DeviceInfo {
    let kind = match gpu.0.info.device_type {
        wgpu::DeviceType::DiscreteGpu => DeviceKind::DiscreteGpu,
        wgpu::DeviceType::IntegratedGpu => DeviceKind::IntegratedGpu,
        wgpu::DeviceType::Cpu => DeviceKind::Software,
        _ => DeviceKind::Other,
    };
    let i = &gpu.0.info;
    // A browser's WebGPU may name neither the adapter nor its driver (privacy).
    let name = match (i.name.is_empty(), i.driver.is_empty()) {
        (false, false) => format!("{} ({:?}, {})", i.name, i.backend, i.driver),
        (false, true) => format!("{} ({:?})", i.name, i.backend),
        (true, _) => format!("unnamed {:?} adapter ({:?})", i.device_type, i.backend),
    };
    DeviceInfo {
        backend: NAME,
        name,
        kind,
        // wgpu does not report device memory; the largest buffer is what it guarantees.
        memory_total: gpu.0.limits.max_buffer_size,
        memory_available: gpu.0.limits.max_buffer_size,
    }
}

pub(crate) fn capabilities(gpu: &WgpuBackend) -> Capabilities {
    Capabilities {
        dtypes: DType::ALL.to_vec(),
        max_buffer_bytes: gpu.max_binding_bytes(),
        parallelism: 1,
        native_float_atomics: false,
        subgroups: gpu.0.features.contains(wgpu::Features::SUBGROUP),
        matrix_units: gpu.0.coop.is_some(),
        graph_capture: capture::enabled(),
        program_buffers: gpu.program_buffers(),
        fast_precision: gpu.0.coop.is_some(),
        compensated_precision: gpu.0.coop.is_some(),
        fused_gradient_products: fused_epilogues(),
        f64: f64_support(gpu.has_f64()),
    }
}

/// The primitives that run in `f64` on this backend (where the adapter offers `shader-f64`).
pub(crate) const F64_PRIMITIVES: &[&str] = &["reduce", "launch"];

fn f64_support(shader_f64: bool) -> hal::F64Support {
    if !shader_f64 {
        return hal::F64Support {
            note: "the adapter does not offer shader-f64 and shader-int64".into(),
            ..Default::default()
        };
    }
    hal::F64Support {
        storage: true,
        programs: true,
        // math_wide.wgsl builds them from f64 arithmetic (GLSL.std.450 has none in f64).
        program_math: true,
        atomics: false,
        primitives: F64_PRIMITIVES.to_vec(),
        note: "WGSL has no 64-bit atomics; the other primitives have no f64 kernels yet (nor \
               reduce's LogSumExp, built from them)"
            .into(),
    }
}

impl WgpuBackend {
    /// Whether this device runs f64 kernels: the adapter offers `shader-f64` and
    /// `shader-int64`, and both were requested ([`WgpuOptions`]`::f64`). The second because
    /// the error-free steps of math_wide.wgsl need an optimisation barrier that NVIDIA's
    /// Vulkan compiler cannot see through (it unswitched a select on a uniform condition and
    /// then reassociated `(x - k c1) - k c2` into `x - k (c1 + c2)`).
    pub(crate) fn has_f64(&self) -> bool {
        self.0
            .features
            .contains(wgpu::Features::SHADER_F64 | wgpu::Features::SHADER_INT64)
    }

    /// Refuses `op` on `f64` operands where this device does not run it in `f64`.
    pub(crate) fn f64_offered(&self, op: &'static str, dtypes: &[DType]) -> Result<()> {
        let f64 = self.has_f64();
        hal::validate::f64_offered(op, dtypes, f64 && F64_PRIMITIVES.contains(&op), || {
            if f64 {
                format!("the wgpu backend has no f64 form of `{op}`")
            } else {
                "the adapter does not offer shader-f64 and shader-int64".into()
            }
        })
    }
}

/// Whether the adapter offers what the cooperative-matrix kernels need: 16 x 16 x 16 tiles
/// of f16 with f32 accumulation, `shader-f16` (also inside f32 code), and subgroups of
/// exactly 32 lanes (the fast nearest-centroid search's re-check sums over subgroups).
fn offers_coop(adapter: &wgpu::Adapter) -> bool {
    let info = adapter.get_info();
    adapter.features().contains(
        wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
            | wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP,
    ) && adapter
        .get_downlevel_capabilities()
        .flags
        .contains(wgpu::DownlevelFlags::SHADER_F16_IN_F32)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
                && p.ab_type == wgpu::CooperativeScalarType::F16
                && p.cr_type == wgpu::CooperativeScalarType::F32
        })
}

/// Keeps Mesa's Vulkan device-select layer quiet on a machine without a display session.
///
/// The layer (`VK_LAYER_MESA_device_select`, loaded implicitly with Mesa's drivers, lavapipe
/// among them) asks the Wayland compositor which GPU drives the display while devices are
/// enumerated; with no `XDG_RUNTIME_DIR` libwayland prints `error: XDG_RUNTIME_DIR is invalid
/// or not set in the environment.` twice, though nothing is wrong. Where neither
/// `XDG_RUNTIME_DIR` nor `WAYLAND_DISPLAY` is set there is no compositor to ask, so this sets
/// `NODEVICE_SELECT=1`, the layer's own off switch (the adapter is still chosen by
/// `PowerPreference::HighPerformance`). Elsewhere it does nothing.
///
/// # Safety
/// It changes the process environment, so it must run before any other thread exists (the
/// first line of `main`): another thread reading the environment from C code meanwhile (the
/// Vulkan loader does) would race with it.
pub unsafe fn quiet_headless_start() {
    let unset = |v: &str| std::env::var_os(v).is_none_or(|x| x.is_empty());
    if cfg!(target_os = "linux") && unset("XDG_RUNTIME_DIR") && unset("WAYLAND_DISPLAY") {
        // SAFETY: the caller guarantees no other thread runs yet.
        unsafe { std::env::set_var("NODEVICE_SELECT", "1") };
    }
}

impl WgpuBackend {
    /// Opens the highest-performance adapter. No adapter (no Vulkan driver, say) is
    /// [`Error::Unavailable`] with the reason.
    pub fn new() -> Result<Self> {
        Self::with_options(WgpuOptions::default())
    }

    /// [`Self::new`] using only the optional features `options` allows (where the adapter
    /// has them). In a browser, where nothing may block, use [`Self::open`].
    pub fn with_options(options: WgpuOptions) -> Result<Self> {
        if cfg!(target_arch = "wasm32") {
            return Err(Error::Unavailable {
                backend: NAME,
                reason: "in a browser the adapter arrives asynchronously: open the backend \
                         with `WgpuBackend::open(options).await`"
                    .into(),
            });
        }
        pollster::block_on(Self::open(options))
    }

    /// [`Self::with_options`] as a future: the way to open the backend on WebGPU in a browser
    /// (wasm32), where the adapter and device arrive through the page's event loop. Natively
    /// the future is ready at its first poll.
    pub async fn open(options: WgpuOptions) -> Result<Self> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::from_env().unwrap_or(wgpu::Backends::PRIMARY),
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
            .map_err(|e| Error::Unavailable {
            backend: NAME,
            reason: format!(
                "no GPU adapter: {e} (on Linux: install a Vulkan driver, e.g. mesa-vulkan-drivers)"
            ),
        })?;
        let limits = adapter.limits();
        let mut wanted = wgpu::Features::empty();
        wanted.set(wgpu::Features::SUBGROUP, options.subgroups);
        wanted.set(wgpu::Features::SHADER_F16, options.native_f16);
        wanted.set(wgpu::Features::IMMEDIATES, options.immediates);
        wanted.set(wgpu::Features::TIMESTAMP_QUERY, profile::requested());
        // f64 kernels need 64-bit integers too: math_wide.wgsl's optimisation barrier is an
        // XOR on an f64's bits (see `WgpuBackend::has_f64`).
        wanted.set(
            wgpu::Features::SHADER_F64 | wgpu::Features::SHADER_INT64,
            options.f64,
        );
        let info = adapter.get_info();
        let coop = options.cooperative_matrix && options.subgroups && offers_coop(&adapter);
        if coop {
            wanted |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
        }
        let features = adapter.features() & wanted;
        // Whole vec4s of words, at most 64 (256 bytes, what Vulkan drivers commonly offer);
        // fewer than 32 words would not hold most launches.
        let immediate_words = if features.contains(wgpu::Features::IMMEDIATES) {
            let w = (limits.max_immediate_size / 16 * 4).min(64);
            if w >= 32 { w } else { 0 }
        } else {
            0
        };
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("hal"),
                required_features: features,
                required_limits: limits.clone(),
                experimental_features: if coop {
                    // SAFETY: wgpu marks cooperative matrices experimental (its validation of
                    // them may be incomplete); the backend's only cooperative-matrix kernels are
                    // its own (gemm_coop.wgsl), whose loads and stores stay inside their buffers.
                    unsafe { wgpu::ExperimentalFeatures::enabled() }
                } else {
                    wgpu::ExperimentalFeatures::disabled()
                },
                ..Default::default()
            })
            .await
            .map_err(|e| Error::Unavailable {
                backend: NAME,
                reason: format!("the adapter refused a device: {e}"),
            })?;
        let deferred: Arc<Mutex<Option<String>>> = Arc::default();
        let sink = deferred.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut d = lock(&sink);
            d.get_or_insert_with(|| e.to_string());
        }));
        let params = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("launch parameters"),
            size: PARAMS_BYTES,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let pool: Arc<Mutex<Pool>> = Arc::default();
        let fixed = |label, words: usize, usage| {
            let buffer = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: words as u64 * 4,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | usage,
                mapped_at_creation: false,
            });
            WgpuBuffer(Arc::new(BufferInner {
                buffer,
                dtype: DType::U32,
                len: words,
                pool: pool.clone(),
            }))
        };
        let faults = fixed("fault record", 4, wgpu::BufferUsages::COPY_SRC);
        let verdicts = fixed(
            "index check verdicts",
            VERDICT_WORDS as usize,
            wgpu::BufferUsages::empty(),
        );
        let profiler = features
            .contains(wgpu::Features::TIMESTAMP_QUERY)
            .then(|| Mutex::new(profile::Profiler::new(&device, &queue)));
        if profile::requested() && profiler.is_none() {
            eprintln!("HAL_WGPU_PROFILE: this adapter has no timestamp queries; not profiling");
        }
        Ok(Self(
            Arc::new(Inner {
                profiler,
                params,
                verdicts,
                check_serial: std::sync::atomic::AtomicU32::new(1),
                batch: Mutex::default(),
                device,
                queue,
                info,
                coop: coop.then(|| Mutex::new(coop::CoopTiles::SINGLE)),
                limits,
                features,
                immediate_words,
                pipelines: Mutex::default(),
                kernels: Default::default(),
                deferred,
                faults,
                faults_unread: Default::default(),
                pool,
                buffers_created: Default::default(),
                fma_fused: Default::default(),
                poison_for_write: Default::default(),
            }),
            Precision::Exact,
        ))
    }

    /// Whether this device's WGSL `fma` rounds once, probed with `(1 + 2^-12)^2 - 1`, whose
    /// unfused result loses the 2^-24 term. The reproducible kernels use `fma` where it is
    /// fused and an exact emulation (fma_exact.wgsl) where it is not.
    pub(crate) fn fma_is_fused(&self) -> Result<bool> {
        if let Some(&fused) = self.0.fma_fused.get() {
            return Ok(fused);
        }
        if cfg!(target_arch = "wasm32") {
            // The probe's read would block; the exact emulation is right either way.
            return Ok(*self.0.fma_fused.get_or_init(|| false));
        }
        use hal::BackendExt;
        use hal::ir::{Access as IrAccess, ProgramBuilder};
        let mut p = ProgramBuilder::new("fma_probe");
        let a = p.buffer(DType::F32, IrAccess::Read);
        let y = p.buffer(DType::F32, IrAccess::Write);
        let i = p.index();
        let av = p.load(a, i);
        let minus_one = p.const_f32(-1.0);
        let r = p.fma(av, av, minus_one);
        p.store(y, i, r);
        let kernel = self.compile(&p.build()?)?;
        let x = 1.0f32 + 2f32.powi(-12);
        let (xb, yb) = (self.upload(&[x])?, self.alloc(DType::F32, 1)?);
        self.launch(&kernel, &[&xb, &yb], 1)?;
        let fused = self.read::<f32>(&yb)?[0] == x.mul_add(x, -1.0);
        Ok(*self.0.fma_fused.get_or_init(|| fused))
    }

    /// Under `HAL_WGPU_PROFILE` (see the `profile` module): waits for the device, returns the GPU time
    /// per kernel since the last call divided by `runs`, and starts the totals afresh.
    /// `None` when not profiling.
    pub fn take_profile(&self, runs: usize) -> Result<Option<String>> {
        let Some(profiler) = &self.0.profiler else {
            return Ok(None);
        };
        self.synchronize()?;
        let mut p = lock(profiler);
        let report = p.take_report(runs);
        Ok(Some(report))
    }

    /// What modules are composed for on this device.
    pub(crate) fn module_features(&self) -> wgsl::Features {
        wgsl::Features {
            immediate_words: self.0.immediate_words,
            native_f16: self.0.features.contains(wgpu::Features::SHADER_F16),
            subgroups: self.0.features.contains(wgpu::Features::SUBGROUP),
            cooperative_matrix: self.0.coop.is_some(),
            fused_fma: self.0.fma_fused.get().copied(),
            f64: self.has_f64(),
        }
    }

    /// The optional adapter features this device uses (see [`WgpuOptions`]), for reports.
    /// Sets the tiling of single-pass cooperative-matrix products (for tuning runs);
    /// `false` where the device has no cooperative matrices.
    pub fn set_coop_tiles(&self, tiles: coop::CoopTiles) -> bool {
        match &self.0.coop {
            Some(t) => {
                *lock(t) = tiles;
                true
            }
            None => false,
        }
    }

    pub fn features_in_use(&self) -> String {
        let mut used = Vec::new();
        if self.0.immediate_words > 0 {
            used.push(format!("immediates ({} words)", self.0.immediate_words));
        }
        if self.0.features.contains(wgpu::Features::SHADER_F16) {
            used.push("shader-f16".to_string());
        }
        if self.0.features.contains(wgpu::Features::SUBGROUP) {
            used.push("subgroups".to_string());
        }
        if self.has_f64() {
            used.push("shader-f64 and shader-int64".to_string());
        }
        if self.0.coop.is_some() {
            used.push("cooperative matrices (16x16x16 f16, f32 accumulation)".to_string());
        }
        if used.is_empty() {
            "none (fallbacks only)".into()
        } else {
            used.join(", ")
        }
    }

    /// The largest buffer a kernel can bind, in bytes.
    pub fn max_binding_bytes(&self) -> u64 {
        self.0
            .limits
            .max_storage_buffer_binding_size
            .min(self.0.limits.max_buffer_size)
    }

    /// Reads the profile's timestamps back when another dispatch's would not fit (never
    /// inside a recording, which times nothing: its replays are timed).
    pub(crate) fn make_room_in_profile(&self) -> Result<()> {
        if !self.capturing() && self.0.profiler.as_ref().is_some_and(|p| lock(p).full()) {
            self.read_profile()?;
        }
        Ok(())
    }

    /// Reads the timestamps of the dispatches timed since the last call into the profile's
    /// totals (see [`profile`]); nothing without `HAL_WGPU_PROFILE`.
    pub(crate) fn read_profile(&self) -> Result<()> {
        let Some(profiler) = &self.0.profiler else {
            return Ok(());
        };
        let mut profiler = lock(profiler);
        let timed = profiler.pending_dispatches();
        if timed == 0 {
            return Ok(());
        }
        let bytes = self.read_back(timed as u64 * 16, |e, staging| profiler.resolve(e, staging))?;
        profiler.add(timed, &bytemuck::pod_collect_to_vec::<u8, u64>(&bytes));
        Ok(())
    }
}
