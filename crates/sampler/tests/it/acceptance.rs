//! Speculative acceptance with deterministic outcomes (one-hot and
//! zero-probability rows, where every key gives the same answer), its lazy
//! accessors and errors, seeded reproducibility, and `sample_next`.

use crate::support;

use mlx_tensor::{Array, random};
use sampler::{
    Distribution, Error, History, KeyStream, NO_TOKEN, Options, Result, accept_batch, accept_chain,
    sample_next,
};
use support::{Rng, dist};

const V: usize = 6;

fn one_hot(t: u32) -> Vec<f64> {
    let mut r = vec![0.0; V];
    r[t as usize] = 1.0;
    r
}

/// Greedy target rows with argmax `targets` (built through the real logits
/// pipeline at temperature 0) and a greedy drafter that proposed `drafted`.
fn greedy_round(targets: &[u32], drafted: &[u32]) -> Result<(Distribution, Distribution, Array)> {
    let logits: Vec<f32> = targets
        .iter()
        .flat_map(|&t| (0..V as u32).map(move |i| if i == t { 3.0 } else { -1.0 }))
        .collect();
    let logits = Array::from_slice(&logits, &[targets.len() as i32, V as i32])?;
    let target =
        Distribution::from_logits(&logits, &Options::greedy(), &History::new(64), drafted)?;
    let draft = dist(&drafted.iter().map(|&t| one_hot(t)).collect::<Vec<_>>())?;
    let tokens = Array::from_slice(drafted, &[drafted.len() as i32])?;
    Ok((target, draft, tokens))
}

/// Greedy acceptance of `drafted` against target argmaxes `targets`
/// (`k + 1` of them) must emit `expected`, under several keys.
#[track_caller]
fn check(targets: &[u32], drafted: &[u32], expected: &[u32]) {
    let (one_hot, draft, tokens) = greedy_round(targets, drafted).expect("inputs build");
    assert!(one_hot.is_one_hot());
    // The same rows without the one-hot mark take the general (random) path.
    let general = Distribution::from_probs(one_hot.probs()).expect("rows");
    for (seed, target) in [(0, &one_hot), (1, &one_hot), (0, &general), (99, &general)] {
        let key = random::key(seed).expect("key");
        let acc = accept_chain(target, &draft, &tokens, &key).expect("acceptance builds");
        let emitted = acc.read_emitted().expect("read");
        assert_eq!(
            emitted, expected,
            "targets {targets:?}, drafts {drafted:?}, seed {seed}"
        );
        let (accepted, next) = acc.read().expect("read");
        assert_eq!(accepted, expected.len() - 1);
        assert_eq!(next, *expected.last().unwrap());
        // A host copy of the packed array, read as a caller that evaluates it
        // with other arrays does, decodes to the same tokens.
        let packed = acc.packed().to_vec::<u32>().expect("read packed");
        assert_eq!(acc.emitted_from(&packed), expected, "from the packed row");
    }
}

#[test]
fn greedy_chains_accept_the_matching_prefix() {
    // Full accept, then the bonus row's argmax.
    check(&[1, 2, 3], &[1, 2], &[1, 2, 3]);
    check(&[4, 0], &[4], &[4, 0]);
    // A rejection at each position: the target's own token replaces the draft.
    check(&[1, 2, 3, 5], &[0, 2, 3], &[1]);
    check(&[1, 2, 3, 5], &[1, 0, 3], &[1, 2]);
    check(&[1, 2, 3, 5], &[1, 2, 0], &[1, 2, 3]);
    check(&[1, 2, 3, 5], &[1, 2, 3], &[1, 2, 3, 5]);
    // Only the first rejection matters: later matches are not accepted.
    check(&[1, 2, 3, 5], &[0, 2, 3], &[1]);
}

