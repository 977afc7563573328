//! The page's program: read the level from the address, open the backend, solve, draw.
//!
//! The page (`www/index.html`) holds a canvas `#mesh` and text slots that this fills in:
//! `#adapter`, `#backend`, `#iteration`, `#cost`, `#rate`, `#status`, and `#final-cost`
//! once the solve has ended (its text then the final cost in full, and the document's title
//! `solved`), which the browser test reads.

use crate::render::Renderer;
use backend_cpu::CpuBackend;
use backend_wgpu::{WgpuBackend, WgpuOptions};
use hal::Backend;
use residual_compile::icosphere::Icosphere;
use residual_compile::{
    KernelCache, LinearSolver, Problem, Progress, SolveOptions, Summary, solve_async,
};
use std::ops::ControlFlow;
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;

/// The levels the page offers: 642 to 40,962 vertices.
pub const LEVELS: std::ops::RangeInclusive<u32> = 3..=6;

/// The options the page solves with ([`residual_compile::icosphere::demo_options_f32`]).
pub fn options() -> SolveOptions {
    residual_compile::icosphere::demo_options_f32()
}

/// The perturbed icosphere of `level` and its problem: the demos' problem
/// ([`residual_compile::icosphere::demo`]), which the native example solves by default.
pub fn icosphere_problem(level: u32) -> Result<(Icosphere, Vec<f64>, Problem), String> {
    if !LEVELS.contains(&level) {
        return Err(format!(
            "level {level} is outside {}..={}",
            LEVELS.start(),
            LEVELS.end()
        ));
    }
    residual_compile::icosphere::demo(level).map_err(|e| e.to_string())
}

/// The page's entry point, run when the module loads.
#[wasm_bindgen(start)]
pub fn start() {
    wasm_bindgen_futures::spawn_local(async {
        if let Err(e) = run().await {
            show("status", &format!("error: {e}"));
            web_sys::console::error_1(&e.into());
        }
    });
}

async fn run() -> Result<(), String> {
    let window = web_sys::window().ok_or("no window")?;
    let document = window.document().ok_or("no document")?;
    let search = window.location().search().map_err(js_text)?;
    let query = web_sys::UrlSearchParams::new_with_str(&search).map_err(js_text)?;
    let level = match query.get("level") {
        Some(l) => l
            .parse()
            .map_err(|_| format!("level `{l}` is not a number"))?,
        None => 4,
    };
    let force_cpu = query.get("backend").as_deref() == Some("cpu");
    let mut options = options();
    options.linear_solver = match query.get("solver").as_deref() {
        None | Some("auto") => LinearSolver::Auto,
        Some("cholesky") => LinearSolver::SparseCholesky,
        Some("cg") => LinearSolver::ConjugateGradient,
        Some(other) => return Err(format!("solver `{other}`: expected auto, cholesky or cg")),
    };
    if let Some(n) = query.get("max_iterations") {
        options.max_iterations = n
            .parse()
            .map_err(|_| format!("max_iterations `{n}` is not a count"))?;
    }
    let canvas = document
        .get_element_by_id("mesh")
        .ok_or("the page has no canvas #mesh")?
        .dyn_into::<web_sys::HtmlCanvasElement>()
        .map_err(|_| "#mesh is not a canvas")?;
    // Without WebGPU the page still solves (on the CPU) and reports, but draws nothing.
    let mut renderer = match Renderer::new(canvas).await {
        Ok(r) => {
            show("adapter", &r.adapter);
            Some(r)
        }
        Err(e) => {
            show("adapter", &format!("none: {e}"));
            None
        }
    };
    let (mesh, start, problem) = icosphere_problem(level)?;
    show(
        "status",
        &format!(
            "level {level}: {} vertices, {} edges, {} residuals",
            mesh.vertices.len(),
            mesh.edges.len(),
            mesh.edges.len() * 4 + mesh.vertices.len()
        ),
    );
    if let Some(r) = renderer.as_mut() {
        r.set_faces(&mesh.faces);
        r.draw(&start, 0.0)?;
    }
    if !force_cpu && renderer.is_some() {
        match WgpuBackend::open(WgpuOptions::default()).await {
            Ok(gpu) => {
                let on = (&gpu, "WebGPU");
                return solve_live(on, problem, &options, renderer.as_mut()).await;
            }
            Err(e) => show("status", &format!("no WebGPU compute ({e}): on the CPU")),
        }
    }
    let on = (&CpuBackend::new(), "CPU fallback");
    solve_live(on, problem, &options, renderer.as_mut()).await
}

