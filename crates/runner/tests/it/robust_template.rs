//! Chat templates come from model files: a hostile or broken one ends in an
//! error naming the cause (fuel, output limit, no file access), never a
//! hang, a crash or an unbounded string.

use runner::Message;
use runner::testing::{MAX_MEMORY, MAX_OUTPUT, render_template};

/// As in `mtp-runner`: rendering is bounded in memory only under the counting allocator.
#[global_allocator]
static ALLOC: mlx_tensor::budget::Counting = mlx_tensor::budget::Counting;

/// Renders `template` over one user message and expects an error mentioning
/// each of `expected`.
fn check(template: &str, expected: &[&str]) {
    let msgs = [Message::new("user", "hi")];
    let e = match render_template(template, &msgs, true, "<s>", "</s>") {
        Ok(out) => panic!(
            "`{template}` rendered {} bytes, expected an error",
            out.len()
        ),
        Err(e) => e.to_string(),
    };
    for x in expected {
        assert!(
            e.contains(x),
            "`{template}`: error `{e}` should mention `{x}`"
        );
    }
}

#[test]
fn an_endless_loop_runs_out_of_fuel() {
    // range() is capped at 100,000 items, so nest loops: 10^15 iterations.
    check(
        "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}\
         {% endfor %}{% endfor %}{% endfor %}",
        &["chat template", "fuel", "runs too long"],
    );
    // Recursion is bounded too.
    check(
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        &["chat template", "render failed"],
    );
}

#[test]
fn huge_output_stops_at_the_limit() {
    // 100,000 × 1,000 bytes = 100 MB streamed; refused at MAX_OUTPUT (16 MiB).
    check(
        "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
        &["chat template", &MAX_OUTPUT.to_string(), "limit"],
    );
    // One value beyond minijinja's repetition cap.
    check("{{ 'x' * 1000000000 }}", &["chat template", "too large"]);
    // A template just under the limit renders.
    let n = MAX_OUTPUT / 1000 - 1;
    let t = format!("{{% for i in range({n}) %}}{{{{ 'x' * 1000 }}}}{{% endfor %}}");
    let out = render_template(&t, &[], false, "", "").unwrap();
    assert_eq!(out.len(), n * 1000);
}

#[test]
fn no_file_access_include_import_extends() {
    for t in [
        "{% include '/etc/passwd' %}",
        "{% include 'tokenizer_config.json' %}",
        "{% import 'macros.j2' as m %}{{ m.x() }}",
        "{% from 'macros.j2' import x %}{{ x() }}",
        "{% extends 'base.html' %}",
    ] {
        check(t, &["chat template", "without file access"]);
    }
    // Including itself (the one registered template) recurses into the limit.
    check("{% include 'chat' %}", &["chat template", "render failed"]);
}

#[test]
fn raise_exception_and_syntax_errors_are_named() {
    check(
        "{{ raise_exception('only user and assistant roles') }}",
        &["chat template", "only user and assistant roles"],
    );
    check("{% for %}", &["chat template", "does not compile"]);
}

#[test]
fn the_fixture_template_renders() {
    let msgs = [Message::new("system", "s"), Message::new("user", "hi")];
    let out = render_template(runner::testing::CHAT_TEMPLATE, &msgs, true, "", "").unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn values_that_double_in_a_loop_stop_at_the_memory_limit() {
    assert!(mlx_tensor::budget::installed());
    let limit = format!("{} MiB", MAX_MEMORY >> 20);
    for t in [
        // `~` concatenation, `+` on strings, `replace`, and a lazily doubled list
        // joined at the end: each reaches 2^64 bytes in 64 steps of little fuel.
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}\
         {% endfor %}{{ ns.s|length }}",
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}\
         {% endfor %}{{ ns.s|length }}",
        "{% set ns = namespace(s='a') %}{% for i in range(64) %}\
         {% set ns.s = ns.s|replace('a', 'aa') %}{% endfor %}{{ ns.s|length }}",
        "{% set ns = namespace(l=['x']) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}\
         {% endfor %}{{ ns.l|join|length }}",
    ] {
        let t0 = std::time::Instant::now();
        check(t, &["chat template", &limit, "memory", "replace it"]);
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "`{t}` took {:?}",
            t0.elapsed()
        );
    }
    // A render after a stopped one works: the budget is per render.
    let msgs = [Message::new("user", "hi")];
    let out = render_template(runner::testing::CHAT_TEMPLATE, &msgs, false, "", "").unwrap();
    assert!(out.contains("hi"), "{out}");
}
