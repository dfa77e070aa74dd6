//! MLX failures become `Err` values naming the Rust call site; no C++ exception aborts the process.

use mlx_tensor::fast::{self, Mask};
use mlx_tensor::{Array, Dtype, Error, Result, ops};

fn f(data: &[f32], shape: &[i32]) -> Array {
    Array::from_slice(data, shape).unwrap()
}

#[test]
fn shape_mismatch_matmul_names_this_line() {
    let a = f(&[1.0; 6], &[2, 3]);
    let b = f(&[1.0; 4], &[2, 2]);
    let line = line!() + 1;
    let err = a.matmul(&b).unwrap_err();
    let Error::Mlx {
        ref message,
        location,
    } = err
    else {
        panic!("expected Error::Mlx, got {err:?}");
    };
    assert_eq!((location.file(), location.line()), (file!(), line));
    assert!(message.contains("matmul"), "{message}");
    let text = err.to_string();
    assert!(text.contains(&format!("{}:{line}", file!())), "{text}");
}

/// Each case: a name, a failing call, and a word its message must contain.
#[test]
fn failing_calls_return_errors() {
    let x = f(&[1.0; 6], &[2, 3]);
    let cases: Vec<(&str, Result<Array>, &str)> = vec![
        ("reshape to a wrong size", x.reshape(&[4, 2]), "reshape"),
        (
            "add of incompatible shapes",
            x.add(&f(&[1.0; 2], &[2])),
            "broadcast",
        ),
        (
            "transpose with too few axes",
            x.transpose(&[0]),
            "transpose",
        ),
        (
            "concatenate mismatched",
            ops::concatenate(&[x.clone(), f(&[1.0; 2], &[1, 2])], 0),
            "concatenate",
        ),
        (
            "from_slice of too few elements",
            Array::from_slice(&[1.0f32; 5], &[2, 3]),
            "cannot fill",
        ),
        (
            "item of a vector",
            x.item::<f32>().map(|_| x.clone()),
            "item",
        ),
        (
            "slice_axis of a missing axis",
            x.slice_axis(2, 0, 1),
            "out of range",
        ),
        (
            "quantize with bad bits",
            f(&[0.0; 64], &[1, 64]).quantize(64, 7).map(|t| t.0),
            "quantize",
        ),
        (
            "sdpa with mismatched head dims",
            fast::scaled_dot_product_attention(
                &f(&[0.0; 8], &[1, 1, 2, 4]),
                &f(&[0.0; 6], &[1, 1, 2, 3]),
                &f(&[0.0; 6], &[1, 1, 2, 3]),
                1.0,
                Mask::None,
            ),
            "",
        ),
        (
            "take with float indices",
            x.take(&f(&[0.0], &[1]), 0),
            "integ",
        ),
        (
            "rope on a vector",
            fast::rope(&f(&[0.0; 4], &[4]), 4, false, 10_000.0, 1.0, 0),
            "rope",
        ),
    ];
    for (name, got, word) in cases {
        let err = got.expect_err(name).to_string();
        assert!(err.to_lowercase().contains(word), "{name}: {err}");
        assert!(
            err.contains("errors.rs"),
            "{name}: the message names the call site: {err}"
        );
    }
}

#[test]
fn set_default_device_to_a_missing_gpu_is_an_error() {
    if mlx_tensor::gpu_available() {
        return; // Nothing to provoke on a GPU build; device.rs covers the happy path.
    }
    let err = mlx_tensor::set_default_device(mlx_tensor::Device::Gpu).unwrap_err();
    assert!(err.to_string().contains("errors.rs"), "{err}");
    assert_eq!(mlx_tensor::default_device(), mlx_tensor::Device::Cpu);
}

#[test]
fn errors_at_eval_time_are_errors_too() {
    // A float scalar cast to an unmodelled dtype cannot be made; a read-back of
    // an array with the wrong byte count is refused before any copy.
    assert!(Array::from_raw_bytes(&[0; 8], &[3], Dtype::Float32).is_err());
    // The process is still healthy afterwards.
    assert_eq!(f(&[2.0], &[1]).item::<f32>().unwrap(), 2.0);
}
