//! Element types: the [`Dtype`] enum and the [`Element`] trait for host data.

use half::{bf16, f16};

use crate::ffi::sys::DtypeCode;

/// MLX element types that this crate reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dtype {
    /// Boolean, one byte per element.
    Bool,
    /// Unsigned 8-bit integer.
    Uint8,
    /// Unsigned 16-bit integer.
    Uint16,
    /// Unsigned 32-bit integer.
    Uint32,
    /// Unsigned 64-bit integer.
    Uint64,
    /// Signed 8-bit integer.
    Int8,
    /// Signed 16-bit integer.
    Int16,
    /// Signed 32-bit integer.
    Int32,
    /// Signed 64-bit integer.
    Int64,
    /// IEEE half precision.
    Float16,
    /// IEEE single precision.
    Float32,
    /// bfloat16.
    Bfloat16,
    /// IEEE double precision (CPU only in MLX).
    Float64,
}

impl Dtype {
    pub(crate) fn code(self) -> DtypeCode {
        match self {
            Dtype::Bool => DtypeCode::Bool,
            Dtype::Uint8 => DtypeCode::Uint8,
            Dtype::Uint16 => DtypeCode::Uint16,
            Dtype::Uint32 => DtypeCode::Uint32,
            Dtype::Uint64 => DtypeCode::Uint64,
            Dtype::Int8 => DtypeCode::Int8,
            Dtype::Int16 => DtypeCode::Int16,
            Dtype::Int32 => DtypeCode::Int32,
            Dtype::Int64 => DtypeCode::Int64,
            Dtype::Float16 => DtypeCode::Float16,
            Dtype::Float32 => DtypeCode::Float32,
            Dtype::Bfloat16 => DtypeCode::Bfloat16,
            Dtype::Float64 => DtypeCode::Float64,
        }
    }

    pub(crate) fn from_code(code: DtypeCode) -> Option<Dtype> {
        Some(match code {
            DtypeCode::Bool => Dtype::Bool,
            DtypeCode::Uint8 => Dtype::Uint8,
            DtypeCode::Uint16 => Dtype::Uint16,
            DtypeCode::Uint32 => Dtype::Uint32,
            DtypeCode::Uint64 => Dtype::Uint64,
            DtypeCode::Int8 => Dtype::Int8,
            DtypeCode::Int16 => Dtype::Int16,
            DtypeCode::Int32 => Dtype::Int32,
            DtypeCode::Int64 => Dtype::Int64,
            DtypeCode::Float16 => Dtype::Float16,
            DtypeCode::Float32 => Dtype::Float32,
            DtypeCode::Bfloat16 => Dtype::Bfloat16,
            DtypeCode::Float64 => Dtype::Float64,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
            Dtype::Uint16 | Dtype::Int16 | Dtype::Float16 | Dtype::Bfloat16 => 2,
            Dtype::Uint32 | Dtype::Int32 | Dtype::Float32 => 4,
            Dtype::Uint64 | Dtype::Int64 | Dtype::Float64 => 8,
        }
    }

    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            Dtype::Float16 | Dtype::Float32 | Dtype::Bfloat16 | Dtype::Float64
        )
    }

    /// The safetensors / numpy style name (`F32`, `BF16`, ...).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::Uint8 => "U8",
            Dtype::Uint16 => "U16",
            Dtype::Uint32 => "U32",
            Dtype::Uint64 => "U64",
            Dtype::Int8 => "I8",
            Dtype::Int16 => "I16",
            Dtype::Int32 => "I32",
            Dtype::Int64 => "I64",
            Dtype::Float16 => "F16",
            Dtype::Float32 => "F32",
            Dtype::Bfloat16 => "BF16",
            Dtype::Float64 => "F64",
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A host element type with a matching MLX dtype. Sealed: the byte layout must match MLX's.
pub trait Element: sealed::Sealed + Copy + 'static {
    /// The MLX dtype of this type.
    const DTYPE: Dtype;
    /// Appends the native-endian bytes of `self`.
    fn write_bytes(self, out: &mut Vec<u8>);
    /// Reads one element from exactly `Self::DTYPE.size()` native-endian bytes.
    fn read_bytes(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: Dtype = $d;
            fn write_bytes(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_ne_bytes());
            }
            fn read_bytes(bytes: &[u8]) -> Self {
                <$t>::from_ne_bytes(bytes.try_into().expect("element width"))
            }
        }
    };
}

element!(u8, Dtype::Uint8);
element!(u16, Dtype::Uint16);
element!(u32, Dtype::Uint32);
element!(u64, Dtype::Uint64);
element!(i8, Dtype::Int8);
element!(i16, Dtype::Int16);
element!(i32, Dtype::Int32);
element!(i64, Dtype::Int64);
element!(f32, Dtype::Float32);
element!(f64, Dtype::Float64);
element!(f16, Dtype::Float16);
element!(bf16, Dtype::Bfloat16);

impl sealed::Sealed for bool {}
impl Element for bool {
    const DTYPE: Dtype = Dtype::Bool;
    fn write_bytes(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
    fn read_bytes(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}
