//! Element types a buffer can hold, and the conversion of each to and from `f32`.

use half::{bf16, f16};

/// The element type of a buffer.
///
/// `f32`, `f16` and `bf16` are *storage* types: every primitive loads them as `f32`, computes
/// in `f32` and rounds to the output type on store (round-to-nearest-even). `f64` is a compute
/// type of its own: a primitive whose operands are all `f64` computes in `f64` (a backend that
/// cannot returns [`crate::Error::UnsupportedDType`]; [`crate::Capabilities::f64`] says which
/// primitives it runs). The integer types hold indices, assignments and counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    U32,
    F64,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::U32,
        DType::F64,
    ];
    /// The dtypes of at most 32 bits: what every backend stores, and what primitives compute
    /// on in `f32`.
    pub const NARROW: [DType; 5] = [DType::F32, DType::F16, DType::BF16, DType::I32, DType::U32];
    /// The floating-point storage dtypes computed in `f32`.
    pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Size of one element in bytes.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F64 => 8,
        }
    }

    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// A lower-case name, as used in error messages and reports (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::F64 => "f64",
        }
    }

    /// The element bits of `value` in this dtype, as [`crate::Backend::fill`] writes it
    /// (narrower types in the low bits): `f64` exactly, the other floats rounded through `f32`
    /// to nearest even, integers truncated toward zero and saturated, NaN as integer 0.
    pub fn fill_bits(self, value: f64) -> u64 {
        match self {
            DType::F64 => value.to_bits(),
            _ => self.fill_bits_narrow(value) as u64,
        }
    }

    /// [`DType::fill_bits`] for the dtypes of at most 32 bits (0 for `f64`).
    pub fn fill_bits_narrow(self, value: f64) -> u32 {
        match self {
            DType::F64 => 0,
            DType::F32 => (value as f32).to_bits(),
            DType::F16 => f16::from_f32(value as f32).to_bits() as u32,
            DType::BF16 => bf16::from_f32(value as f32).to_bits() as u32,
            // `as` truncates toward zero, saturates and maps NaN to 0.
            DType::I32 => value as i32 as u32,
            DType::U32 => value as u32,
        }
    }

    /// The unit roundoff of the type when used as storage (half the distance from 1.0 to the
    /// next value); 0 for integers. Parity tolerances are stated in these units.
    pub fn unit_roundoff(self) -> f64 {
        match self {
            DType::F32 => f32::EPSILON as f64 / 2.0,
            DType::F16 => f16::EPSILON.to_f64() / 2.0,
            DType::BF16 => bf16::EPSILON.to_f64() / 2.0,
            DType::F64 => f64::EPSILON / 2.0,
            DType::I32 | DType::U32 => 0.0,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can be uploaded to or downloaded from a buffer of dtype [`Element::DTYPE`].
pub trait Element: bytemuck::Pod + Send + Sync + std::fmt::Debug + 'static {
    const DTYPE: DType;
    /// The value as `f32` (integers convert exactly up to 2^24 in magnitude).
    fn to_f32(self) -> f32;
    /// The nearest representable value (integers: truncation toward zero, saturating).
    fn from_f32(v: f32) -> Self;
    /// The value as `f64` (exact for every type but `u32`/`i32` beyond 2^53, which cannot be).
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
}

impl Element for f64 {
    const DTYPE: DType = DType::F64;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as f64
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl Element for i32 {
    const DTYPE: DType = DType::I32;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as i32
    }
}

impl Element for u32 {
    const DTYPE: DType = DType::U32;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as u32
    }
}