/// Solves on `backend`, drawing and reporting after every iteration.
async fn solve_live<B: Backend>(
    (backend, label): (&B, &str),
    mut problem: Problem,
    options: &SolveOptions,
    mut renderer: Option<&mut Renderer>,
) -> Result<(), String> {
    show("backend", &format!("{label}: {}", backend.info().name));
    let started = now();
    let mut last_draw_error = None;
    let mut observe = |p: Progress<'_>| {
        let it = p.iteration;
        let angle = (now() - started) as f32 * 0.0004;
        if let Some(Err(e)) = renderer.as_mut().map(|r| r.draw(p.parameters, angle)) {
            last_draw_error = Some(e);
        }
        show("iteration", &(it.iteration + 1).to_string());
        show("cost", &format!("{:.6e}", it.cost.min(it.candidate_cost)));
        let seconds = (now() - started) / 1e3;
        show(
            "rate",
            &format!("{} iterations/s", rate((it.iteration + 1) as f64 / seconds)),
        );
        ControlFlow::Continue(())
    };
    let summary = solve_async(
        backend,
        &mut problem,
        options,
        &KernelCache::new(),
        Some(&mut observe),
    )
    .await
    .map_err(|e| e.to_string())?;
    let seconds = (now() - started) / 1e3;
    if let Some(e) = last_draw_error {
        web_sys::console::warn_1(&format!("drawing failed: {e}").into());
    }
    if let Some(r) = renderer {
        r.draw(problem.parameters(), (seconds * 0.4) as f32)?;
    }
    report(&summary, seconds);
    Ok(())
}

fn report(summary: &Summary, seconds: f64) {
    show("solver", &format!("{:?}", summary.linear_solver));
    let solving = (summary.times.total - summary.times.compile).max(1e-9);
    show("iteration", &summary.iterations.to_string());
    show("cost", &format!("{:.6e}", summary.final_cost));
    show(
        "rate",
        &format!(
            "{} iterations/s solving ({} with drawing; compile {:.2} s)",
            rate(summary.iterations as f64 / solving),
            rate(summary.iterations as f64 / seconds),
            summary.times.compile
        ),
    );
    show(
        "status",
        &format!(
            "{:?} after {} iterations: cost {:.6e} -> {:.6e}",
            summary.termination, summary.iterations, summary.initial_cost, summary.final_cost
        ),
    );
    show("final-cost", &format!("{:e}", summary.final_cost));
    if let Some(document) = web_sys::window().and_then(|w| w.document()) {
        document.set_title("solved");
    }
}

/// Three significant digits.
fn rate(per_second: f64) -> String {
    let decimals = (2 - per_second.abs().max(1e-3).log10().floor() as i32).clamp(0, 5) as usize;
    format!("{per_second:.decimals$}")
}

/// Sets the text of the element `id`, where the page has one.
fn show(id: &str, text: &str) {
    if let Some(e) = web_sys::window()
        .and_then(|w| w.document())
        .and_then(|d| d.get_element_by_id(id))
    {
        e.set_text_content(Some(text));
    }
}

/// Milliseconds since the page loaded.
fn now() -> f64 {
    web_sys::window()
        .and_then(|w| w.performance())
        .map_or(0.0, |p| p.now())
}

fn js_text(v: JsValue) -> String {
    v.as_string().unwrap_or_else(|| format!("{v:?}"))
}
