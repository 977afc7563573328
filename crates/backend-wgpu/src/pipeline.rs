//! Kernels: launch parameters, the pipeline cache, bind groups and dispatches.

use crate::buffer::WgpuBuffer;
use crate::queue::Batch;
use crate::wgsl::{Access, Entry};
use crate::{V, WgpuBackend, backend_error, capture, lock, profile, wgsl};
use hal::{DType, DeviceBuffer, Error, Layout, Result};
use std::sync::Arc;

/// A kernel family's scalar launch parameters by name: field `i` is scalar slot `i` of
/// [`Params`]. Declared with [`launch_params!`], which also records each field's WGSL type; the
/// family's shader file holds a struct of the same name and fields and a constructor that
/// reads field `i` from slot `i`, and `cargo xtask wgsl` checks the three agree.
pub(crate) trait LaunchParams: bytemuck::Pod {
    /// The layout the shader's struct must have.
    const LAYOUT: ParamsLayout;
}

/// The name and fields (name, WGSL type) of a typed launch-parameter struct (see
/// `launch_params!` in `pipeline.rs`).
#[derive(Clone, Copy, Debug)]
pub struct ParamsLayout {
    pub name: &'static str,
    pub fields: &'static [(&'static str, &'static str)],
}

/// Declares a [`LaunchParams`] struct: `#[repr(C)]`, 32-bit fields (`u32`, `i32`, `f32`), at
/// most sixteen.
macro_rules! launch_params {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($(#[$fmeta:meta])* $field:ident: $ty:ident,)* }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
        $vis struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
        }
        impl $crate::pipeline::LaunchParams for $name {
            const LAYOUT: $crate::pipeline::ParamsLayout = $crate::pipeline::ParamsLayout {
                name: stringify!($name),
                fields: &[$((stringify!($field), stringify!($ty)),)*],
            };
        }
        const _: () = assert!(std::mem::size_of::<$name>() <= 16 * 4, "sixteen scalar slots");
    };
}
pub(crate) use launch_params;

/// Every typed launch-parameter struct, for `cargo xtask wgsl`.
pub const LAUNCH_PARAMS: &[ParamsLayout] = &[
    <crate::ops::matmul::params::GemmParams as LaunchParams>::LAYOUT,
    <crate::ops::conv::ConvParams as LaunchParams>::LAYOUT,
    <crate::ops::optim::SgdStepParams as LaunchParams>::LAYOUT,
    <crate::ops::optim::AdamStepParams as LaunchParams>::LAYOUT,
    <crate::ops::random::RandomParams as LaunchParams>::LAYOUT,
    <crate::ops::attention::AttentionLaunch as LaunchParams>::LAYOUT,
    <crate::ops::norm::NormLaunch as LaunchParams>::LAYOUT,
    <crate::ops::topk::CandidateLaunch as LaunchParams>::LAYOUT,
];

/// Launch parameters: sixteen scalar slots and up to eight layout blocks (see `wgsl/`).
#[derive(Clone, Default)]
pub(crate) struct Params {
    pub(crate) scalars: [u32; 16],
    pub(crate) blocks: Vec<(Vec<usize>, Vec<isize>, isize)>,
    /// Elements each invocation handles (0 means 1).
    pub(crate) per_thread: u32,
}

