//! Thin wrappers over the Python scripts in `xtask/train/` (training and the reference check).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Result, bail};

use crate::cmd;

/// The interpreter: `$MTP_PYTHON`, else the venv made by `cargo xtask setup --python`, else `python3`.
pub(crate) fn interpreter() -> PathBuf {
    if let Some(p) = std::env::var_os("MTP_PYTHON") {
        return p.into();
    }
    let venv = crate::setup::venv_dir().join("bin/python3");
    if venv.is_file() {
        venv
    } else {
        "python3".into()
    }
}

/// Runs `xtask/train/<script>` with `args` passed through unchanged.
pub(crate) fn run_script(script: &str, args: &[String]) -> Result<()> {
    let path = cmd::root().join("xtask/train").join(script);
    if !path.is_file() {
        bail!(
            "{} is missing: this checkout has no {script}",
            path.display()
        );
    }
    let mut c = Command::new(interpreter());
    c.current_dir(cmd::root()).arg(&path).args(args);
    cmd::run(script, &mut c)
}

/// A Python that can `import mlx_lm`: `$MTP_PYTHON`, the setup venv, `/work/venvs/mlx`, or `python3`.
pub(crate) fn mlx_lm_interpreter() -> Option<PathBuf> {
    let mut candidates = vec![interpreter()];
    candidates.push(PathBuf::from("/work/venvs/mlx/bin/python"));
    candidates.into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import mlx_lm"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}
