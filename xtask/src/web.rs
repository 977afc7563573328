//! `cargo xtask web`: the browser demo (crate `web`) built for wasm32, bound by
//! `wasm-bindgen`, and served on localhost; `--check` drives it in headless Chromium through
//! ChromeDriver and checks what a visitor would see; `--test` runs the crate's browser tests.
//!
//! What it needs and installs where missing: the `wasm32-unknown-unknown` target (rustup) and
//! `wasm-bindgen-cli` at the version in Cargo.lock (`cargo install`, a debug build into
//! `target/tools`, about two minutes on two cores). Chromium and ChromeDriver come from the
//! system (Debian: `apt-get install chromium chromium-driver`); `CHROMIUM` and `CHROMEDRIVER`
//! name other binaries.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const USAGE: &str =
    "usage: cargo xtask web [--port N] [--check [--levels 3,4,5,6] [--solver S]] [--test]
  (no flag)  build the page and serve it on http://127.0.0.1:PORT/ (default 8000) until Ctrl-C
  --check    run the page at level 3 in headless Chromium: the canvas must show the mesh and the
             final cost match the native solver's within 1e-3; with --levels, report each level
             (--solver auto|cholesky|cg: the page's linear solver for them; --max-iterations:
             stop them there, for their rate)
  --test     the crate's browser tests (wasm-bindgen-test) in headless Chromium
  --debug    build the page in the dev profile (what CI checks: quicker to build)";

/// Chromium's switches for WebGPU on SwiftShader, headless, as root, on a closed network.
pub const CHROMIUM_ARGS: [&str; 11] = [
    "headless",
    "no-sandbox",
    "disable-background-networking",
    "disable-component-update",
    "disable-sync",
    "no-first-run",
    "enable-unsafe-webgpu",
    "enable-features=Vulkan",
    "use-vulkan=swiftshader",
    "use-angle=swiftshader",
    "window-size=900,900",
];

pub fn run(args: &[String]) -> ExitCode {
    let mut port = 8000u16;
    let (mut check, mut test, mut debug) = (false, false, false);
    let mut levels = vec![3u32];
    let mut solver = "auto".to_string();
    let mut max_iterations = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--port" => match it.next().and_then(|p| p.parse().ok()) {
                Some(p) => port = p,
                None => return usage("--port needs a number"),
            },
            "--check" => check = true,
            "--max-iterations" => match it.next().and_then(|n| n.parse::<usize>().ok()) {
                Some(n) if n > 0 => max_iterations = Some(n),
                _ => return usage("--max-iterations needs a positive count"),
            },
            "--solver" => match it.next().map(String::as_str) {
                Some(s @ ("auto" | "cholesky" | "cg")) => solver = s.to_string(),
                _ => return usage("--solver takes auto, cholesky or cg"),
            },
            "--test" => test = true,
            "--debug" => debug = true,
            "--levels" => {
                let parsed: Option<Vec<u32>> = it
                    .next()
                    .map(|l| l.split(',').map(|v| v.trim().parse().ok()).collect())
                    .unwrap_or(None);
                match parsed {
                    Some(l) if !l.is_empty() && l.iter().all(|v| (3..=6).contains(v)) => levels = l,
                    _ => return usage("--levels takes levels 3 to 6, comma-separated"),
                }
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => return usage(&format!("unknown argument {other}")),
        }
    }
    let result = (|| {
        let bindgen = prepare()?;
        if test {
            browser_tests(&bindgen)?;
        }
        if test && !check {
            return Ok(());
        }
        let site = build_page(&bindgen, debug)?;
        if check {
            let mut extra = format!("solver={solver}");
            if let Some(n) = max_iterations {
                extra += &format!("&max_iterations={n}");
            }
            check_page(&site, &levels, &extra)
        } else {
            serve_forever(&site, port)
        }
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask web: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!("xtask web: {why}\n{USAGE}");
    ExitCode::from(2)
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_path_buf()
}

/// The wasm32 target and a `wasm-bindgen` of the lockfile's version; the latter's path.
fn prepare() -> Result<PathBuf, String> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map_err(|e| format!("rustup: {e} (the wasm32 target is installed with rustup)"))?;
    if !String::from_utf8_lossy(&installed.stdout).contains("wasm32-unknown-unknown") {
        println!("xtask web: adding the wasm32-unknown-unknown target");
        status(Command::new("rustup").args(["target", "add", "wasm32-unknown-unknown"]))?;
    }
    let version = locked_version("wasm-bindgen")?;
    let tools = root().join("target/tools");
    let local = tools.join("bin/wasm-bindgen");
    let wanted = format!("wasm-bindgen {version}");
    for candidate in [local.clone(), PathBuf::from("wasm-bindgen")] {
        let out = Command::new(&candidate).arg("--version").output();
        if out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == wanted) {
            return Ok(candidate);
        }
    }
    println!(
        "xtask web: installing wasm-bindgen-cli {version} into target/tools (about two minutes)"
    );
    status(Command::new("cargo").args([
        "install",
        "wasm-bindgen-cli",
        "--version",
        &version,
        "--debug",
        "--root",
        tools.to_str().ok_or("the target path is not UTF-8")?,
    ]))?;
    Ok(local)
}