impl Params {
    pub(crate) fn block(mut self, l: &Layout) -> Self {
        self.blocks
            .push((l.shape.clone(), l.strides.clone(), l.offset as isize));
        self
    }
    pub(crate) fn scalar(mut self, i: usize, v: u32) -> Self {
        self.scalars[i] = v;
        self
    }
    /// The scalar slots from a [`LaunchParams`] struct, field `i` in slot `i` (the others
    /// unchanged).
    pub(crate) fn typed<T: LaunchParams>(mut self, params: &T) -> Self {
        let words: &[u32] = bytemuck::cast_slice(bytemuck::bytes_of(params));
        self.scalars[..words.len()].copy_from_slice(words);
        self
    }
    pub(crate) fn f(self, i: usize, v: f32) -> Self {
        self.scalar(i, v.to_bits())
    }
    /// A 2-D view's offset, row stride and column stride in slots `i`, `i + 1`, `i + 2`
    /// (as i32 bits).
    pub(crate) fn matrix(self, i: usize, l: &Layout) -> Self {
        let bits = |v: isize| v as i32 as u32;
        self.scalar(i, bits(l.offset as isize))
            .scalar(i + 1, bits(l.strides[0]))
            .scalar(i + 2, bits(l.strides[1]))
    }
    pub(crate) fn encode(&self, threads: u32) -> Vec<u32> {
        let mut p = vec![threads];
        p.extend_from_slice(&self.scalars);
        let mut starts = [0u32; 8];
        let mut body = Vec::new();
        for (k, (shape, strides, offset)) in self.blocks.iter().enumerate() {
            starts[k] = (25 + body.len()) as u32;
            body.push(shape.len() as u32);
            body.push(*offset as i32 as u32);
            body.extend(shape.iter().map(|&d| d as u32));
            body.extend(strides.iter().map(|&s| s as i32 as u32));
        }
        p.extend_from_slice(&starts);
        p.extend(body);
        p
    }
}

/// Which kernel to run: a file of `shaders/` and how it is specialised (see
/// [`wgsl::compose`]). It is the pipeline-cache key (with the immediates variant).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Spec {
    pub(crate) file: &'static str,
    pub(crate) bindings: Option<Vec<(DType, Access)>>,
    pub(crate) slots: Vec<(&'static str, String)>,
    pub(crate) entry: Entry,
}

impl Spec {
    pub(crate) fn new(file: &'static str) -> Self {
        Spec {
            file,
            bindings: None,
            slots: Vec::new(),
            entry: Entry::Strided,
        }
    }
    /// Typed accessors for these dtypes instead of the file's default `bindings` slot.
    pub(crate) fn bindings(mut self, bindings: Vec<(DType, Access)>) -> Self {
        self.bindings = Some(bindings);
        self
    }
    pub(crate) fn slot(mut self, name: &'static str, text: String) -> Self {
        self.slots.push((name, text));
        self
    }
    /// The contiguous entry (several elements per thread) when every operand is contiguous;
    /// its pairs form when `out` is 16-bit, starts on a word and has an even length, so whole
    /// words (two elements) are stored without atomics. For the elementwise files of
    /// [`wgsl::PAIRS_ENTRY_FILES`].
    pub(crate) fn contiguous_if(mut self, all_contiguous: bool, out: V<'_>) -> Self {
        debug_assert!(wgsl::PAIRS_ENTRY_FILES.contains(&self.file));
        let l = out.layout;
        if all_contiguous {
            self.entry =
                if out.dtype().size_in_bytes() == 2 && l.offset % 2 == 0 && l.numel() % 2 == 0 {
                    Entry::ContiguousPairs
                } else {
                    Entry::Contiguous
                };
        }
        self
    }
}

/// A compiled compute pipeline and its bind-group layout (fetched once: wgpu creates a new
/// layout object on every `get_bind_group_layout` call).
pub(crate) struct Kernel {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
    /// Words of launch parameters the kernel takes as immediates; 0: it reads binding 0.
    pub(crate) immediate_words: u32,
    /// What it was built from, to build the binding-0 variant for a launch whose parameters
    /// do not fit the immediates (`None` for IR programs, whose parameters always fit).
    pub(crate) spec: Option<Spec>,
    /// Its shader file, or `ir:` and the program's name (for profiles).
    pub(crate) name: String,
}

/// A dispatch with its bind group and launch parameters built (see `WgpuBackend::prepare`).
pub(crate) struct Prepared {
    /// A [`capture::Command::Dispatch`].
    pub(crate) dispatch: capture::Command,
    /// Its buffers, for a capture to hold.
    pub(crate) buffers: Vec<WgpuBuffer>,
}

