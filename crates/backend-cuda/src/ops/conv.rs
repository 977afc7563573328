//! im2col and col2im.

use crate::device::Args;
use crate::walk::{Col2imDivs, FastDiv, Geo, Im2colDivs};
use crate::{CudaBackend, V};
use hal::{Conv2dGeometry, Layout, Result, validate};

pub(crate) fn im2col(gpu: &CudaBackend, x: V<'_>, g: &Conv2dGeometry, out: V<'_>) -> Result<()> {
    validate::im2col(x, g, out)?;
    gpu.dev.bind()?;
    let geo = geometry(g, x.layout, out.layout);
    let total = (geo.n * geo.c * geo.kh * geo.kw * geo.oh * geo.ow) as usize;
    let args = Args::new().arg(geo);
    let (name, threads, args) = if fits_fast_division(&geo, total) {
        let d = |v: i64| FastDiv::new(v as u32);
        let divs = Im2colDivs {
            ohw: d(geo.oh * geo.ow),
            c: d(geo.c),
            ow: d(geo.ow),
        };
        // A thread per window position, writing its kh*kw entries.
        let threads = (geo.n * geo.c * geo.oh * geo.ow) as usize;
        ("im2col_kernel32", threads, args.arg(divs))
    } else {
        ("im2col_kernel", total, args)
    };
    gpu.launch_image_copy(name, threads, args, x, out)
}

pub(crate) fn col2im(gpu: &CudaBackend, cols: V<'_>, g: &Conv2dGeometry, out: V<'_>) -> Result<()> {
    validate::col2im(cols, g, out)?;
    gpu.dev.bind()?;
    let geo = geometry(g, out.layout, cols.layout);
    let total = (geo.n * geo.c * geo.h * geo.w) as usize;
    let args = Args::new().arg(geo);
    let (name, args) = if fits_fast_division(&geo, total) {
        let d = |v: i64| FastDiv::new(v as u32);
        let divs = Col2imDivs {
            w: d(geo.w),
            h: d(geo.h),
            c: d(geo.c),
            sh: d(geo.sh),
            sw: d(geo.sw),
        };
        ("col2im_kernel32", args.arg(divs))
    } else {
        ("col2im_kernel", args)
    };
    gpu.launch_image_copy(name, total, args, cols, out)
}

/// Whether the u32 im2col/col2im kernels serve geometry `g` with `total` threads' worth of
/// positions: every position, window coordinate (`y + pad`, `k * dilation`) and divisor
/// below 2^31, where their multiply-high division is exact.
pub(crate) fn fits_fast_division(g: &Geo, total: usize) -> bool {
    let limit = i32::MAX as i64;
    let spans = [
        total as i64,
        g.h + 2 * g.ph,
        g.w + 2 * g.pw,
        g.kh * g.dh,
        g.kw * g.dw,
        g.c * g.kh * g.kw,
        g.oh * g.ow,
        g.sh,
        g.sw,
    ];
    total as u64 <= limit as u64 && spans.iter().all(|&v| (0..limit).contains(&v))
}

pub(crate) fn geometry(g: &Conv2dGeometry, image: &Layout, cols: &Layout) -> Geo {
    let (oh, ow) = g.output_size().unwrap_or((0, 0));
    let s = |l: &Layout, i: usize| l.strides[i] as i64;
    Geo {
        n: g.batch as i64,
        c: g.channels as i64,
        h: g.height as i64,
        w: g.width as i64,
        kh: g.kernel.0 as i64,
        kw: g.kernel.1 as i64,
        sh: g.stride.0 as i64,
        sw: g.stride.1 as i64,
        ph: g.padding.0 as i64,
        pw: g.padding.1 as i64,
        dh: g.dilation.0 as i64,
        dw: g.dilation.1 as i64,
        oh: oh as i64,
        ow: ow as i64,
        xs: [s(image, 0), s(image, 1), s(image, 2), s(image, 3)],
        xoff: image.offset as i64,
        cs: [s(cols, 0), s(cols, 1), s(cols, 2)],
        coff: cols.offset as i64,
    }
}

impl CudaBackend {
    /// Launches an im2col/col2im kernel over `total` positions: `args` holds the geometry
    /// (and the divisors of the u32 form); the source and destination follow.
    pub(crate) fn launch_image_copy(
        &self,
        name: &'static str,
        total: usize,
        args: Args,
        src: V<'_>,
        out: V<'_>,
    ) -> Result<()> {
        self.dev
            .launch(name, total, args.operand(src.buffer).operand(out.buffer))
    }
}
