//! The Qwen3.5 hybrid forward against mlx-lm 0.32.2 on the tiny fixture
//! (`tests/fixtures/make_hybrid_fixture.py`): last-position logits within
//! 1e-3 absolute (f32; the two sum the conv taps and the recurrence in other
//! orders), greedy 64-token continuations equal; chunked prefill equals one
//! pass; broken GDN tensors are load errors that name the tensor.

use crate::writer;

use mlx_tensor::Array;
use runner::Model;

/// Largest accepted |ours − mlx-lm| of a logit.
const LOGIT_TOL: f32 = 1e-3;

fn last_logits(m: &dyn Model, ids: &[u32]) -> Vec<f32> {
    let mut caches = m.new_caches();
    let t = Array::from_slice(ids, &[ids.len() as i32]).unwrap();
    let h = m.forward(&t, &mut caches).unwrap();
    let last = h
        .slice_axis(0, ids.len() as i32 - 1, ids.len() as i32)
        .unwrap();
    m.unembed(&last).unwrap().to_vec::<f32>().unwrap()
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Prefill `ids` in chunks of `chunk`, then `n` greedy tokens one at a time.
fn greedy(m: &dyn Model, ids: &[u32], chunk: usize, n: usize) -> Vec<u32> {
    let mut caches = m.new_caches();
    let mut h = None;
    for part in ids.chunks(chunk) {
        let t = Array::from_slice(part, &[part.len() as i32]).unwrap();
        h = Some(m.forward(&t, &mut caches).unwrap());
    }
    let h = h.unwrap();
    let l = h.dim(0);
    let mut logits = m.unembed(&h.slice_axis(0, l - 1, l).unwrap()).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = argmax(&logits.to_vec::<f32>().unwrap());
        out.push(t);
        let h = m
            .forward(&Array::from_slice(&[t], &[1]).unwrap(), &mut caches)
            .unwrap();
        logits = m.unembed(&h).unwrap();
    }
    out
}

fn ids_of(case: &serde_json::Value) -> Vec<u32> {
    case["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn forward_matches_mlx_lm_logits_and_greedy_continuations() {
    let m = writer::load();
    let reference = writer::reference();
    for case in reference["cases"].as_array().unwrap() {
        let ids = ids_of(case);
        let want: Vec<f32> = case["last_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let got = last_logits(m.model.as_ref(), &ids);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(
            worst <= LOGIT_TOL,
            "prompt {:?}: logits differ by {worst}",
            case["prompt"]
        );
        let cont: Vec<u32> = case["greedy"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let ours = greedy(m.model.as_ref(), &ids, 2048, cont.len());
        assert_eq!(
            ours, cont,
            "prompt {:?}: greedy continuation differs",
            case["prompt"]
        );
    }
}

#[test]
fn chunked_prefill_equals_one_pass() {
    let m = writer::load();
    let case = &writer::reference()["cases"][1];
    let ids = ids_of(case);
    let one = greedy(m.model.as_ref(), &ids, 2048, 16);
    for chunk in [1, 3, 5] {
        assert_eq!(
            greedy(m.model.as_ref(), &ids, chunk, 16),
            one,
            "chunk {chunk}"
        );
    }
}

/// Loading a checkpoint with `edit` applied gives an error whose message names `needle`.
fn check_load_error(edit: impl FnOnce(&mut Vec<(String, Array)>), needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    writer::write_with(dir.path(), edit);
    let err = runner::load(dir.path(), runner::LoadOptions::default(), |_, _| {})
        .expect_err("a broken checkpoint must not load");
    let msg = err.to_string();
    assert!(err.is_bad_input(), "{msg}");
    assert!(
        msg.contains(needle),
        "error `{msg}` does not name `{needle}`"
    );
}

fn replace(tensors: &mut [(String, Array)], name: &str, shape: &[i32]) {
    let n: i32 = shape.iter().product();
    let slot = tensors
        .iter_mut()
        .find(|(n2, _)| n2 == name)
        .expect("tensor in manifest");
    slot.1 = Array::from_slice(&vec![0.5f32; n as usize], shape).unwrap();
}

#[test]
fn wrong_shape_gdn_tensors_are_load_errors_naming_the_tensor() {
    let conv = "model.layers.0.linear_attn.conv1d.weight";
    // mlx-lm's own layout [C, K, 1] is not HF's [C, 1, K].
    check_load_error(|t| replace(t, conv, &[256, 4, 1]), conv);
    let a_log = "model.layers.1.linear_attn.A_log";
    check_load_error(|t| replace(t, a_log, &[8]), a_log);
    let qkv = "model.layers.2.linear_attn.in_proj_qkv.weight";
    check_load_error(|t| replace(t, qkv, &[128, 128]), qkv);
    let gate = "model.layers.3.self_attn.q_proj.weight";
    // An ungated q_proj (Nq·D rows instead of 2·Nq·D).
    check_load_error(|t| replace(t, gate, &[128, 128]), gate);
    let missing = "model.layers.1.linear_attn.dt_bias";
    check_load_error(|t| t.retain(|(n, _)| n != missing), missing);
}
