//! The `mtp-runner` binary.
fn main() -> anyhow::Result<()> {
    let a = mlx_tensor::Array::from_slice(&[1.0f32, 2.0], &[2])?;
    let _ = a.sum(&[0], false)?.item::<f32>()?;
    Ok(())
}
