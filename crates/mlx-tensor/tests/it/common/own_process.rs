//! Running one test alone in a child process of its test binary; shared by
//! the mlx-tensor and runner test binaries (runner includes this file by path).

/// Runs `body` in a child process of this test binary, alone (for tests
/// that measure process-wide state, such as MLX's memory figures, which the
/// other tests of the one test binary would disturb). `test` is the test's
/// path (`module::name`); the child runs exactly that test and `body` there.
pub(crate) fn own_process(test: &str, body: impl FnOnce()) {
    const CHILD: &str = "MTP_TEST_OWN_PROCESS";
    if std::env::var_os(CHILD).is_some() {
        body();
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .expect("the test binary runs again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{test} in its own process: {}\n{stdout}\n{stderr}",
        out.status
    );
}
