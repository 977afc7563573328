//! Tiny Shakespeare as nanoGPT's `shakespeare_char/prepare.py` prepares it: 65 characters, the
//! first 90% of the text for training and the rest for validation, written as `.bin` token
//! files and read back as random batches.

use std::path::Path;
use tensor_autograd::text::{CharTokenizer, TokenStream, Tokenizer, write_tokens};

#[test]
fn prepares_as_nanogpt_does() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/tinyshakespeare/input.txt");
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.len(), 1_115_394);
    let tok = CharTokenizer::from_text(&text);
    assert_eq!(tok.vocab_size(), 65);
    assert_eq!(
        tok.chars(),
        "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    );
    let n = text.chars().count();
    let split = (n as f64 * 0.9) as usize;
    let train: String = text.chars().take(split).collect();
    let val: String = text.chars().skip(split).collect();
    let (train, val) = (tok.encode(&train).unwrap(), tok.encode(&val).unwrap());
    // nanoGPT's prepare.py prints "train has 1,003,854 tokens", "val has 111,540 tokens".
    assert_eq!((train.len(), val.len()), (1_003_854, 111_540));
    let dir = std::env::temp_dir().join(format!("shakespeare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_tokens(&dir.join("val.bin"), &val).unwrap();
    let stream = TokenStream::open(&dir.join("val.bin")).unwrap();
    assert_eq!(stream.len(), 111_540);
    let mut state = 1;
    let (x, y) = stream.random_batch(&mut state, 64, 256).unwrap();
    assert_eq!((x.len(), y.len()), (64 * 256, 64 * 256));
    assert!(x.iter().all(|&t| t < 65));
    let sample = tok.decode(&x[..256]).unwrap();
    assert!(val.iter().map(|&t| t as usize).max().unwrap() < 65);
    assert_eq!(sample.chars().count(), 256);
    std::fs::remove_dir_all(&dir).unwrap();
}
