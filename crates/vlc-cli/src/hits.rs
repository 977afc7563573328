//! Search results written as files: ids and distances, `queries x k`, as `.npy` or FAISS's
//! texmex formats.

use crate::Res;

/// Writes search results as `queries x k` files, each atomically: ids as int64 `.npy` (or
/// int32 `.ivecs`), -1 past the hits a query found; distances as float32 `.npy` (or
/// `.fvecs`), `missing` there.
pub(crate) fn write_hits(
    hits: &[Vec<(u64, f32)>],
    k: usize,
    missing: f32,
    ids: Option<&std::path::Path>,
    distances: Option<&std::path::Path>,
) -> Res<()> {
    fn padded(row: &[(u64, f32)], k: usize) -> impl Iterator<Item = Option<(u64, f32)>> + '_ {
        (0..k).map(move |j| row.get(j).copied())
    }
    /// The file's bytes: `.npy` of `descr` (elements of `wide` bytes), or texmex records
    /// (`.ivecs`/`.fvecs`, elements of 4 bytes) from each element's low four bytes.
    fn layout(
        path: &std::path::Path,
        descr: &str,
        rows: usize,
        k: usize,
        elems: Vec<[u8; 8]>,
        wide: usize,
    ) -> Res<Vec<u8>> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("npy") => {
                let body: Vec<u8> = elems.iter().flat_map(|e| e[..wide].to_vec()).collect();
                Ok(vlc_anneal::vectors::npy_array_bytes(descr, rows, k, &body))
            }
            Some("ivecs" | "fvecs") => {
                let mut out = Vec::with_capacity(rows * (4 + 4 * k));
                for row in elems.chunks(k.max(1)).take(rows) {
                    out.extend_from_slice(&(k as i32).to_le_bytes());
                    row.iter().for_each(|e| out.extend_from_slice(&e[..4]));
                }
                Ok(out)
            }
            _ => Err(format!(
                "{}: search results are written as .npy, .ivecs (ids) or .fvecs (distances)",
                path.display()
            )),
        }
    }
    let write = |path: &std::path::Path, bytes: Vec<u8>| -> Res<()> {
        hal::durable::write_bytes_atomic(path, &bytes)
            .map_err(|e| format!("writing {}: {e}", path.display()))
    };
    let rows = hits.len();
    if let Some(path) = ids {
        let texmex = path.extension().is_some_and(|e| e == "ivecs");
        if texmex
            && let Some(&(id, _)) = hits.iter().flatten().find(|(id, _)| *id > i32::MAX as u64)
        {
            return Err(format!(
                "{}: id {id} does not fit .ivecs' int32; write the ids as .npy",
                path.display()
            ));
        }
        let elems: Vec<[u8; 8]> = hits
            .iter()
            .flat_map(|row| padded(row, k))
            .map(|h| {
                let id = h.map_or(-1i64, |(i, _)| i as i64);
                let mut e = [0u8; 8];
                if texmex {
                    e[..4].copy_from_slice(&(id as i32).to_le_bytes());
                } else {
                    e = id.to_le_bytes();
                }
                e
            })
            .collect();
        write(path, layout(path, "<i8", rows, k, elems, 8)?)?;
    }
    if let Some(path) = distances {
        let elems: Vec<[u8; 8]> = hits
            .iter()
            .flat_map(|row| padded(row, k))
            .map(|h| {
                let mut e = [0u8; 8];
                e[..4].copy_from_slice(&h.map_or(missing, |(_, d)| d).to_le_bytes());
                e
            })
            .collect();
        write(path, layout(path, "<f4", rows, k, elems, 4)?)?;
    }
    Ok(())
}
