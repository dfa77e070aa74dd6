//! Every family loads a generated checkpoint (tied and untied) and greedy-generates.

use crate::common;
use crate::common::Generate;

use runner::SamplingOptions as Options;
use runner::testing::{Arch, Fixture};
use runner::{FinishReason, GenerateOptions, Session};

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling: Options::greedy(),
        ..GenerateOptions::default()
    }
}

fn check(arch: Arch, tied: bool) {
    let fx = Fixture {
        tied,
        ..Fixture::new(arch)
    };
    let dir = common::write(&fx, 11);
    let m = common::load(dir.path());
    assert_eq!(m.info.architecture, fx.config_json()["architectures"][0]);
    let prompt = m.tokenizer.encode("hello world", false).unwrap();
    let mut s = Session::new(m.model.as_ref());
    let g = s.run(&m.tokenizer, &prompt, &greedy(12)).unwrap();
    let n = g.stats.generated_tokens;
    assert!((1..=12).contains(&n), "{arch:?} tied={tied}: generated {n}");
    if g.finish == FinishReason::Length {
        assert_eq!(n, 12);
    }
    // Greedy is deterministic: a second session gives the same tokens.
    let mut s2 = Session::new(m.model.as_ref());
    let g2 = s2.run(&m.tokenizer, &prompt, &greedy(12)).unwrap();
    assert_eq!(g.token_ids, g2.token_ids, "{arch:?} tied={tied}");
    assert_eq!(s.offset(), s.committed().len());
    assert_eq!(&s.committed()[..prompt.len()], &prompt[..]);
}

#[test]
fn every_family_tied_and_untied_generates() {
    for arch in Arch::ALL {
        for tied in [false, true] {
            check(arch, tied);
        }
    }
}

#[test]
fn bf16_checkpoint_is_upcast_and_its_mtp_head_loads() {
    let fx = Fixture {
        dtype: mlx_tensor::Dtype::Bfloat16,
        mtp: true,
        ..Fixture::new(Arch::Qwen3)
    };
    let dir = common::write(&fx, 3);
    let info = runner::inspect(dir.path()).unwrap();
    assert!(info.mtp_head);
    assert_eq!(info.dtypes.keys().collect::<Vec<_>>(), vec!["BF16"]);
    let m = common::load(dir.path());
    assert!(m.info.mtp_head);
    assert_eq!(m.info.mtp_layers_declared, 1);
    let ids = mlx_tensor::Array::from_slice(&[1u32, 2, 3], &[3]).unwrap();
    let mut caches = m.model.new_caches();
    let h = m.model.forward(&ids, &mut caches).unwrap();
    assert_eq!(h.dtype(), mlx_tensor::Dtype::Float32);
    assert_eq!(h.shape().to_vec(), vec![3, 64]);
    // The head is upcast with the trunk and handed out with empty draft caches.
    let head = m.model.mtp_head().expect("a complete mtp.* head loads");
    assert_eq!(head.cache_offset(), Some(0));
}
