//! Per-thread on/off switches for measurement (kernels, profiling): set
//! explicitly on a thread, else read once per thread from an environment
//! variable, where `1` turns the switch on and `0` off; unset (or any other
//! value) leaves the switch's default.

use std::cell::Cell;
use std::thread::LocalKey;

/// The storage of one switch (`None` until set or read), declared by each
/// user in its own `thread_local!`.
pub(crate) type Flag = Cell<Option<bool>>;

/// The switch's value on this thread: what [`set`] stored, else `var`'s
/// (`1` on, `0` off), else `default` (remembered for the thread's later calls).
pub(crate) fn get(key: &'static LocalKey<Flag>, var: &str, default: bool) -> bool {
    key.with(|c| match c.get() {
        Some(v) => v,
        None => {
            let v = match std::env::var(var).as_deref() {
                Ok("1") => true,
                Ok("0") => false,
                _ => default,
            };
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
        // The variable is never set in the test environment: the default rules.
        assert!(!get(&PROBE, "MTP_SWITCH_TEST_NEVER_SET", false));
        set(&PROBE, true);
        assert!(get(&PROBE, "MTP_SWITCH_TEST_NEVER_SET", false));
        let other = std::thread::spawn(|| get(&PROBE, "MTP_SWITCH_TEST_NEVER_SET", false));
        assert!(!other.join().unwrap());
        let on = std::thread::spawn(|| get(&PROBE, "MTP_SWITCH_TEST_NEVER_SET", true));
        assert!(on.join().unwrap());
    }
}
