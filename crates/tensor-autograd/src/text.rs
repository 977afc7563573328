//! Text for language models: tokenizers ([`CharTokenizer`], nanoGPT's character level, and
//! [`Gpt2Tokenizer`], GPT-2's byte-pair encoding with the ranks `tiktoken-rs` bundles) and
//! token streams ([`TokenStream`]: the `.bin` files nanoGPT's `prepare.py` writes, u16 tokens
//! little-endian, memory-mapped, read as random windows of a batch).

use crate::data::splitmix;
use crate::error::{Error, Result, invalid};
use crate::tensor::Tensor;
use hal::Backend;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Text to token ids and back.
pub trait Tokenizer {
    /// The ids of `text`; a character the vocabulary lacks is an error naming it.
    fn encode(&self, text: &str) -> Result<Vec<u32>>;
    /// The text of `tokens`; an id outside the vocabulary is an error.
    fn decode(&self, tokens: &[u32]) -> Result<String>;
    /// How many ids there are (ids are `0..vocab_size()`).
    fn vocab_size(&self) -> usize;
}

/// Characters as tokens, numbered in sorted order (nanoGPT's `shakespeare_char`: Tiny
/// Shakespeare has 65).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CharTokenizer {
    chars: Vec<char>,
    ids: HashMap<char, u32>,
}

impl CharTokenizer {
    /// The vocabulary of `text`: its distinct characters, sorted.
    pub fn from_text(text: &str) -> Self {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        Self::from_sorted(chars)
    }

    /// A vocabulary given as its characters (the order of [`CharTokenizer::chars`]);
    /// repeated characters are an error.
    pub fn from_chars(chars: &str) -> Result<Self> {
        let list: Vec<char> = chars.chars().collect();
        let mut sorted = list.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != list.len() {
            return Err(invalid("CharTokenizer", "a character appears twice"));
        }
        let ids = list
            .iter()
            .enumerate()
            .map(|(i, &c)| (c, i as u32))
            .collect();
        Ok(Self { chars: list, ids })
    }

    fn from_sorted(chars: Vec<char>) -> Self {
        let ids = chars
            .iter()
            .enumerate()
            .map(|(i, &c)| (c, i as u32))
            .collect();
        Self { chars, ids }
    }

    /// The vocabulary, id order (what a checkpoint stores to decode its samples).
    pub fn chars(&self) -> String {
        self.chars.iter().collect()
    }
}

impl Tokenizer for CharTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        text.chars()
            .enumerate()
            .map(|(i, c)| {
                self.ids.get(&c).copied().ok_or_else(|| {
                    invalid(
                        "CharTokenizer::encode",
                        format!("character {c:?} (at {i}) is not in the vocabulary"),
                    )
                })
            })
            .collect()
    }

    fn decode(&self, tokens: &[u32]) -> Result<String> {
        tokens
            .iter()
            .map(|&t| {
                self.chars.get(t as usize).copied().ok_or_else(|| {
                    invalid(
                        "CharTokenizer::decode",
                        format!("id {t} is outside the {} characters", self.chars.len()),
                    )
                })
            })
            .collect()
    }

    fn vocab_size(&self) -> usize {
        self.chars.len()
    }
}

/// GPT-2's byte-pair encoding (`r50k_base`: 50,257 ids, `<|endoftext|>` = 50256), from the
/// ranks `tiktoken-rs` bundles: nothing is downloaded.
pub struct Gpt2Tokenizer {
    bpe: tiktoken_rs::CoreBPE,
}

impl Gpt2Tokenizer {
    /// The end-of-text id, which nanoGPT's OpenWebText preparation appends to each document.
    pub const END_OF_TEXT: u32 = 50256;

    pub fn new() -> Result<Self> {
        let bpe = tiktoken_rs::r50k_base()
            .map_err(|e| invalid("Gpt2Tokenizer", format!("the bundled ranks: {e}")))?;
        Ok(Self { bpe })
    }
}

impl Tokenizer for Gpt2Tokenizer {
    /// Ordinary text: `<|endoftext|>` in `text` is encoded as text, not as the special id
    /// (as tiktoken's `encode_ordinary`, which nanoGPT's preparation uses).
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.bpe.encode_ordinary(text))
    }

    fn decode(&self, tokens: &[u32]) -> Result<String> {
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.vocab_size()) {
            return Err(invalid(
                "Gpt2Tokenizer::decode",
                format!("id {bad} is outside GPT-2's {} ids", self.vocab_size()),
            ));
        }
        self.bpe
            .decode(tokens)
            .map_err(|e| invalid("Gpt2Tokenizer::decode", e.to_string()))
    }

    fn vocab_size(&self) -> usize {
        50257
    }
}