/// The version Cargo.lock holds of `package`.
fn locked_version(package: &str) -> Result<String, String> {
    let lock = std::fs::read_to_string(root().join("Cargo.lock"))
        .map_err(|e| format!("Cargo.lock: {e}"))?;
    let needle = format!("name = \"{package}\"\nversion = \"");
    let at = lock
        .find(&needle)
        .ok_or(format!("Cargo.lock has no {package}"))?
        + needle.len();
    Ok(lock[at..].split('"').next().unwrap_or_default().to_string())
}

fn status(cmd: &mut Command) -> Result<(), String> {
    let what = format!("{cmd:?}");
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("{what} failed ({s})")),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// Builds the page into `target/web/` (index.html and pkg/); the folder's path. `debug`: the
/// dev profile (dependencies optimised all the same; what the browser tests built already).
fn build_page(bindgen: &Path, debug: bool) -> Result<PathBuf, String> {
    let mut build = Command::new("cargo");
    build
        .current_dir(root())
        .args(["build", "--target", "wasm32-unknown-unknown", "-p", "web"]);
    if !debug {
        build.arg("--release");
    }
    status(&mut build)?;
    let site = root().join("target/web");
    let staging = root().join("target/web.partial");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| format!("{}: {e}", staging.display()))?;
    let profile = if debug { "debug" } else { "release" };
    let wasm = root().join(format!("target/wasm32-unknown-unknown/{profile}/web.wasm"));
    status(
        Command::new(bindgen)
            .args(["--target", "web", "--no-typescript", "--out-dir"])
            .arg(staging.join("pkg"))
            .arg(&wasm),
    )?;
    std::fs::copy(
        root().join("crates/web/www/index.html"),
        staging.join("index.html"),
    )
    .map_err(|e| format!("index.html: {e}"))?;
    // The folder is replaced whole, so a server never sees half of one build and half of
    // the next.
    let _ = std::fs::remove_dir_all(&site);
    std::fs::rename(&staging, &site).map_err(|e| format!("{}: {e}", site.display()))?;
    Ok(site)
}

/// `cargo test` of the crate's browser tests, with wasm-bindgen-test-runner as the wasm32
/// runner, driving Chromium through ChromeDriver.
fn browser_tests(bindgen: &Path) -> Result<(), String> {
    let runner = bindgen.with_file_name("wasm-bindgen-test-runner");
    let runner = if runner.exists() {
        runner
    } else {
        PathBuf::from("wasm-bindgen-test-runner")
    };
    status(
        Command::new("cargo")
            .current_dir(root().join("crates/web"))
            .args(["test", "--target", "wasm32-unknown-unknown", "-p", "web"])
            .env("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER", &runner)
            .env("CHROMEDRIVER", chromedriver_path())
            .env("WASM_BINDGEN_TEST_TIMEOUT", "300"),
    )
}

