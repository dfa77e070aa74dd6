//! Per-thread on/off switches for measurement (kernels, profiling): set
//! explicitly on a thread, else read once per thread from an environment
//! variable, where `1` turns the switch on and `0` off; unset leaves the
//! switch's default, and any other value keeps it with a warning naming the
//! variable.

use std::cell::Cell;
use std::thread::LocalKey;

/// The storage of one switch (`None` until set or read), declared by each
/// user in its own `thread_local!`.
pub(crate) type Flag = Cell<Option<bool>>;

/// The switch's value on this thread: what [`set`] stored, else `var`'s
/// (`1` on, `0` off), else `default` (remembered for the thread's later calls).
pub(crate) fn get(key: &'static LocalKey<Flag>, var: &str, default: bool) -> bool {
    get_parsed(key, var, |raw| value(raw, default), default, "0 or 1")
}

/// A switch's value from its variable: `1` on, `0` off, unset the default;
/// `None` for any other value (the caller warns and keeps the default).
fn value(raw: Option<&str>, default: bool) -> Option<bool> {
    match raw {
        None => Some(default),
        Some("1") => Some(true),
        Some("0") => Some(false),
        Some(_) => None,
    }
}

/// Sets the switch on this thread, over its environment variable.
pub(crate) fn set(key: &'static LocalKey<Flag>, on: bool) {
    key.with(|c| c.set(Some(on)));
}

/// A per-thread setting (an on/off switch through [`get`], a size, a
/// count): what was set on this thread, else `var` through `parse` (given
/// `None` when unset), else `default` with a warning that names the
/// variable and says `wants`; remembered for the thread's later calls.
pub(crate) fn get_parsed<T: Copy + 'static>(
    key: &'static LocalKey<Cell<Option<T>>>,
    var: &str,
    parse: impl Fn(Option<&str>) -> Option<T>,
    default: T,
    wants: &str,
) -> T {
    key.with(|c| {
        if let Some(v) = c.get() {
            return v;
        }
        let raw = std::env::var(var).ok();
        let v = parse(raw.as_deref()).unwrap_or_else(|| {
            tracing::warn!(
                variable = var,
                value = raw.as_deref().unwrap_or_default(),
                "not {wants}: the setting keeps its default"
            );
            default
        });
        c.set(Some(v));
        v
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static PROBE: Flag = const { Cell::new(None) };
    }

    #[test]
    fn a_variable_is_one_zero_or_unset_and_anything_else_is_refused() {
        assert_eq!(value(None, true), Some(true));
        assert_eq!(value(None, false), Some(false));
        assert_eq!(value(Some("1"), false), Some(true));
        assert_eq!(value(Some("0"), true), Some(false));
        assert_eq!(value(Some("off"), true), None);
        assert_eq!(value(Some(""), false), None);
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

    thread_local! {
        static SIZE: Cell<Option<u32>> = const { Cell::new(None) };
    }

    #[test]
    fn a_parsed_setting_takes_its_default_when_unset_and_keeps_what_was_set() {
        fn parse(raw: Option<&str>) -> Option<u32> {
            raw.map_or(Some(7), |s| s.parse().ok())
        }
        let read = || get_parsed(&SIZE, "MTP_SWITCH_TEST_NEVER_SET", parse, 9, "a count");
        assert_eq!(read(), 7);
        SIZE.with(|c| c.set(Some(3)));
        assert_eq!(read(), 3);
        assert_eq!(parse(Some("x")), None);
    }
}