#[test]
fn sure_accepts_and_sure_rejects() -> Result<()> {
    // Draft 0 has p = q (always accepted), draft 1 has p = 0 (always
    // rejected); the residual at row 1 is (0.5 − 0.2, 0.5 − 0.3) / 0.5.
    let target = dist(&[
        vec![0.5, 0.5, 0.0],
        vec![0.5, 0.5, 0.0],
        vec![1.0, 0.0, 0.0],
    ])?;
    let draft = dist(&[vec![0.5, 0.5, 0.0], vec![0.2, 0.3, 0.5]])?;
    let tokens = Array::from_slice(&[1u32, 2], &[2])?;
    let mut seen = [0usize; 3];
    let mut keys = KeyStream::new(3);
    for _ in 0..40 {
        let acc = accept_chain(&target, &draft, &tokens, &keys.next_key()?)?;
        let (accepted, next) = acc.read()?;
        assert_eq!(accepted, 1, "draft 0 is always accepted, draft 1 never");
        seen[next as usize] += 1;
    }
    assert_eq!(seen[2], 0, "the residual has no mass on token 2");
    assert!(
        seen[0] > 0 && seen[1] > 0,
        "both residual tokens appear in 40 draws: {seen:?}"
    );
    Ok(())
}

#[test]
fn a_draft_with_q_zero_but_p_positive_is_accepted() -> Result<()> {
    let target = dist(&[vec![0.0, 1.0], vec![1.0, 0.0]])?;
    let draft = dist(&[vec![1.0, 0.0]])?;
    let acc = accept_chain(
        &target,
        &draft,
        &Array::from_slice(&[1u32], &[1])?,
        &random::key(0)?,
    )?;
    assert_eq!(acc.read()?, (1, 0));
    Ok(())
}

#[test]
fn lazy_accessors_have_the_documented_shapes() -> Result<()> {
    let (target, draft, tokens) = greedy_round(&[1, 2, 3], &[1, 0])?;
    let acc = accept_chain(&target, &draft, &tokens, &random::key(0)?)?;
    assert_eq!(acc.accepted()?.to_vec::<u32>()?, vec![1]);
    assert_eq!(acc.next()?.to_vec::<u32>()?, vec![2]);
    assert_eq!(acc.emitted()?.to_vec::<u32>()?, vec![1, 2, NO_TOKEN]);
    assert_eq!(acc.packed().shape().as_slice(), &[1, 5]);
    Ok(())
}

#[test]
fn a_batch_equals_its_chains_one_by_one() -> Result<()> {
    let cases: [(&[u32], &[u32]); 3] = [
        (&[1, 2, 3], &[1, 2]),
        (&[4, 4, 4], &[4, 0]),
        (&[0, 5, 1], &[3, 5]),
    ];
    let mut targets = Vec::new();
    let mut drafts = Vec::new();
    let mut tokens = Vec::new();
    let mut expected = Vec::new();
    for (t, d) in cases {
        let (target, draft, tok) = greedy_round(t, d)?;
        expected.push(accept_chain(&target, &draft, &tok, &random::key(1)?)?.read_emitted()?);
        targets.push(target);
        drafts.push(draft);
        tokens.extend_from_slice(d);
    }
    let batch = accept_batch(
        &Distribution::concatenate(&targets)?,
        &Distribution::concatenate(&drafts)?,
        &Array::from_slice(&tokens, &[3, 2])?,
        &random::key(2)?,
    )?;
    assert_eq!((batch.batch(), batch.k()), (3, 2));
    let out = batch.read()?;
    for (b, e) in expected.iter().enumerate() {
        assert_eq!(out.chain(b), e.as_slice(), "chain {b}");
    }
    assert_eq!(out.accepted, vec![2, 1, 0]);
    assert_eq!(out.emitted[3..6], [4, 4, NO_TOKEN]);
    assert_eq!(batch.accepted()?.to_vec::<u32>()?, out.accepted);
    assert_eq!(batch.next()?.to_vec::<u32>()?, out.next);
    Ok(())
}

