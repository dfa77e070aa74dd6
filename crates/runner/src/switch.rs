//! Per-thread on/off switches for measurement (kernels, profiling): set
//! explicitly on a thread, else read once per thread from an environment
//! variable, where `1` turns the switch on.

use std::cell::Cell;
use std::thread::LocalKey;

/// The storage of one switch (`None` until set or read), declared by each
/// user in its own `thread_local!`.
pub(crate) type Flag = Cell<Option<bool>>;

/// The switch's value on this thread: what [`set`] stored, else whether
/// `var` is `1` (remembered for the thread's later calls).
pub(crate) fn get(key: &'static LocalKey<Flag>, var: &str) -> bool {
    key.with(|c| match c.get() {
        Some(v) => v,
        None => {
            let v = std::env::var(var).is_ok_and(|s| s == "1");
            c.set(Some(v));
            v
        }
    })
}

/// Sets the switch on this thread, over its environment variable.
pub(crate) fn set(key: &'static LocalKey<Flag>, on: bool) {
    key.with(|c| c.set(Some(on)));
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static PROBE: Flag = const { Cell::new(None) };
    }

    #[test]
    fn set_wins_over_the_environment_and_is_per_thread() {
        // The variable is never set in the test environment: off by default.
        assert!(!get(&PROBE, "MTP_SWITCH_TEST_NEVER_SET"));
        set(&PROBE, true);
        assert!(get(&PROBE, "MTP_SWITCH_TEST_NEVER_SET"));
        let other = std::thread::spawn(|| get(&PROBE, "MTP_SWITCH_TEST_NEVER_SET"));
        assert!(!other.join().unwrap());
    }
}