/// Writes `tokens` as a nanoGPT `.bin` file (u16, little-endian), atomically. An id above
/// 65,535 is an error (the format cannot hold it) and nothing is written.
pub fn write_tokens(path: &Path, tokens: &[u32]) -> Result<()> {
    if let Some(i) = tokens.iter().position(|&t| t > u16::MAX as u32) {
        return Err(invalid(
            "write_tokens",
            format!("token {i} is {}; a .bin file holds u16 ids", tokens[i]),
        ));
    }
    let bytes: Vec<u8> = tokens
        .iter()
        .flat_map(|&t| (t as u16).to_le_bytes())
        .collect();
    hal::durable::write_bytes_atomic(path, &bytes).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

/// A token file as nanoGPT's `prepare.py` writes it (`np.uint16`, little-endian), mapped into
/// memory: a file of billions of tokens costs only the pages that batches touch.
pub struct TokenStream {
    path: PathBuf,
    map: memmap2::Mmap,
}

impl TokenStream {
    /// Maps `path`; an odd length (not whole u16s) is an error.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| Error::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this stream. A file another process
        // truncates while it is mapped would fault the reader (as any memory-mapped reader);
        // token files are written once, atomically (`write_tokens`), and then only read.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        if map.len() % 2 != 0 {
            return Err(Error::Checkpoint {
                path: path.display().to_string(),
                detail: format!("{} bytes: not whole u16 tokens", map.len()),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            map,
        })
    }

    /// The number of tokens.
    pub fn len(&self) -> usize {
        self.map.len() / 2
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Token `i`.
    pub fn get(&self, i: usize) -> Option<u32> {
        let b = self.map.get(2 * i..2 * i + 2)?;
        Some(u16::from_le_bytes([b[0], b[1]]) as u32)
    }

    /// Tokens `start..start + n` (an error past the end).
    pub fn window(&self, start: usize, n: usize) -> Result<Vec<u32>> {
        let end = start.checked_add(n).filter(|&e| e <= self.len());
        let Some(end) = end else {
            return Err(invalid(
                "TokenStream::window",
                format!(
                    "tokens {start}..{start}+{n} of {} ({})",
                    self.len(),
                    self.path.display()
                ),
            ));
        };
        Ok(self.map[2 * start..2 * end]
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as u32)
            .collect())
    }

    /// `batch` random windows of `block + 1` tokens, as nanoGPT's `get_batch` draws them
    /// (starts uniform in `0..len - block`), split into inputs and next-token targets, both
    /// `[batch, block]` row-major. `state` is a SplitMix64 state, advanced per window: the same
    /// state gives the same batch.
    pub fn random_batch(
        &self,
        state: &mut u64,
        batch: usize,
        block: usize,
    ) -> Result<(Vec<u32>, Vec<u32>)> {
        if block == 0 || batch == 0 || self.len() <= block {
            return Err(invalid(
                "TokenStream::random_batch",
                format!(
                    "batch {batch} of block {block} from {} tokens ({})",
                    self.len(),
                    self.path.display()
                ),
            ));
        }
        let starts = (self.len() - block) as u64;
        let (mut x, mut y) = (
            Vec::with_capacity(batch * block),
            Vec::with_capacity(batch * block),
        );
        for _ in 0..batch {
            *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            // Multiply-shift maps the 64-bit word onto 0..starts without modulo bias to speak
            // of (starts is far below 2^64).
            let start = ((splitmix(*state) as u128 * starts as u128) >> 64) as usize;
            let w = self.window(start, block + 1)?;
            x.extend_from_slice(&w[..block]);
            y.extend_from_slice(&w[1..]);
        }
        Ok((x, y))
    }

    /// [`TokenStream::random_batch`] as `u32` tensors `[batch, block]` on `backend`.
    pub fn random_batch_tensors<B: Backend>(
        &self,
        backend: &B,
        state: &mut u64,
        batch: usize,
        block: usize,
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        let (x, y) = self.random_batch(state, batch, block)?;
        Ok((
            Tensor::from_elements(backend, &x, &[batch, block])?,
            Tensor::from_elements(backend, &y, &[batch, block])?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_round_trip_in_sorted_order() {
        let t = CharTokenizer::from_text("hello, world\n");
        assert_eq!(t.chars(), "\n ,dehlorw");
        assert_eq!(t.vocab_size(), 10);
        let ids = t.encode("world").unwrap();
        assert_eq!(ids, vec![9, 7, 8, 6, 3]);
        assert_eq!(t.decode(&ids).unwrap(), "world");
        assert!(t.encode("help!").unwrap_err().to_string().contains("'p'"));
        assert!(t.decode(&[10]).is_err());
        assert_eq!(CharTokenizer::from_chars(&t.chars()).unwrap(), t);
        assert!(CharTokenizer::from_chars("aba").is_err());
    }

    #[test]
    fn gpt2_encodes_as_tiktoken_does() {
        let t = Gpt2Tokenizer::new().unwrap();
        // "Hello world" is [15496, 995] in GPT-2's vocabulary (tiktoken's r50k_base).
        assert_eq!(t.encode("Hello world").unwrap(), vec![15496, 995]);
        let text = "First Citizen:\nBefore we proceed any further, hear me speak.";
        assert_eq!(t.decode(&t.encode(text).unwrap()).unwrap(), text);
        assert!(t.decode(&[50257]).is_err());
    }

    #[test]
    fn token_files_round_trip_and_batch_deterministically() {
        let dir = std::env::temp_dir().join(format!("ta-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.bin");
        let tokens: Vec<u32> = (0..1000).map(|i| (i * 37) % 65536).collect();
        write_tokens(&path, &tokens).unwrap();
        let s = TokenStream::open(&path).unwrap();
        assert_eq!(s.len(), 1000);
        assert_eq!(s.window(10, 3).unwrap(), tokens[10..13].to_vec());
        assert!(s.window(999, 2).is_err());
        let (mut a, mut b) = (5u64, 5u64);
        let (x, y) = s.random_batch(&mut a, 4, 8).unwrap();
        assert_eq!(
            s.random_batch(&mut b, 4, 8).unwrap(),
            (x.clone(), y.clone())
        );
        for r in 0..4 {
            // Targets are the inputs shifted by one.
            assert_eq!(x[r * 8 + 1..r * 8 + 8], y[r * 8..r * 8 + 7]);
        }
        assert!(s.random_batch(&mut a, 1, 1000).is_err());
        assert!(write_tokens(&dir.join("big.bin"), &[70000]).is_err());
        assert!(!dir.join("big.bin").exists());
        std::fs::write(dir.join("odd.bin"), [1u8, 2, 3]).unwrap();
        assert!(TokenStream::open(&dir.join("odd.bin")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
