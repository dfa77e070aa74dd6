//! `Options`: defaults, greedy, and a validation error for each invalid option.

use sampler::{Error, Options};

/// Asserts that `opts` is rejected for option `name`, with a message that
/// names the option and its allowed range.
#[track_caller]
fn check_invalid(opts: Options, name: &str, range: &str) {
    match opts.validate() {
        Err(err @ Error::InvalidOption { name: n, .. }) => {
            assert_eq!(n, name, "wrong option blamed: {err}");
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("`{name}`")),
                "message names the option: {msg}"
            );
            assert!(
                msg.contains(range),
                "message states the range {range:?}: {msg}"
            );
        }
        other => panic!("expected InvalidOption for {name}, got {other:?}"),
    }
}

#[test]
fn defaults_are_valid_and_turn_everything_off() {
    let d = Options::default();
    assert_eq!(d.temperature, 1.0);
    assert_eq!((d.top_k, d.top_p, d.min_p), (0, 1.0, 0.0));
    assert_eq!(d.repeat_last_n, 64);
    assert_eq!(
        (d.repeat_penalty, d.presence_penalty, d.frequency_penalty),
        (1.0, 0.0, 0.0)
    );
    assert_eq!(d.seed, None);
    assert!(d.validate().is_ok());
    assert!(!d.is_greedy());
    assert!(!d.uses_penalties());
}

#[test]
fn greedy_is_temperature_zero() {
    let g = Options::greedy();
    assert!(g.is_greedy());
    assert!(g.validate().is_ok());
    assert_eq!(
        g,
        Options {
            temperature: 0.0,
            ..Options::default()
        }
    );
}

#[test]
fn boundary_values_are_valid() {
    let ok = [
        Options {
            temperature: 0.0,
            ..Options::default()
        },
        Options {
            top_p: 1.0,
            ..Options::default()
        },
        Options {
            top_p: 1e-6,
            ..Options::default()
        },
        Options {
            min_p: 0.0,
            ..Options::default()
        },
        Options {
            min_p: 0.999,
            ..Options::default()
        },
        Options {
            repeat_penalty: 1e-3,
            ..Options::default()
        },
        Options {
            presence_penalty: -2.0,
            frequency_penalty: -2.0,
            ..Options::default()
        },
        Options {
            top_k: usize::MAX,
            repeat_last_n: 0,
            ..Options::default()
        },
    ];
    for o in ok {
        assert!(o.validate().is_ok(), "{o:?} should be valid");
    }
}

#[test]
fn each_invalid_option_is_named_with_its_range() {
    let d = Options::default;
    let temp = ">= 0";
    check_invalid(
        Options {
            temperature: -0.5,
            ..d()
        },
        "temperature",
        temp,
    );
    check_invalid(
        Options {
            temperature: f32::NAN,
            ..d()
        },
        "temperature",
        temp,
    );
    check_invalid(
        Options {
            temperature: f32::INFINITY,
            ..d()
        },
        "temperature",
        temp,
    );
    let top_p = "(0, 1]";
    check_invalid(Options { top_p: 0.0, ..d() }, "top_p", top_p);
    check_invalid(Options { top_p: 1.5, ..d() }, "top_p", top_p);
    check_invalid(Options { top_p: -0.1, ..d() }, "top_p", top_p);
    check_invalid(
        Options {
            top_p: f32::NAN,
            ..d()
        },
        "top_p",
        top_p,
    );
    let min_p = "[0, 1)";
    check_invalid(Options { min_p: -0.1, ..d() }, "min_p", min_p);
    check_invalid(Options { min_p: 1.0, ..d() }, "min_p", min_p);
    check_invalid(
        Options {
            min_p: f32::NAN,
            ..d()
        },
        "min_p",
        min_p,
    );
    let rp = "> 0";
    check_invalid(
        Options {
            repeat_penalty: 0.0,
            ..d()
        },
        "repeat_penalty",
        rp,
    );
    check_invalid(
        Options {
            repeat_penalty: -1.0,
            ..d()
        },
        "repeat_penalty",
        rp,
    );
    check_invalid(
        Options {
            repeat_penalty: f32::NAN,
            ..d()
        },
        "repeat_penalty",
        rp,
    );
    check_invalid(
        Options {
            repeat_penalty: f32::INFINITY,
            ..d()
        },
        "repeat_penalty",
        rp,
    );
    let finite = "a finite number";
    check_invalid(
        Options {
            presence_penalty: f32::NAN,
            ..d()
        },
        "presence_penalty",
        finite,
    );
    check_invalid(
        Options {
            presence_penalty: f32::NEG_INFINITY,
            ..d()
        },
        "presence_penalty",
        finite,
    );
    check_invalid(
        Options {
            frequency_penalty: f32::INFINITY,
            ..d()
        },
        "frequency_penalty",
        finite,
    );
}

#[test]
fn the_error_message_reads_well() {
    let err = Options {
        top_p: 1.5,
        ..Options::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "sampling option `top_p` = 1.5 is invalid: it must be in (0, 1] (1 = off)"
    );
}

#[test]
fn uses_penalties_needs_a_window_and_an_active_penalty() {
    let d = Options::default;
    assert!(
        Options {
            repeat_penalty: 1.1,
            ..d()
        }
        .uses_penalties()
    );
    assert!(
        Options {
            presence_penalty: 0.1,
            ..d()
        }
        .uses_penalties()
    );
    assert!(
        Options {
            frequency_penalty: 0.1,
            ..d()
        }
        .uses_penalties()
    );
    assert!(
        !Options {
            repeat_penalty: 1.1,
            repeat_last_n: 0,
            ..d()
        }
        .uses_penalties()
    );
}
