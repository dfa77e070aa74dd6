//! A short soak (the `soak` example on 1,500 tokens): chat turns with MTP
//! speculation and a prefix cache in one process keep MLX active memory and
//! RSS flat after the warm-up cycle, and leave no pinned arrays.
//!
//! Greedy decoding makes every conversation cycle repeat the first, so after
//! the warm-up (two cycles, and until the 1 MiB prefix cache first evicts)
//! no cache needs to grow past its working size: the tolerances only absorb
//! allocator noise. The fixture's weights and caches are ~2.5 MiB, so a leak
//! of one 256-byte hidden row per token (~170 KiB over the ~700 post-warm-up
//! tokens) exceeds the 128 KiB active-memory tolerance.
// The figures are reported on stderr (`-- --nocapture` shows them).
#![allow(clippy::print_stderr)]

#[allow(dead_code)]
#[path = "../../examples/soak.rs"]
mod example;

use crate::common;
use runner::LoadOptions;
use runner::testing::{Arch, Fixture, write_checkpoint};

/// Allowed growth of MLX active memory after the warm-up.
const ACTIVE_TOLERANCE: i64 = 128 << 10;
/// Allowed growth of the process RSS after the warm-up (the allocator and
/// MLX's buffer cache move in larger steps than MLX's own accounting).
const RSS_TOLERANCE: i64 = 4 << 20;

#[test]
fn memory_is_flat_after_warm_up_and_no_pins_leak() {
    // MLX's memory figures are per process.
    common::own_process(
        "soak::memory_is_flat_after_warm_up_and_no_pins_leak",
        memory_is_flat_after_warm_up_and_no_pins_leak_alone,
    );
}

fn memory_is_flat_after_warm_up_and_no_pins_leak_alone() {
    let o = example::SoakOptions {
        tokens: 1_500,
        turn_tokens: 48,
        cycle_tokens: 300,
        // A dozen of the fixture's entries: full (evicting) within ~15 turns.
        prefix_cache_mib: 1,
        warmup_cycles: 2,
        temperature: 0.0,
        // Random MTP weights are rarely accepted: a fixed depth drafts anyway.
        depth: Some(3),
        ..example::SoakOptions::default()
    };
    // A random-weight Qwen3 with an MTP head (fast, and needs no model files).
    let fx = Fixture {
        mtp: true,
        ..Fixture::new(Arch::Qwen3)
    };
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &fx, 5).unwrap();
    let m = runner::load(dir.path(), LoadOptions::default(), |_, _| {}).unwrap();
    let s = example::run(&m, &o).unwrap();
    let mib = |b: i64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "soak: {} tokens, {} turns, {} resets, warm-up {} turns; active warm {:.2} MiB, end {:.2} MiB, \
         growth {:.3} MiB; RSS warm {:.1} MiB, end {:.1} MiB, growth {:.2} MiB; acceptance {:.2}",
        s.tokens,
        s.turns,
        s.resets,
        s.warmup_turns,
        mib(s.active_warm_bytes as i64),
        mib(s.active_end_bytes as i64),
        mib(s.active_max_growth_bytes),
        mib(s.rss_warm_bytes as i64),
        mib(s.rss_end_bytes as i64),
        mib(s.rss_max_growth_bytes),
        s.acceptance_rate
    );
    assert_eq!(s.tokens, 1_500);
    assert!(s.resets >= 4, "only {} cycles", s.resets);
    assert!(
        s.turns > s.warmup_turns + 10,
        "{} turns, {} in the warm-up",
        s.turns,
        s.warmup_turns
    );
    assert!(s.drafted > s.tokens, "only {} draft tokens", s.drafted);
    assert!(
        s.active_max_growth_bytes <= ACTIVE_TOLERANCE,
        "MLX active memory grew {} B after the warm-up (tolerance {ACTIVE_TOLERANCE} B)",
        s.active_max_growth_bytes
    );
    assert!(
        s.rss_max_growth_bytes <= RSS_TOLERANCE,
        "RSS grew {} B after the warm-up (tolerance {RSS_TOLERANCE} B)",
        s.rss_max_growth_bytes
    );
    assert!(s.rss_end_bytes > 0, "no /proc/self/statm");
    // Between turns only the prefix cache's entries hold pins, as many after
    // the warm-up as during it; none once the conversation is gone.
    assert!(
        s.pins_max_growth <= 0,
        "pins between turns grew by {} after the warm-up",
        s.pins_max_growth
    );
    assert_eq!(s.live_pins, 0, "pins alive after the conversation");
}
