//! Lets this crate's tests and binaries find libmlx.so at run time: cargo does
//! not pass a library's link arguments on to its dependents, so each crate that
//! links MLX adds the rpath that mlx-tensor's build script exported.
fn main() {
    if let Ok(dir) = std::env::var("DEP_MLX_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
