//! Safetensors round trips through MLX's loader and writer.

use std::path::PathBuf;

use mlx_tensor::{Array, Dtype, bf16, f16, io};

/// A scratch file path unique to this process and test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mlx-tensor-io-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn safetensors_round_trip_keeps_dtypes_shapes_and_values() {
    let path = scratch("round_trip.safetensors");
    let f32s = Array::from_slice(&[1.5f32, -2.0, 3.25, 0.0, 1e-3, 7.0], &[2, 3]).unwrap();
    let bf16s = Array::from_slice(&[bf16::from_f32(0.5), bf16::from_f32(-3.0)], &[2]).unwrap();
    let f16s = Array::from_slice(
        &[
            f16::from_f32(0.1),
            f16::from_f32(65504.0),
            f16::from_f32(-1.0),
        ],
        &[3, 1],
    )
    .unwrap();
    let i32s = Array::from_slice(&[i32::MIN, -1, 0, i32::MAX], &[2, 2]).unwrap();
    // A strided view is written in logical order.
    let view = f32s.t().unwrap();
    io::save_safetensors(
        &path,
        [
            ("a.f32", &f32s),
            ("b.bf16", &bf16s),
            ("c.f16", &f16s),
            ("d.i32", &i32s),
            ("e.view", &view),
        ],
    )
    .unwrap();

    let loaded = io::load_safetensors(&path).unwrap();
    let names: Vec<&str> = loaded.tensors.keys().map(String::as_str).collect();
    assert_eq!(names, ["a.f32", "b.bf16", "c.f16", "d.i32", "e.view"]);
    let t = &loaded.tensors;
    let dtypes: Vec<Dtype> = t.values().map(Array::dtype).collect();
    assert_eq!(
        dtypes,
        [
            Dtype::Float32,
            Dtype::Bfloat16,
            Dtype::Float16,
            Dtype::Int32,
            Dtype::Float32
        ]
    );
    assert_eq!(t["a.f32"].shape().as_slice(), &[2, 3]);
    assert_eq!(
        t["a.f32"].to_vec::<f32>().unwrap(),
        f32s.to_vec::<f32>().unwrap()
    );
    assert_eq!(
        t["b.bf16"].to_vec::<bf16>().unwrap(),
        bf16s.to_vec::<bf16>().unwrap()
    );
    assert_eq!(t["c.f16"].shape().as_slice(), &[3, 1]);
    assert_eq!(
        t["c.f16"].to_vec::<f16>().unwrap(),
        f16s.to_vec::<f16>().unwrap()
    );
    assert_eq!(
        t["d.i32"].to_vec::<i32>().unwrap(),
        [i32::MIN, -1, 0, i32::MAX]
    );
    assert_eq!(t["e.view"].shape().as_slice(), &[3, 2]);
    assert_eq!(
        t["e.view"].to_vec::<f32>().unwrap(),
        [1.5, 0.0, -2.0, 1e-3, 3.25, 7.0]
    );
    assert!(loaded.metadata.is_empty(), "{:?}", loaded.metadata);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn bad_files_are_errors_naming_the_file() {
    let missing = scratch("does_not_exist.safetensors");
    let err = io::load_safetensors(&missing).unwrap_err().to_string();
    assert!(err.contains("does_not_exist.safetensors"), "{err}");
    let garbage = scratch("garbage.safetensors");
    std::fs::write(&garbage, b"\x08\x00\x00\x00\x00\x00\x00\x00not json").unwrap();
    assert!(io::load_safetensors(&garbage).is_err());
    std::fs::remove_file(&garbage).unwrap();
}

/// An fp8 checkpoint's `F8_E4M3` tensor loads as its raw codes (`uint8`), which `from_fp8` decodes.
#[test]
fn an_f8_e4m3_tensor_loads_as_its_codes() {
    let path = scratch("fp8.safetensors");
    let codes: Vec<u8> = vec![0x00, 0x38, 0xb8, 0x7e, 0x01, 0x40];
    let header = r#"{"w":{"dtype":"F8_E4M3","shape":[2,3],"data_offsets":[0,6]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&codes);
    std::fs::write(&path, &bytes).unwrap();
    let f = io::load_safetensors(&path).unwrap();
    let w = &f.tensors["w"];
    assert_eq!(w.dtype(), Dtype::Uint8);
    assert_eq!(w.shape().as_slice(), &[2, 3]);
    assert_eq!(w.to_vec::<u8>().unwrap(), codes);
    let v: Vec<f32> = w.from_fp8(Dtype::Float32).unwrap().to_vec().unwrap();
    assert_eq!(v, [0.0, 1.0, -1.0, 448.0, 2f32.powi(-9), 2.0]);
}
