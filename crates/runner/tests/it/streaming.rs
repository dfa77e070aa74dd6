//! Streaming text: the detokenizer never splits a UTF-8 character; stop strings cut and hold back.

use proptest::prelude::*;
use runner::Tokenizer;
use runner::testing::StreamDetokenizer;
use runner::testing::tokenizer_json;
use runner::testing::{StopMatcher, StopStep};

fn tokenizer() -> Tokenizer {
    let inner = tokenizers::Tokenizer::from_bytes(tokenizer_json().to_string()).unwrap();
    Tokenizer::from_tokenizer(inner, vec![258])
}

/// Streams `text`'s tokens one by one; returns the pieces emitted.
fn stream(tok: &Tokenizer, text: &str) -> Vec<String> {
    let ids = tok.encode(text, false).unwrap();
    let mut d = StreamDetokenizer::new();
    let mut pieces: Vec<String> = ids.iter().map(|&i| d.push(tok, i).unwrap()).collect();
    pieces.push(d.flush(tok).unwrap());
    pieces
}

#[test]
fn multibyte_characters_arrive_whole() {
    let tok = tokenizer();
    for text in [
        "héllo wörld",
        "日本語のテキスト",
        "emoji 🦀🚀 end",
        "a\u{301}b",
        "plain ascii",
    ] {
        let ids = tok.encode(text, false).unwrap();
        // The byte-level fixture has one token per byte, so multi-byte characters span tokens.
        assert_eq!(ids.len(), text.len(), "{text}");
        let pieces = stream(&tok, text);
        assert_eq!(pieces.concat(), text);
        for p in &pieces {
            assert!(
                !p.contains('\u{FFFD}'),
                "{text}: piece {p:?} has a replacement char"
            );
        }
        // A 4-byte character is held for three tokens and released on the fourth.
        if text.contains('🦀') {
            assert!(pieces.iter().any(|p| p == "🦀"), "{pieces:?}");
        }
    }
}

#[test]
fn special_tokens_are_skipped_in_output() {
    let tok = tokenizer();
    let mut ids = tok.encode("ok", false).unwrap();
    ids.push(257);
    let mut d = StreamDetokenizer::new();
    let s: String = ids.iter().map(|&i| d.push(&tok, i).unwrap()).collect();
    assert_eq!(s + &d.flush(&tok).unwrap(), "ok");
}

proptest! {
    /// Any text (without U+FFFD of its own) streams back exactly, with no replacement
    /// characters in any piece.
    #[test]
    fn streaming_round_trips(text in "\\PC{0,40}".prop_filter("no U+FFFD", |t| !t.contains(char::REPLACEMENT_CHARACTER))) {
        let tok = tokenizer();
        let pieces = stream(&tok, &text);
        prop_assert_eq!(pieces.concat(), text);
        for p in &pieces {
            prop_assert!(!p.contains(char::REPLACEMENT_CHARACTER), "piece {:?}", p);
        }
    }

    /// Stop matching over any split of the text equals cutting at the first stop string.
    #[test]
    fn stop_matching_is_split_independent(text in "[ab<>/s]{0,30}", cuts in proptest::collection::vec(0usize..30, 0..6)) {
        let stops = vec!["</s>".to_owned(), "bb".to_owned()];
        let expected = {
            let at = stops.iter().filter_map(|s| text.find(s.as_str())).min();
            at.map_or(text.clone(), |a| text[..a].to_owned())
        };
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(text.len())).collect();
        cuts.push(text.len());
        cuts.sort();
        let mut m = StopMatcher::new(&stops);
        let (mut out, mut prev, mut stopped) = (String::new(), 0, false);
        for c in cuts {
            match m.push(&text[prev..c]) {
                StopStep::Continue(t) => out.push_str(&t),
                StopStep::Stop(t) => { out.push_str(&t); stopped = true; break; }
            }
            prev = c;
        }
        if !stopped { out.push_str(&m.flush()); }
        prop_assert_eq!(out, expected);
    }
}

fn check_stop(stops: &[&str], pushes: &[&str], expected: &[StopStep]) {
    let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
    let mut m = StopMatcher::new(&stops);
    let got: Vec<StopStep> = pushes.iter().map(|p| m.push(p)).collect();
    assert_eq!(got, expected);
}

#[test]
fn stop_strings_hold_back_possible_prefixes() {
    use StopStep::{Continue as C, Stop as S};
    check_stop(
        &["STOP"],
        &["abc", "ST", "OP"],
        &[C("abc".into()), C("".into()), S("".into())],
    );
    check_stop(&["STOP"], &["xS", "Tz"], &[C("x".into()), C("STz".into())]);
    check_stop(
        &["\n\n", "END"],
        &["a\n", "\nb"],
        &[C("a".into()), S("".into())],
    );
    check_stop(
        &[],
        &["any", "thing"],
        &[C("any".into()), C("thing".into())],
    );
    check_stop(
        &["é!"],
        &["caf", "é", "!x"],
        &[C("caf".into()), C("".into()), S("".into())],
    );
}

#[test]
fn chat_template_renders_messages() {
    use runner::Message;
    use runner::testing::render_template;
    let out = render_template(
        runner::testing::CHAT_TEMPLATE,
        &[
            Message::new("system", "be brief"),
            Message::new("user", "hi"),
        ],
        true,
        "",
        "<|im_end|>",
    )
    .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    // Python string methods used by real templates work; raise_exception is an error.
    let t = "{{ messages[0].content.strip().upper() }}{% if messages|length > 1 %}{{ raise_exception('one only') }}{% endif %}";
    assert_eq!(
        render_template(t, &[Message::new("user", " x ")], false, "", "").unwrap(),
        "X"
    );
    let e = render_template(
        t,
        &[Message::new("user", "a"), Message::new("user", "b")],
        false,
        "",
        "",
    );
    assert!(e.unwrap_err().to_string().contains("one only"));
    // A runaway loop runs out of fuel instead of hanging.
    let e = render_template(
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        &[],
        false,
        "",
        "",
    );
    assert!(e.is_err());
}
