//! CUBIN images of compiled IR programs, kept on disk between processes: a program NVRTC
//! compiled once (up to half a second for a large unrolled kernel; a bundle adjustment's
//! kernels took 2 s together in a fresh process) loads in about a millisecond the next time.
//!
//! An entry's identity is everything the image depends on: the generated CUDA source, the
//! compile options (the architecture among them) and NVRTC's version. Its file is named by a
//! hash of the identity and holds the identity itself, and is used only where that matches
//! byte for byte: a hash collision, a truncated or foreign file is a miss. Files are written
//! atomically; any error reading or writing one is a miss (the program is compiled as if
//! there were no cache), never a failure.
//!
//! Where: the folder `$BACKEND_CUDA_KERNEL_CACHE` names (`0` or empty turns the cache off),
//! else `$XDG_CACHE_HOME/gpu-stack/cubin`, else `$HOME/.cache/gpu-stack/cubin`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const MAGIC: &[u8; 8] = b"GSCUBIN1";

/// The cache folder, or `None` where it is off (or no home is known).
pub(crate) fn folder() -> Option<&'static Path> {
    static FOLDER: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOLDER
        .get_or_init(|| {
            let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
            match std::env::var_os("BACKEND_CUDA_KERNEL_CACHE") {
                Some(v) if v.is_empty() || v == "0" => None,
                Some(v) => Some(PathBuf::from(v)),
                None => var("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
                    .map(|base| base.join("gpu-stack").join("cubin")),
            }
        })
        .as_deref()
}

/// An entry's identity from its parts (each length-prefixed, so parts cannot run together).
pub(crate) fn identity(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len() + 8).sum());
    for p in parts {
        out.extend_from_slice(&(p.len() as u64).to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

/// 64-bit FNV-1a: the file name, not the check (the identity is compared whole).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn path(dir: &Path, identity: &[u8]) -> PathBuf {
    dir.join(format!("{:016x}.cubin", fnv1a(identity)))
}

/// The image stored for `identity` in `dir`, if a file there holds exactly that identity.
pub(crate) fn load(dir: &Path, identity: &[u8]) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path(dir, identity)).ok()?;
    let rest = bytes.strip_prefix(MAGIC)?;
    let (len, rest) = rest.split_first_chunk::<8>()?;
    let len = usize::try_from(u64::from_le_bytes(*len)).ok()?;
    if rest.len() < len || &rest[..len] != identity {
        return None;
    }
    let (image_len, image) = rest[len..].split_first_chunk::<8>()?;
    let image_len = usize::try_from(u64::from_le_bytes(*image_len)).ok()?;
    (image.len() == image_len && image_len > 0).then(|| image.to_vec())
}

/// Stores `image` for `identity` in `dir` (created if missing), atomically; errors are
/// ignored (the next process compiles again).
pub(crate) fn store(dir: &Path, identity: &[u8], image: &[u8]) {
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let _ = hal::durable::write_atomic(&path(dir, identity), |w| {
        w.write_all(MAGIC)?;
        w.write_all(&(identity.len() as u64).to_le_bytes())?;
        w.write_all(identity)?;
        w.write_all(&(image.len() as u64).to_le_bytes())?;
        w.write_all(image)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cubin-cache-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// An entry comes back only for its own identity; a damaged or foreign file is a miss.
    #[test]
    fn entries_load_only_for_their_identity() {
        let dir = temp_dir("roundtrip");
        let id = identity(&[b"__global__ void program() {}", b"--gpu-architecture=sm_90"]);
        assert_eq!(load(&dir, &id), None, "empty cache");
        store(&dir, &id, b"\x7fELF image");
        assert_eq!(load(&dir, &id).as_deref(), Some(&b"\x7fELF image"[..]));
        // Same parts split differently: a different identity.
        let other = identity(&[b"__global__ void program() {}--gpu", b"-architecture=sm_90"]);
        assert_ne!(id, other);
        assert_eq!(load(&dir, &other), None);
        // A file holding another identity under this name (a collision) is a miss.
        let file = path(&dir, &id);
        let good = std::fs::read(&file).unwrap();
        let mut foreign = good.clone();
        foreign[20] ^= 1;
        std::fs::write(&file, &foreign).unwrap();
        assert_eq!(load(&dir, &id), None);
        // Truncated anywhere: a miss.
        for cut in [0, 4, 12, 20, good.len() - 3] {
            std::fs::write(&file, &good[..cut]).unwrap();
            assert_eq!(load(&dir, &id), None, "cut at {cut}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A folder that cannot be made is a silent miss, not an error.
    #[test]
    fn an_unwritable_folder_is_a_miss() {
        let dir = temp_dir("blocked");
        std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
        std::fs::write(&dir, b"a file where the folder should be").unwrap();
        let id = identity(&[b"x"]);
        store(&dir.join("sub"), &id, b"image");
        assert_eq!(load(&dir.join("sub"), &id), None);
        std::fs::remove_file(&dir).unwrap();
    }
}
