//! MLA attention in row blocks against one block: values, block sizes, and
//! the memory a blocked chunk holds.

use mlx_tensor::{Dtype, memory};

use super::*;
use crate::models::test_arrays::{max_diff, rand};

#[path = "../../../../mlx-tensor/tests/it/common/own_process.rs"]
mod own_process;

const HEADS: i32 = 4;
const NOPE: i32 = 8;
const ROPE: i32 = 4;
const V: i32 = 6;
const LORA: i32 = 16;

/// A bias for `attend` over `l` query rows and `s` keys.
#[derive(Debug, Clone, Copy)]
enum Bias {
    None,
    /// `sdpa::causal_bias`, `[L, S]`.
    Causal,
    /// One row `[1, S]` that broadcasts to every query row.
    OneRow,
}

/// Queries `[1, heads, l, nope | rope]`, cached latent and rotary keys over
/// `s` positions, W_uk and W_uv, and the bias of `kind`; seeded, f32.
struct Inputs {
    q: (Array, Array),
    kv: (Array, Array),
    w: (Array, Array),
    bias: Option<Array>,
}

impl Inputs {
    fn new(heads: i32, l: i32, s: i32, kind: Bias) -> Inputs {
        // W_uk scaled down so that the scores, and with them the softmax,
        // are spread rather than one-hot.
        let w_uk = rand(&[heads, NOPE, LORA], 5)
            .multiply(&Array::scalar(0.2, Dtype::Float32).unwrap())
            .unwrap();
        let bias = match kind {
            Bias::None => None,
            Bias::Causal => Some(sdpa::causal_bias(l, s, s, Dtype::Float32).unwrap()),
            Bias::OneRow => Some(rand(&[1, s], 7)),
        };
        let inputs = Inputs {
            q: (rand(&[1, heads, l, NOPE], 1), rand(&[1, heads, l, ROPE], 2)),
            kv: (rand(&[1, 1, s, LORA], 3), rand(&[1, 1, s, ROPE], 4)),
            w: (w_uk, rand(&[heads, V, LORA], 6)),
            bias,
        };
        let mut all = vec![&inputs.q.0, &inputs.q.1, &inputs.kv.0, &inputs.kv.1];
        all.extend([&inputs.w.0, &inputs.w.1].into_iter().chain(&inputs.bias));
        mlx_tensor::eval(all).unwrap();
        inputs
    }

    /// `attend_in_blocks` of these inputs at `score_bytes`, evaluated.
    fn attend(&self, absorbed: bool, score_bytes: usize) -> Array {
        let o = attend_in_blocks(
            (&self.w.0, &self.w.1),
            (&self.q.0, &self.q.1),
            (&self.kv.0, &self.kv.1),
            self.bias.as_ref(),
            absorbed,
            score_bytes,
        )
        .unwrap();
        o.eval().unwrap();
        o
    }
}

/// Attention of `l` query rows over `s` keys in blocks of `rows` equals the
/// one-block attention within 1e-5 (f32, outputs of magnitude about 1),
/// absorbed and expanded. The blocks must not divide `l` evenly.
fn check(l: i32, s: i32, rows: i32, kind: Bias) {
    let score_bytes = (HEADS * s * rows) as usize * size_of::<f32>();
    assert_eq!(block_rows(HEADS, s, score_bytes), rows, "the budget's rows");
    assert!(l > rows && l % rows != 0, "{l} rows in blocks of {rows}");
    let inputs = Inputs::new(HEADS, l, s, kind);
    for absorbed in [true, false] {
        let (blocked, whole) = (
            inputs.attend(absorbed, score_bytes),
            inputs.attend(absorbed, usize::MAX),
        );
        assert_eq!(blocked.shape().as_slice(), &[1, HEADS, l, V]);
        let worst = max_diff(&blocked, &whole);
        assert!(
            worst <= 1e-5,
            "l {l}, s {s}, blocks of {rows}, {kind:?}, absorbed {absorbed}: differ by {worst}"
        );
    }
}

#[test]
fn blocked_attention_equals_one_block() {
    let b = MIN_BLOCK_ROWS;
    // Three blocks with a short last one, and two of unequal length; a
    // cached prefix (S > L) and none (S = L).
    check(2 * b + 7, 2 * b + 20, b, Bias::Causal);
    check(2 * b + 7, 2 * b + 7, b, Bias::None);
    check(2 * b + 7, 2 * b + 20, b + 9, Bias::Causal);
    check(2 * b + 7, 2 * b + 20, b + 9, Bias::None);
    check(2 * b + 7, 3 * b, b, Bias::OneRow);
}

/// `block_rows` for DeepSeek-V3's 128 heads at the production budget, by
/// keys: the budget's rows up to 16k keys, the floor past them.
#[test]
fn blocks_hold_the_budget_and_at_least_a_verify() {
    for (keys, rows) in [
        (1, 524_288),
        (4096, 128),
        (16_384, 32),
        (20_000, MIN_BLOCK_ROWS),
        (1 << 20, MIN_BLOCK_ROWS),
    ] {
        assert_eq!(
            block_rows(128, keys, SCORE_BLOCK_BYTES),
            rows,
            "{keys} keys"
        );
    }
    const { assert!(MIN_BLOCK_ROWS >= 17, "a verify of 16 drafts is one block") };
}

/// A 2048-row chunk over 1024 keys (8 heads) in 64 blocks of 1 MiB of
/// scores peaks, above its evaluated inputs, under 12 blocks' scores: the
/// blocks run one after another (measured about 5 to 8 MiB on the CPU; left
/// independent, MLX's breadth-first schedule ran about 20 at a time, 21 to
/// 32 MiB). The control: the same chunk in one block peaks above its whole
/// scores (64 MiB), so the figure sees them. MLX's memory figures are
/// process-wide, so this runs alone in a child process.
#[test]
fn blocked_attention_holds_few_blocks_of_scores() {
    own_process::own_process(
        "models::mla::tests::blocked_attention_holds_few_blocks_of_scores",
        || {
            let (heads, l, s) = (8, 2048, 1024);
            let block = (heads * s * MIN_BLOCK_ROWS) as usize * size_of::<f32>();
            let whole = (heads * l * s) as usize * size_of::<f32>();
            memory::set_cache_limit(0);
            for kind in [Bias::None, Bias::Causal] {
                let inputs = Inputs::new(heads, l, s, kind);
                for absorbed in [true, false] {
                    let peak = |score_bytes| {
                        let base = memory::active();
                        memory::reset_peak();
                        drop(inputs.attend(absorbed, score_bytes));
                        memory::peak().saturating_sub(base)
                    };
                    let (blocked, one) = (peak(block), peak(usize::MAX));
                    let case = format!("{kind:?}, absorbed {absorbed}");
                    assert!(one >= whole, "{case}: one block peaks at {one} B");
                    assert!(
                        blocked < 12 * block,
                        "{case}: blocks peak at {blocked} B, {} blocks' scores",
                        blocked as f64 / block as f64
                    );
                }
            }
        },
    );
}
