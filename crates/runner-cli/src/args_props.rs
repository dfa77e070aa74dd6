//! Property tests of option parsing: any command line parses to options or
//! a clap error, and the checks after parsing never panic either.

use clap::{CommandFactory, Parser};
use proptest::prelude::*;

use crate::args::{Cli, Command};

/// Flags of `generate` and `chat`, valid and not.
const FLAGS: &[&str] = &[
    "generate",
    "chat",
    "info",
    "quantize",
    "--model",
    "-m",
    "--prompt",
    "-p",
    "--max-tokens",
    "-n",
    "--temperature",
    "-t",
    "--top-k",
    "--top-p",
    "--min-p",
    "--repeat-penalty",
    "--repeat-last-n",
    "--presence-penalty",
    "--frequency-penalty",
    "--seed",
    "--stop",
    "--device",
    "--dtype",
    "--speculative",
    "--draft-model",
    "--draft-tokens",
    "--chat",
    "--system",
    "--json",
    "--script",
    "--prefix-cache-mib",
    "--verbose",
    "-v",
    "--help",
    "--version",
    "--bits",
    "--group-size",
    "--out",
    "--bogus",
    "--",
    "-",
];

/// Values, including the edges of every numeric type.
const VALUES: &[&str] = &[
    "0",
    "1",
    "-1",
    "0.5",
    "-0.0",
    "1e40",
    "NaN",
    "inf",
    "-inf",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "17592186044416",
    "auto",
    "off",
    "mtp",
    "draft-model",
    "ngram",
    "cpu",
    "gpu",
    "f32",
    "bf16",
    "f8",
    "",
    " ",
    "\\n",
    "/nonexistent",
    "héllo",
    "\u{0}",
    "99",
];

fn arg() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(FLAGS).prop_map(str::to_owned),
        4 => prop::sample::select(VALUES).prop_map(str::to_owned),
        1 => "\\PC{0,12}",
    ]
}

#[test]
fn the_command_definition_is_consistent() {
    Cli::command().debug_assert();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Parsing and the pre-load checks return `Ok` or an error, never panic.
    #[test]
    fn any_command_line_parses_or_fails_cleanly(
        sub in prop::sample::select(&["generate", "chat", "info", "quantize", "serve"][..]),
        with_model in any::<bool>(),
        rest in prop::collection::vec(arg(), 0..12),
    ) {
        // Half the lines name a model, so most of them get past clap.
        let model = if with_model { vec!["--model".to_owned(), "/nonexistent".to_owned()] } else { vec![] };
        let argv = ["mtp-runner".to_owned(), sub.to_owned()]
            .into_iter()
            .chain(model)
            .chain(rest);
        if let Ok(cli) = Cli::try_parse_from(argv) {
            match cli.command {
                Command::Generate(a) => {
                    let _ = crate::validate::decode_args(&a.decode);
                }
                Command::Chat(a) => {
                    let _ = crate::validate::decode_args(&a.decode);
                    let _ = crate::validate::prefix_cache_bytes(a.prefix_cache_mib);
                }
                Command::Serve(a) => {
                    let _ = crate::validate::decode_args(&a.decode);
                    let _ = crate::validate::prefix_cache_bytes(a.prefix_cache_mib);
                }
                Command::Info(_) | Command::Quantize(_) => {}
            }
        }
    }

    /// Any bytes are text or a usage error that names the offset.
    #[test]
    fn any_bytes_are_utf8_or_a_named_error(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        match crate::validate::utf8(bytes.clone(), "the prompt") {
            Ok(s) => prop_assert_eq!(s.as_bytes(), &bytes[..]),
            Err(e) => {
                let at = std::str::from_utf8(&bytes).unwrap_err().valid_up_to();
                let msg = e.to_string();
                prop_assert!(msg.contains(&format!("offset {at}")), "{}", msg);
            }
        }
    }
}