fn chromedriver_path() -> String {
    std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into())
}

fn chromium_path() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

fn serve_forever(site: &Path, port: u16) -> Result<(), String> {
    let listener = TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("127.0.0.1:{port}: {e} (another --port?)"))?;
    println!(
        "xtask web: serving {} on http://127.0.0.1:{port}/ (levels: ?level=3 to 6; Ctrl-C stops)",
        site.display()
    );
    serve(listener, site.to_path_buf());
    Ok(())
}

/// Serves the files under `site` to every connection, one thread each.
fn serve(listener: TcpListener, site: PathBuf) {
    for stream in listener.incoming().flatten() {
        let site = site.clone();
        std::thread::spawn(move || {
            let _ = answer(stream, &site);
        });
    }
}

fn answer(mut stream: TcpStream, site: &Path) -> std::io::Result<()> {
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    let target = line.split_whitespace().nth(1).unwrap_or("/");
    let path = target.split(['?', '#']).next().unwrap_or("/");
    let relative = if path == "/" {
        "index.html"
    } else {
        path.trim_start_matches('/')
    };
    let safe = !relative
        .split('/')
        .any(|part| part == ".." || part.is_empty());
    let file = site.join(relative);
    let (status, body) = match std::fs::read(&file) {
        Ok(body) if safe => ("200 OK", body),
        _ => ("404 Not Found", b"not found".to_vec()),
    };
    let mime = match file.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript",
        Some("wasm") => "application/wasm",
        _ => "application/octet-stream",
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {mime}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(&body)
}

