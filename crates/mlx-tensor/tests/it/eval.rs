//! Evaluation (eval, async_eval + wait, batched), clones sharing a node, device choice and library facts.

use mlx_tensor::{Array, Device, Dtype};

#[test]
fn async_eval_then_wait_gives_the_value() {
    let c = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let d = c.matmul(&c).unwrap().matmul(&c).unwrap();
    d.async_eval().unwrap();
    d.wait().unwrap();
    // c³ = [37 54; 81 118]
    assert_eq!(d.to_vec::<f32>().unwrap(), [37.0, 54.0, 81.0, 118.0]);
    let e = d.add(&c).unwrap();
    let f = d.subtract(&c).unwrap();
    mlx_tensor::async_eval([&e, &f]).unwrap();
    f.wait().unwrap();
    e.wait().unwrap();
    assert_eq!(e.to_vec::<f32>().unwrap(), [38.0, 56.0, 84.0, 122.0]);
    assert_eq!(f.to_vec::<f32>().unwrap(), [36.0, 52.0, 78.0, 114.0]);
    mlx_tensor::eval([&e, &f]).unwrap();
}

#[test]
fn clones_share_one_node() {
    let a = Array::from_slice(&[1.0f32, 2.0], &[2])
        .unwrap()
        .exp()
        .unwrap();
    let b = a.clone();
    drop(a);
    b.eval().unwrap();
    let got = b.to_vec::<f32>().unwrap();
    // MLX's vectorised exp may differ from libm by an ulp: tolerance 1e-6 relative.
    for (g, w) in got.iter().zip([1f32.exp(), 2f32.exp()]) {
        assert!((g - w).abs() <= 1e-6 * w, "{g} vs {w}");
    }
    assert_eq!(format!("{b:?}"), "Array { shape: [2], dtype: Float32 }");
}

#[test]
fn device_choice() {
    assert_eq!(
        mlx_tensor::default_device(),
        if mlx_tensor::gpu_available() {
            Device::Gpu
        } else {
            Device::Cpu
        }
    );
    mlx_tensor::set_default_device(Device::Cpu).unwrap();
    assert_eq!(mlx_tensor::default_device(), Device::Cpu);
    let x = mlx_tensor::ops::arange(0.0, 4.0, 1.0, Dtype::Float32)
        .unwrap()
        .sum(&[0], false)
        .unwrap();
    assert_eq!(x.item::<f32>().unwrap(), 6.0);
    mlx_tensor::synchronize().unwrap();
    assert!(!mlx_tensor::device_name().unwrap().is_empty());
    // A compute capability only where a GPU reports one (CUDA), and then a
    // real one (at least 5.0); never on a build without a GPU.
    let cc = mlx_tensor::gpu_compute_capability().unwrap();
    assert!(
        mlx_tensor::gpu_available() || cc.is_none(),
        "{cc:?} without a GPU"
    );
    assert!(cc.is_none_or(|c| c >= 50), "{cc:?}");
    if mlx_tensor::gpu_available() {
        mlx_tensor::set_default_device(Device::Gpu).unwrap();
        assert_eq!(x.add(&x).unwrap().item::<f32>().unwrap(), 12.0);
        mlx_tensor::set_default_device(Device::Cpu).unwrap();
    }
}

#[test]
fn library_facts() {
    assert_eq!(mlx_tensor::mlx_version(), "0.32.4");
    let blas = mlx_tensor::blas_info();
    let openblas_installed = ["x86_64", "aarch64"].iter().any(|a| {
        std::path::Path::new(&format!(
            "/usr/lib/{a}-linux-gnu/openblas-pthread/libopenblas.so.0"
        ))
        .exists()
    });
    if cfg!(target_os = "linux") && openblas_installed {
        assert!(blas.starts_with("OpenBLAS"), "{blas}");
    }
}

#[test]
fn stream_choice() {
    let default = mlx_tensor::Stream::default_for(Device::Cpu).unwrap();
    assert_eq!(default.device(), Device::Cpu);
    let s = mlx_tensor::Stream::new(Device::Cpu).unwrap();
    assert_ne!(s, default, "a new stream has its own index");
    s.set_default().unwrap();
    assert_eq!(mlx_tensor::Stream::default_for(Device::Cpu).unwrap(), s);
    let x = Array::from_slice(&[1.0f32, 2.0], &[2])
        .unwrap()
        .multiply(&Array::from_f32(3.0).unwrap())
        .unwrap();
    x.async_eval().unwrap();
    s.synchronize().unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), [3.0, 6.0]);
    default.set_default().unwrap();
    assert_eq!(
        mlx_tensor::Stream::default_for(Device::Cpu).unwrap(),
        default
    );
    if !mlx_tensor::gpu_available() {
        assert!(
            mlx_tensor::Stream::new(Device::Gpu).is_err(),
            "no GPU stream on a CPU build"
        );
    }
}

#[test]
fn pending_nodes_counts_each_unevaluated_node_once() {
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    // Host data has no producer: nothing to run.
    assert_eq!(x.pending_nodes(), 0);
    let e = x.exp().unwrap();
    // e is used twice below but is one node: add(e, e), then multiply by e.
    let y = e.add(&e).unwrap().multiply(&e).unwrap();
    assert_eq!(y.pending_nodes(), 3);
    e.eval().unwrap();
    // Evaluating e detaches it: only add and multiply remain.
    assert_eq!(y.pending_nodes(), 2);
    y.eval().unwrap();
    assert_eq!(y.pending_nodes(), 0);
}
