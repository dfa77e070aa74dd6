//! Random numbers from explicit keys: reproducible per key, independent across split keys, right distributions.
//!
//! Statistical checks use fixed seeds, state their sample size and significance,
//! and each has a control that must fail the same check.

use mlx_tensor::{Array, Dtype, random};

fn bits(a: &Array) -> Vec<u32> {
    a.as_type(Dtype::Float32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

#[test]
fn keys_are_reproducible_and_split_deterministically() {
    let k1 = random::key(42).unwrap();
    assert_eq!(k1.shape().as_slice(), &[2]);
    assert_eq!(k1.dtype(), Dtype::Uint32);
    assert_eq!(
        k1.to_vec::<u32>().unwrap(),
        random::key(42).unwrap().to_vec::<u32>().unwrap()
    );
    assert_ne!(
        k1.to_vec::<u32>().unwrap(),
        random::key(43).unwrap().to_vec::<u32>().unwrap()
    );

    let keys = random::split(&k1, 3).unwrap();
    assert_eq!(keys.shape().as_slice(), &[3, 2]);
    let again = random::split(&k1, 3).unwrap();
    assert_eq!(
        keys.to_vec::<u32>().unwrap(),
        again.to_vec::<u32>().unwrap()
    );
    let rows: Vec<Vec<u32>> = keys
        .to_vec::<u32>()
        .unwrap()
        .chunks(2)
        .map(<[u32]>::to_vec)
        .collect();
    assert!(
        rows[0] != rows[1] && rows[1] != rows[2] && rows[0] != rows[2],
        "{rows:?}"
    );

    let (a, b) = random::split2(&k1).unwrap();
    let two = random::split(&k1, 2).unwrap().to_vec::<u32>().unwrap();
    assert_eq!(a.to_vec::<u32>().unwrap(), two[..2]);
    assert_eq!(b.to_vec::<u32>().unwrap(), two[2..]);
}

#[test]
fn draws_are_reproducible_per_key() {
    let k = random::key(7).unwrap();
    let other = random::key(8).unwrap();
    let logits = Array::from_slice(&[0.0f32, 1.0, 2.0, 3.0], &[1, 4])
        .unwrap()
        .broadcast_to(&[64, 4])
        .unwrap();
    let p = mlx_tensor::ops::full(&[64], 0.5, Dtype::Float32).unwrap();
    type Draw = fn(&Array, &Array, &Array) -> Array;
    let draws: [(&str, Draw); 4] = [
        ("uniform", |_, _, k| {
            random::uniform(&[64], Dtype::Float32, k).unwrap()
        }),
        ("normal", |_, _, k| {
            random::normal(&[64], Dtype::Float32, k).unwrap()
        }),
        ("bernoulli", |_, p, k| random::bernoulli(p, k).unwrap()),
        ("categorical", |l, _, k| {
            random::categorical(l, -1, k).unwrap()
        }),
    ];
    for (name, draw) in draws {
        let first = bits(&draw(&logits, &p, &k));
        assert_eq!(
            first,
            bits(&draw(&logits, &p, &k)),
            "{name}: same key, same draw"
        );
        assert_ne!(
            first,
            bits(&draw(&logits, &p, &other)),
            "{name}: other key, other draw"
        );
    }
}

#[test]
fn uniform_is_in_range_with_the_right_mean() {
    // n = 20000, seed 1: the mean of U[0,1) has sd sqrt(1/12/n) = 0.00204; accept within 5 sd (p ≈ 6e-7).
    let n = 20_000;
    let sd = (1.0 / 12.0 / n as f64).sqrt();
    let check = |xs: &[f32], want: f64| {
        (xs.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64 - want).abs() < 5.0 * sd
    };
    let xs: Vec<f32> = random::uniform(&[n], Dtype::Float32, &random::key(1).unwrap())
        .unwrap()
        .to_vec()
        .unwrap();
    assert!(xs.iter().all(|v| (0.0..1.0).contains(v)));
    assert!(check(&xs, 0.5), "uniform mean off");
    // Control: squared uniforms (mean 1/3) must fail the same check.
    let sq: Vec<f32> = xs.iter().map(|v| v * v).collect();
    assert!(
        !check(&sq, 0.5),
        "control passed: the check cannot tell distributions apart"
    );
}

#[test]
fn bernoulli_rate_matches_p() {
    // n = 20000, seed 2, p = 0.3: the rate has sd sqrt(p(1-p)/n) = 0.00324; accept within 5 sd (p ≈ 6e-7).
    let n = 20_000;
    let rate = |p: f32| {
        let probs = mlx_tensor::ops::full(&[n], p, Dtype::Float32).unwrap();
        let draws: Vec<bool> = random::bernoulli(&probs, &random::key(2).unwrap())
            .unwrap()
            .to_vec()
            .unwrap();
        draws.iter().filter(|&&b| b).count() as f64 / n as f64
    };
    let sd = (0.3 * 0.7 / n as f64).sqrt();
    assert!((rate(0.3) - 0.3).abs() < 5.0 * sd, "rate {}", rate(0.3));
    // Control: p = 0.35 must be told apart from 0.3.
    assert!((rate(0.35) - 0.3).abs() >= 5.0 * sd, "control passed");
}

#[test]
fn categorical_frequencies_match_softmax() {
    // n = 20000 draws, seed 3; Pearson chi-square with 2 degrees of freedom,
    // critical value 18.42 at significance 1e-4.
    let n = 20_000;
    let probs = [0.1f64, 0.2, 0.7];
    let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    let l = Array::from_slice(&logits, &[3]).unwrap();
    let draws: Vec<u32> = random::categorical_n(&l, 0, n, &random::key(3).unwrap())
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(draws.len(), n as usize);
    let mut counts = [0f64; 3];
    for d in draws {
        counts[d as usize] += 1.0;
    }
    let chi2 = |expected: &[f64]| {
        counts
            .iter()
            .zip(expected)
            .map(|(c, p)| (c - p * n as f64).powi(2) / (p * n as f64))
            .sum::<f64>()
    };
    assert!(
        chi2(&probs) < 18.42,
        "chi2 {} counts {counts:?}",
        chi2(&probs)
    );
    // Control: the reversed distribution must be rejected.
    assert!(chi2(&[0.7, 0.2, 0.1]) >= 18.42, "control passed");
    // One draw per row over a batch: shape drops the axis.
    let batch = Array::from_slice(&[0.0f32, 50.0, 0.0, 50.0, 0.0, 0.0], &[2, 3]).unwrap();
    let picks: Vec<u32> = random::categorical(&batch, -1, &random::key(4).unwrap())
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(picks, [1, 0], "peaked rows pick their peak");
}