/// Size of the launch-parameter buffer: far more than any kernel's parameters need.
pub(crate) const PARAMS_BYTES: u64 = 16 << 10;

/// Whether operand `i` of a dispatch is read while another binding of the same buffer is
/// written (wgpu forbids binding one buffer both ways, so it is read from a copy).
pub(crate) fn read_and_written(buffers: &[(&WgpuBuffer, bool)], i: usize) -> bool {
    let (b, writes) = buffers[i];
    !writes && buffers.iter().any(|&(o, w)| w && o.same_memory(b))
}

impl WgpuBackend {
    /// Compiles WGSL into a pipeline; a validation error is returned with the validator's
    /// report and the shader file and line it points at.
    ///
    /// `built_in`: one of this crate's kernels, compiled without the checks naga would
    /// otherwise inject: a clamp on every workgroup-array index and an iteration counter in
    /// every loop, which together cost about a quarter of the GEMM's inner loop. That is sound
    /// because every loop in `shaders/` runs to a bound read from the launch parameters, every
    /// workgroup-array index is in range by construction, and buffer accesses stay inside the
    /// views `hal::validate` accepted on the host, with indices read from buffers checked on
    /// the device first (a guarded kernel skips its work after a failed check); on Vulkan the driver's
    /// robust buffer access still bounds buffer accesses. Integer division keeps its guard. IR
    /// programs, which users write, keep every check.
    pub(crate) fn build_pipeline(
        &self,
        label: &str,
        code: &wgsl::Module,
        built_in: bool,
        immediate_words: u32,
        spec: Option<Spec>,
    ) -> Result<Arc<Kernel>> {
        let d = &self.0.device;
        let (pipeline, error) = crate::caught(d, wgpu::ErrorFilter::Validation, || {
            let desc = wgpu::ShaderModuleDescriptor {
                label: Some(label),
                source: wgpu::ShaderSource::Wgsl(code.source.as_str().into()),
            };
            let module = if built_in {
                let mut checks = wgpu::ShaderRuntimeChecks::checked();
                checks.bounds_checks = false;
                checks.force_loop_bounding = false;
                // SAFETY: see above: the crate's own kernels have bounded loops and in-range
                // indices; only those two checks are dropped.
                unsafe { d.create_shader_module_trusted(desc, checks) }
            } else {
                d.create_shader_module(desc)
            };
            d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(label),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            })
        });
        if let Some(e) = error {
            let report = e.to_string();
            // The report points at `wgsl:LINE:COLUMN` of the composed module.
            let at = report
                .split("wgsl:")
                .nth(1)
                .and_then(|r| r.split(':').next()?.parse::<usize>().ok())
                .map(|line| {
                    let (file, line) = code.locate(line);
                    format!(" (at {file} line {line})")
                })
                .unwrap_or_default();
            return Err(backend_error(format!(
                "shader `{label}` failed to compile{at}: {report}"
            )));
        }
        let name = match &spec {
            Some(s) => s.file.to_string(),
            None => format!("ir:{label}"),
        };
        Ok(Arc::new(Kernel {
            layout: pipeline.get_bind_group_layout(0),
            pipeline,
            immediate_words,
            spec,
            name,
        }))
    }

    /// Runs `threads` invocations of the kernel (workgroups of [`wgsl::WORKGROUP`], each
    /// invocation handling `params.per_thread` elements) with `params` at binding 0 and
    /// `buffers` at 1.. (`true` marks a buffer the kernel writes).
    pub(crate) fn dispatch(
        &self,
        kernel: &Arc<Kernel>,
        params: &Params,
        buffers: &[(&WgpuBuffer, bool)],
        threads: usize,
    ) -> Result<()> {
        if threads == 0 {
            return Ok(());
        }
        let threads = u32::try_from(threads).map_err(|_| Error::InvalidArgument {
            op: "dispatch",
            detail: format!("{threads} threads exceed 2^32"),
        })?;
        let groups = threads.div_ceil(wgsl::WORKGROUP * params.per_thread.max(1));
        let max = self.0.limits.max_compute_workgroups_per_dimension.max(1);
        self.submit(
            kernel,
            params,
            threads,
            buffers,
            [groups.min(max), groups.div_ceil(max), 1],
        )
    }

    /// The grid of `groups` workgroups for kernels that index their own (a workgroup a row,
    /// say): in x, wrapping into y past the adapter's limit.
    pub(crate) fn row_groups(&self, groups: usize) -> [u32; 3] {
        let max = self.0.limits.max_compute_workgroups_per_dimension.max(1) as usize;
        [groups.min(max) as u32, groups.div_ceil(max) as u32, 1]
    }

    /// [`Self::dispatch`] for kernels that index their own workgroup grid (`P[0]` is 0).
    pub(crate) fn dispatch_groups(
        &self,
        kernel: &Arc<Kernel>,
        params: &Params,
        buffers: &[(&WgpuBuffer, bool)],
        groups: [u32; 3],
    ) -> Result<()> {
        let max = self.0.limits.max_compute_workgroups_per_dimension;
        if groups.iter().any(|&g| g > max) {
            return Err(Error::InvalidArgument {
                op: "dispatch",
                detail: format!("{groups:?} workgroups exceed the adapter's {max} per dimension"),
            });
        }
        self.submit(kernel, params, 0, buffers, groups)
    }

    /// Encodes and submits one dispatch. A read-only buffer that is also written in the same
    /// call is copied first: wgpu forbids binding one buffer both ways.
    pub(crate) fn submit(
        &self,
        kernel: &Arc<Kernel>,
        params: &Params,
        threads: u32,
        buffers: &[(&WgpuBuffer, bool)],
        groups: [u32; 3],
    ) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        let mut words = params.encode(threads);
        let immediates = kernel.immediate_words as usize;
        if immediates > 0 && words.len() > immediates {
            // Too many parameters (high-rank views) for the immediate block: the variant
            // that reads them from binding 0.
            let spec = kernel.spec.as_ref().ok_or_else(|| {
                backend_error(format!(
                    "{} words of launch parameters exceed the {immediates} immediates",
                    words.len()
                ))
            })?;
            let fallback = self.kernel_variant(spec, 0)?;
            return self.submit(&fallback, params, threads, buffers, groups);
        }
        if words.len() as u64 * 4 > PARAMS_BYTES {
            return Err(Error::InvalidArgument {
                op: "dispatch",
                detail: format!(
                    "{} bytes of launch parameters exceed {PARAMS_BYTES}",
                    words.len() * 4
                ),
            });
        }
        // Copies come from the pool (same dtype and length, so the same size class) and go
        // back to it once this call returns: queue order keeps them intact until the dispatch
        // has read them.
        let mut copies: Vec<Option<WgpuBuffer>> = Vec::with_capacity(buffers.len());
        for (i, &(b, _)) in buffers.iter().enumerate() {
            copies.push(if read_and_written(buffers, i) {
                Some(self.scratch(b.dtype(), b.len())?)
            } else {
                None
            });
        }
        let bound: Vec<&wgpu::Buffer> = buffers
            .iter()
            .zip(&copies)
            .map(|(&(b, _), copy)| copy.as_ref().map_or(&b.0.buffer, |c| &c.0.buffer))
            .collect();
        let capturing = self.capturing();
        // Binding 0: the shared parameter buffer, or inside a recording one of the dispatch's
        // own (the shared one is rewritten before every such dispatch, which a replay cannot).
        let own_params = match capturing && immediates == 0 {
            true => Some(self.params_buffer(&words)?),
            false => None,
        };
        let params_binding = (immediates == 0).then(|| {
            let buffer = own_params.as_ref().unwrap_or(&self.0.params);
            (buffer, words.len())
        });
        let group = self.bind_group(kernel, params_binding, &bound);
        self.make_room_in_profile()?;
        // Taken before the batch, as in read_profile.
        let mut profiler = self.0.profiler.as_ref().map(lock);
        let mut batch = self.lock_batch();
        if let Some(c) = batch.capture.as_mut() {
            c.keep(
                buffers
                    .iter()
                    .map(|&(b, _)| b)
                    .chain(copies.iter().flatten()),
            );
        }
        let shared_params = immediates == 0 && !capturing;
        if shared_params {
            // The shared parameter buffer: what came before is submitted first (the write
            // would land ahead of it), and this dispatch right after (the next write would
            // land ahead of it).
            self.submit_batch(&mut batch);
            self.0
                .queue
                .write_buffer(&self.0.params, 0, bytemuck::cast_slice(&words));
        }
        for (&(b, _), copy) in buffers.iter().zip(&copies) {
            if let Some(tmp) = copy {
                let copy = capture::Command::Copy {
                    src: b.0.buffer.clone(),
                    dst: tmp.0.buffer.clone(),
                    bytes: b.0.buffer.size(),
                };
                self.transfer(&mut batch, copy, &[]);
            }
        }
        if immediates > 0 {
            // The shader declares the whole block; every word must be set.
            words.resize(immediates, 0);
        }
        let dispatch = capture::Command::Dispatch {
            kernel: kernel.clone(),
            group,
            words,
            groups,
            name: None,
        };
        self.encode_command(&mut batch, profiler.as_deref_mut(), &dispatch);
        if shared_params {
            self.submit_batch(&mut batch);
        }
        Ok(())
    }

    /// A parameter buffer of one dispatch, holding `words` (made without the queue, so it may
    /// be made inside a recording).
    pub(crate) fn params_buffer(&self, words: &[u32]) -> Result<wgpu::Buffer> {
        let buffer = self.0.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("captured launch parameters"),
            size: (words.len() as u64 * 4).max(4),
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: true,
        });
        {
            let mut view = buffer
                .slice(..)
                .get_mapped_range_mut()
                .map_err(backend_error)?;
            view.slice(..words.len() * 4)
                .copy_from_slice(bytemuck::cast_slice(words));
        }
        buffer.unmap();
        Ok(buffer)
    }

    /// `kernel`'s bind group: `buffers` at bindings 1.., and with `params`, that many words of
    /// that parameter buffer at binding 0.
    pub(crate) fn bind_group(
        &self,
        kernel: &Kernel,
        params: Option<(&wgpu::Buffer, usize)>,
        buffers: &[&wgpu::Buffer],
    ) -> wgpu::BindGroup {
        let params = params.map(|(buffer, words)| wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer,
                offset: 0,
                size: std::num::NonZeroU64::new(words as u64 * 4),
            }),
        });
        let entries: Vec<wgpu::BindGroupEntry<'_>> = params
            .into_iter()
            .chain(
                buffers
                    .iter()
                    .enumerate()
                    .map(|(i, b)| wgpu::BindGroupEntry {
                        binding: i as u32 + 1,
                        resource: b.as_entire_binding(),
                    }),
            )
            .collect();
        self.0.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &kernel.layout,
            entries: &entries,
        })
    }

    /// Encodes one dispatch into the batch (under a profiler, in a pass of its own timed at both
    /// ends, filed under `name` where given), submitting the batch when it is full.
    pub(crate) fn encode_dispatch(
        &self,
        batch: &mut Batch,
        profiler: Option<&mut profile::Profiler>,
        (kernel, name): (&Arc<Kernel>, Option<&str>),
        group: &wgpu::BindGroup,
        words: &[u32],
        groups: [u32; 3],
    ) {
        let timed = profiler.is_some();
        if let Some(profiler) = profiler {
            batch.pass = None;
            let name = name.map_or_else(|| profiler.name_of(&kernel.name), str::to_string);
            let writes = profiler.next(name);
            let pass = batch
                .encoder(&self.0.device)
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: Some(writes),
                })
                .forget_lifetime();
            batch.pass = Some(pass);
        }
        let pass = batch.pass(&self.0.device);
        pass.set_pipeline(&kernel.pipeline);
        pass.set_bind_group(0, group, &[]);
        if kernel.immediate_words > 0 {
            pass.set_immediates(0, bytemuck::cast_slice(words));
        }
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        if timed {
            batch.pass = None;
        }
        batch.commands += 1;
        if batch.full() {
            self.submit_batch(batch);
        }
    }

    /// A dispatch of `spec` over `groups` workgroups made ready to encode many times without
    /// building its bind group again: `None` where the kernel reads its parameters from the
    /// shared binding 0 (no immediates, or too many words for them) or a buffer would have to
    /// be copied first (bound both to read and to write).
    pub(crate) fn prepare(
        &self,
        spec: &Spec,
        params: &Params,
        buffers: &[(&WgpuBuffer, bool)],
        groups: [u32; 3],
    ) -> Result<Option<Prepared>> {
        let kernel = self.kernel(spec)?;
        let immediates = kernel.immediate_words as usize;
        let mut words = params.encode(0);
        let aliased = (0..buffers.len()).any(|i| read_and_written(buffers, i));
        if immediates == 0 || words.len() > immediates || aliased {
            return Ok(None);
        }
        words.resize(immediates, 0);
        let bound: Vec<&wgpu::Buffer> = buffers.iter().map(|&(b, _)| &b.0.buffer).collect();
        let group = self.bind_group(&kernel, None, &bound);
        Ok(Some(Prepared {
            dispatch: capture::Command::Dispatch {
                kernel,
                group,
                words,
                groups,
                name: None,
            },
            buffers: buffers.iter().map(|&(b, _)| b.clone()).collect(),
        }))
    }

    /// The pipeline of `spec`, compiled on first use, taking its parameters as immediates
    /// where the device can.
    pub(crate) fn kernel(&self, spec: &Spec) -> Result<Arc<Kernel>> {
        self.kernel_variant(spec, self.0.immediate_words)
    }

    /// The pipeline of `spec` with `immediate_words` words of immediates (0: parameters in
    /// binding 0). The cache key is the spec itself and the variant, so two calls share a
    /// pipeline exactly when they would compose the same WGSL.
    pub(crate) fn kernel_variant(&self, spec: &Spec, immediate_words: u32) -> Result<Arc<Kernel>> {
        // Looked up by the spec itself: formatting it per dispatch cost more than the lookup.
        let key = (spec.clone(), immediate_words);
        let cached = lock(&self.0.pipelines).get(&key).cloned();
        if let Some(p) = cached {
            return Ok(p);
        }
        if wgsl::uses_fma_exact(spec.file) {
            // Probed first, so the module has no run-time test between fma() and its
            // emulation (see fma_exact.wgsl).
            self.fma_is_fused()?;
        }
        let features = wgsl::Features {
            immediate_words,
            ..self.module_features()
        };
        let module = wgsl::compose(
            spec.file,
            spec.bindings.as_deref(),
            &spec.slots,
            spec.entry,
            features,
        );
        let label = format!("{spec:?} immediates {immediate_words}");
        let p = self.build_pipeline(&label, &module, true, immediate_words, Some(spec.clone()))?;
        lock(&self.0.pipelines).insert(key, p.clone());
        Ok(p)
    }

    /// Compiles (once) and runs the `fn kernel(t)` file of `spec` over `threads` elements
    /// (several per invocation under the contiguous entry).
    pub(crate) fn run(
        &self,
        spec: Spec,
        params: Params,
        buffers: &[(&WgpuBuffer, bool)],
        threads: usize,
    ) -> Result<()> {
        let kernel = self.kernel(&spec)?;
        let params = Params {
            per_thread: match spec.entry {
                Entry::Contiguous | Entry::ContiguousPairs => wgsl::PER_THREAD,
                Entry::Strided => 1,
            },
            ..params
        };
        // Pairs: one thread step per output word.
        let threads = if spec.entry == Entry::ContiguousPairs {
            threads / 2
        } else {
            threads
        };
        self.dispatch(&kernel, &params, buffers, threads)
    }
}