#[test]
fn mismatched_inputs_are_errors() -> Result<()> {
    let (target, draft, tokens) = greedy_round(&[1, 2, 3], &[1, 2])?;
    let key = random::key(0)?;
    let short = target.slice_rows(0, 2)?;
    let err = accept_chain(&short, &draft, &tokens, &key).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Mismatch {
                left: 2,
                right: 3,
                ..
            }
        ),
        "{err:?}"
    );
    let err = accept_chain(&target, &draft.slice_rows(0, 1)?, &tokens, &key).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Mismatch {
                left: 1,
                right: 2,
                ..
            }
        ),
        "{err:?}"
    );
    let wide = dist(&[vec![0.5; 2], vec![0.5; 2]])?;
    let err = accept_chain(&target, &wide, &tokens, &key).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Mismatch {
                left: 6,
                right: 2,
                ..
            }
        ),
        "{err:?}"
    );
    let err = accept_chain(&target, &draft, &tokens.reshape(&[1, 2])?, &key).unwrap_err();
    assert!(matches!(err, Error::Shape { .. }), "{err:?}");
    let none = Array::from_slice::<u32>(&[], &[0])?;
    let err = accept_chain(&target.slice_rows(0, 1)?, &draft, &none, &key).unwrap_err();
    assert!(err.to_string().contains("no drafts"), "{err}");
    Ok(())
}

/// One batch of random chains (V = 12, k = 3) accepted with `seed`.
fn random_batch(seed: u64) -> Result<Vec<u32>> {
    let (b, k, v) = (500usize, 3usize, 12usize);
    let mut rng = Rng::new(11);
    let p: Vec<Vec<f64>> = (0..b * (k + 1)).map(|_| rng.distribution(v, 0.2)).collect();
    let q: Vec<Vec<f64>> = (0..b * k).map(|_| rng.distribution(v, 0.2)).collect();
    let (target, draft) = (dist(&p)?, dist(&q)?);
    let mut keys = KeyStream::new(seed);
    let drafted = draft
        .sample(&keys.next_key()?)?
        .reshape(&[b as i32, k as i32])?;
    Ok(accept_batch(&target, &draft, &drafted, &keys.next_key()?)?
        .read()?
        .emitted)
}

#[test]
fn seeded_acceptance_is_reproducible() -> Result<()> {
    let a = random_batch(7)?;
    assert_eq!(a, random_batch(7)?, "same seed, same outcome");
    let c = random_batch(8)?;
    let differing = a.iter().zip(&c).filter(|(x, y)| x != y).count();
    assert!(
        differing > 100,
        "seeds 7 and 8 differ in only {differing} of {} slots",
        a.len()
    );
    Ok(())
}

#[test]
fn sample_next_greedy_takes_the_penalised_argmax() -> Result<()> {
    let logits = Array::from_slice(&[1.0f32, 3.0, 2.5, 0.0], &[1, 4])?;
    let mut h = History::new(64);
    let key = random::key(0)?;
    let greedy = Options::greedy();
    let t = sample_next(&logits, &greedy, &h, &key)?;
    assert_eq!(t.shape().as_slice(), &[1]);
    assert_eq!(t.to_vec::<u32>()?, vec![1]);
    h.commit(&[1]);
    let penalised = Options {
        presence_penalty: 1.0,
        ..greedy
    };
    assert_eq!(
        sample_next(&logits, &penalised, &h, &key)?.to_vec::<u32>()?,
        vec![2]
    );
    Ok(())
}

#[test]
fn sample_next_matches_the_distribution_draw() -> Result<()> {
    let logits = Array::from_slice(&[0.1f32, 0.3, 0.2, 0.25, 0.15], &[1, 5])?;
    let opts = Options {
        top_k: 4,
        ..Options::default()
    };
    let h = History::new(64);
    let mut keys = KeyStream::new(21);
    for _ in 0..5 {
        let key = keys.next_key()?;
        let a = sample_next(&logits, &opts, &h, &key)?.to_vec::<u32>()?;
        let b = Distribution::from_logits(&logits, &opts, &h, &[])?
            .sample(&key)?
            .to_vec::<u32>()?;
        assert_eq!(a, b);
    }
    let two_rows = Array::from_slice(&[0.0f32; 4], &[2, 2])?;
    let err = sample_next(&two_rows, &opts, &h, &keys.next_key()?).unwrap_err();
    assert!(err.to_string().contains("one row"), "{err}");
    let scalar = Array::from_f32(1.0)?;
    assert!(sample_next(&scalar, &opts, &h, &keys.next_key()?).is_err());
    Ok(())
}
