//! Host ↔ MLX round trips for every element type, dtype metadata and reading with conversion.

use mlx_tensor::{Array, Dtype, Element, bf16, f16};

fn round_trip<T: Element + PartialEq + std::fmt::Debug>(data: &[T]) {
    let a = Array::from_slice(data, &[data.len() as i32]).unwrap();
    assert_eq!(a.dtype(), T::DTYPE);
    assert_eq!(a.nbytes(), data.len() * T::DTYPE.size());
    assert_eq!(a.to_vec::<T>().unwrap(), data, "{:?}", T::DTYPE);
    assert_eq!(
        a.slice_range(&[1], &[2]).unwrap().item::<T>().unwrap(),
        data[1]
    );
}

#[test]
fn every_element_type_round_trips() {
    round_trip(&[1.5f32, -0.0, f32::MAX, f32::MIN_POSITIVE]);
    round_trip(&[1.5f64, -2.25]);
    round_trip(&[f16::from_f32(0.333), f16::MAX, f16::from_f32(-2.0)]);
    round_trip(&[bf16::from_f32(0.333), bf16::MAX, bf16::from_f32(-2.0)]);
    round_trip(&[i8::MIN, -1, i8::MAX]);
    round_trip(&[i16::MIN, -1, i16::MAX]);
    round_trip(&[i32::MIN, -1, i32::MAX]);
    round_trip(&[i64::MIN, -1, i64::MAX]);
    round_trip(&[0u8, 1, u8::MAX]);
    round_trip(&[0u16, 1, u16::MAX]);
    round_trip(&[0u32, 1, u32::MAX]);
    round_trip(&[0u64, 1, u64::MAX]);
    round_trip(&[true, false, true]);
}

#[test]
fn dtype_metadata() {
    let cases = [
        (Dtype::Bool, 1, false, "BOOL"),
        (Dtype::Int8, 1, false, "I8"),
        (Dtype::Uint16, 2, false, "U16"),
        (Dtype::Float16, 2, true, "F16"),
        (Dtype::Bfloat16, 2, true, "BF16"),
        (Dtype::Int32, 4, false, "I32"),
        (Dtype::Float32, 4, true, "F32"),
        (Dtype::Uint64, 8, false, "U64"),
        (Dtype::Float64, 8, true, "F64"),
    ];
    for (d, size, float, name) in cases {
        assert_eq!(
            (d.size(), d.is_float(), d.safetensors_name()),
            (size, float, name),
            "{d:?}"
        );
    }
}

#[test]
fn reading_converts_to_the_requested_type() {
    let a = Array::from_slice(&[1.0f32, 2.5, -3.0], &[3]).unwrap();
    assert_eq!(
        a.to_vec::<bf16>().unwrap(),
        [
            bf16::from_f32(1.0),
            bf16::from_f32(2.5),
            bf16::from_f32(-3.0)
        ]
    );
    assert_eq!(a.to_vec::<i32>().unwrap(), [1, 2, -3]);
    let ints = Array::from_slice(&[7i32], &[1]).unwrap();
    assert_eq!(ints.item::<f32>().unwrap(), 7.0);
    let raw = Array::from_raw_bytes(&1.25f32.to_ne_bytes(), &[], Dtype::Float32).unwrap();
    assert_eq!(raw.item::<f32>().unwrap(), 1.25);
    // A wrong byte count is an error.
    assert!(Array::from_raw_bytes(&[0u8; 3], &[1], Dtype::Float32).is_err());
}

/// E4M3 (`float8_e4m3fn`) by its definition: sign, 4 exponent bits with
/// bias 7, 3 mantissa bits, subnormals at exponent 0, and only `s.1111.111`
/// NaN (no infinities).
fn e4m3_reference(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((code >> 3) & 0x0f);
    let man = f32::from(code & 0x07);
    if exp == 0x0f && code & 0x07 == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}

#[test]
fn every_fp8_code_decodes_to_its_e4m3_value_in_each_float_dtype() {
    let codes: Vec<u8> = (0..=255).collect();
    let a = Array::from_slice(&codes, &[16, 16]).unwrap();
    for dtype in [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16] {
        let got: Vec<f32> = a
            .from_fp8(dtype)
            .unwrap()
            .as_type(Dtype::Float32)
            .unwrap()
            .to_vec()
            .unwrap();
        for (&c, &g) in codes.iter().zip(&got) {
            let want = e4m3_reference(c);
            assert!(
                g == want || (g.is_nan() && want.is_nan()),
                "{dtype:?}: code {c:#04x} decoded to {g}, want {want}"
            );
        }
    }
    assert_eq!(e4m3_reference(0x7e), 448.0, "the format's largest value");
}
