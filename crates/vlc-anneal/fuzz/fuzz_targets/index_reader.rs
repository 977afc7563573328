//! Any bytes given to the index reader give an index or an error, never a panic; an index
//! that parses can be decoded and searched.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(index) = vlc_anneal::Index::from_bytes(data.to_vec(), "fuzz") {
        let h = &index.header;
        if h.n.saturating_mul(h.d) <= 1 << 16 {
            let _ = index.decompress().map(|m| m.rows);
            let q = vlc_anneal::Matrix::new(1, h.d, vec![0.0; h.d]).unwrap();
            let _ = index.search(&q, 3, 2);
        }
    }
});