/// A ChromeDriver process, stopped on drop.
struct Driver {
    child: Child,
    port: u16,
    session: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = webdriver(
            self.port,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    fn start() -> Result<Self, String> {
        let port = free_port()?;
        let child = Command::new(chromedriver_path())
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "{}: {e} (install chromium and chromium-driver, or set CHROMEDRIVER)",
                    chromedriver_path()
                )
            })?;
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if started.elapsed() > Duration::from_secs(20) {
                return Err("ChromeDriver did not open its port within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = serde_json::json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
            "binary": chromium_path(), "args": CHROMIUM_ARGS }}}});
        let mut driver = Driver {
            child,
            port,
            session: String::new(),
        };
        let reply = webdriver(port, "POST", "/session", Some(&caps))?;
        driver.session = reply["sessionId"]
            .as_str()
            .ok_or(format!("ChromeDriver opened no session: {reply}"))?
            .to_string();
        Ok(driver)
    }

    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<serde_json::Value, String> {
        webdriver(
            self.port,
            method,
            &format!("/session/{}{path}", self.session),
            body,
        )
    }

    fn script(&self, source: &str) -> Result<serde_json::Value, String> {
        self.call(
            "POST",
            "/execute/sync",
            Some(&serde_json::json!({"script": source, "args": []})),
        )
    }
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind(("127.0.0.1", 0)).map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// One WebDriver call; the reply's `value`, or the error it reports.
fn webdriver(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<serde_json::Value, String> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut stream =
        TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("ChromeDriver: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    // ChromeDriver may keep the connection open: the body is read by its length.
    let mut reader = BufReader::new(stream);
    let (mut length, mut chunked) = (None, false);
    loop {
        let mut line = String::new();
        let n = reader
            .read_line(&mut line)
            .map_err(|e| format!("ChromeDriver's reply to {method} {path}: {e}"))?;
        let line = line.trim_end();
        if n == 0 || line.is_empty() {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse::<usize>().ok();
        }
        chunked |= lower.starts_with("transfer-encoding:") && lower.contains("chunked");
    }
    let payload = match (length, chunked) {
        (Some(n), false) => {
            let mut body = vec![0; n];
            reader
                .read_exact(&mut body)
                .map_err(|e| format!("ChromeDriver's reply to {method} {path}: {e}"))?;
            String::from_utf8_lossy(&body).into_owned()
        }
        _ => {
            let mut body = String::new();
            reader
                .read_to_string(&mut body)
                .map_err(|e| format!("ChromeDriver's reply to {method} {path}: {e}"))?;
            if chunked { dechunk(&body) } else { body }
        }
    };
    let json: serde_json::Value = serde_json::from_str(&payload)
        .map_err(|e| format!("ChromeDriver's reply to {method} {path}: {e}: {payload}"))?;
    let value = json["value"].clone();
    if let Some(error) = value.get("error") {
        return Err(format!(
            "WebDriver {method} {path}: {error}: {}",
            value["message"]
        ));
    }
    Ok(value)
}

fn dechunk(body: &str) -> String {
    let (mut out, mut rest) = (String::new(), body);
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}

/// What the page shows once its solve has ended.
struct Outcome {
    final_cost: f64,
    adapter: String,
    adapter_info: String,
    backend: String,
    solver: String,
    iterations: String,
    rate: String,
    status: String,
}

/// Loads the page with `query` (`level=N`, ...) and waits (up to `limit`) for the title
/// `solved`.
fn solve_in_page(
    driver: &Driver,
    base: &str,
    query: &str,
    limit: Duration,
) -> Result<Outcome, String> {
    driver.call(
        "POST",
        "/url",
        Some(&serde_json::json!({"url": format!("{base}?{query}")})),
    )?;
    let started = Instant::now();
    let text = |id: &str| -> Result<String, String> {
        let v = driver.script(&format!(
            "const e = document.getElementById('{id}'); return e ? e.textContent : '';"
        ))?;
        Ok(v.as_str().unwrap_or_default().to_string())
    };
    loop {
        let title = driver.script("return document.title;")?;
        if title.as_str() == Some("solved") {
            break;
        }
        let status = text("status")?;
        if status.starts_with("error") {
            return Err(format!("{query}: the page reports {status}"));
        }
        if started.elapsed() > limit {
            return Err(format!(
                "{query}: not solved within {} s (status: {status}; iteration {})",
                limit.as_secs(),
                text("iteration")?
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let final_text = text("final-cost")?;
    Ok(Outcome {
        final_cost: final_text
            .parse()
            .map_err(|_| format!("{query}: final cost `{final_text}` is not a number"))?,
        adapter: text("adapter")?,
        adapter_info: text("adapter-info")?,
        backend: text("backend")?,
        solver: text("solver")?,
        iterations: text("iteration")?,
        rate: text("rate")?,
        status: text("status")?,
    })
}

/// The share of the canvas's pixels in a screenshot of the page that are not its background.
fn drawn_share(driver: &Driver, site: &Path) -> Result<f64, String> {
    let png = driver.call("GET", "/screenshot", None)?;
    let png = png
        .as_str()
        .ok_or("the screenshot is not base64 text")?
        .to_string();
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&png)
        .map_err(|e| format!("the screenshot: {e}"))?;
    let path = site.join("screenshot.png");
    hal::durable::write_atomic(&path, |w| w.write_all(&bytes))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // The screenshot is decoded by the browser's own PNG decoder, in a fresh 2D canvas, and
    // the pixels inside the WebGPU canvas's rectangle counted there.
    let script = format!(
        "const done = arguments[arguments.length - 1];
         const r = document.getElementById('mesh').getBoundingClientRect();
         const img = new Image();
         img.onload = () => {{
           const c = document.createElement('canvas');
           c.width = img.width; c.height = img.height;
           const g = c.getContext('2d');
           g.drawImage(img, 0, 0);
           const scale = img.width / window.innerWidth;
           const x0 = Math.round(r.left * scale), y0 = Math.round(r.top * scale);
           const w = Math.round(r.width * scale), h = Math.round(Math.min(r.height * scale, img.height - y0));
           if (w <= 0 || h <= 0) {{ done(-1); return; }}
           const d = g.getImageData(x0, y0, w, h).data;
           let drawn = 0;
           for (let i = 0; i < d.length; i += 4) {{
             if (Math.abs(d[i] - 15) + Math.abs(d[i + 1] - 18) + Math.abs(d[i + 2] - 23) > 48) drawn++;
           }}
           done(drawn / (w * h));
         }};
         img.onerror = () => done(-2);
         img.src = 'data:image/png;base64,{png}';"
    );
    let share = driver.call(
        "POST",
        "/execute/async",
        Some(&serde_json::json!({"script": script, "args": []})),
    )?;
    let share = share.as_f64().ok_or(format!("pixel count: {share}"))?;
    if share < 0.0 {
        return Err(format!("the screenshot could not be read back ({share})"));
    }
    Ok(share)
}

/// The native solver's final cost on the page's problem (the demos' icosphere) with the
/// page's options (f32, at most 500 iterations), on the CPU backend.
fn native_final_cost(level: u32) -> Result<f64, String> {
    use residual_compile::icosphere::{demo, demo_options_f32};
    use residual_compile::{KernelCache, solve};
    let (_, _, mut problem) = demo(level).map_err(|e| e.to_string())?;
    let options = demo_options_f32();
    let cpu = backend_cpu::CpuBackend::new();
    let summary =
        solve(&cpu, &mut problem, &options, &KernelCache::new()).map_err(|e| e.to_string())?;
    Ok(summary.final_cost)
}

/// `extra`: the query the levels after 3 are loaded with besides their level.
fn check_page(site: &Path, levels: &[u32], extra: &str) -> Result<(), String> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(|e| e.to_string())?;
    let base = format!(
        "http://127.0.0.1:{}/index.html",
        listener.local_addr().map_err(|e| e.to_string())?.port()
    );
    let served = site.to_path_buf();
    std::thread::spawn(move || serve(listener, served));
    let native = native_final_cost(3)?;
    let driver = Driver::start()?;
    let page = solve_in_page(&driver, &base, "level=3", Duration::from_secs(300))?;
    println!(
        "xtask web: level 3 in the page: {} iterations, final cost {:e} (native f32 on the CPU: {native:e}); {}",
        page.iterations, page.final_cost, page.rate
    );
    println!(
        "  WebGPU adapter {}; drawn with {}; solved on {}",
        page.adapter_info, page.adapter, page.backend
    );
    println!("  {}", page.status);
    if !page.backend.starts_with("WebGPU") {
        return Err(format!(
            "the page did not solve on WebGPU: {}",
            page.backend
        ));
    }
    let relative = (page.final_cost - native).abs() / native.abs().max(f64::MIN_POSITIVE);
    if relative.is_nan() || relative > 1e-3 {
        return Err(format!(
            "the page's final cost {:e} is {relative:.2e} from the native {native:e} (limit 1e-3)",
            page.final_cost
        ));
    }
    let share = drawn_share(&driver, site)?;
    println!(
        "  the mesh covers {:.1}% of the canvas in the screenshot ({})",
        100.0 * share,
        site.join("screenshot.png").display()
    );
    if share < 0.05 {
        return Err(format!(
            "the canvas shows almost nothing but background ({:.2}% drawn)",
            100.0 * share
        ));
    }
    for &level in levels.iter().filter(|&&l| l != 3) {
        let query = format!("level={level}&{extra}");
        let page = solve_in_page(&driver, &base, &query, Duration::from_secs(3600))?;
        println!(
            "xtask web: level {level} ({}): {} iterations, final cost {:e}; {}\n  {}",
            page.solver, page.iterations, page.final_cost, page.rate, page.status
        );
    }
    println!("xtask web: the page passed");
    Ok(())
}
