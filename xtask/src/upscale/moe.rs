//! Function-preserving widening of a Qwen3.5-MoE checkpoint (`qwen3_5_moe`,
//! hub layout: trunk under `model.language_model.*`, fused experts, `mtp.*`):
//! the same function at a bigger shape whose every token reads as many
//! expert bytes as a real MoE's, so a verify over `k + 1` rows grows with the
//! depth as it does on a real model.
//!
//! Like [`super::widen`] (whose writer, shape keys and shared checks it
//! uses) only `std` and `serde_json`: the runner's upscale test includes
//! this file too (`#[path]`).
//!
//! The rules, with `H → H'` the hidden width and `a = sqrt(H'/H)`:
//! * The residual stream is carried `a` times larger: the embedding and every
//!   projection that writes the residual (`o_proj`, `out_proj`, the experts'
//!   and the shared expert's `down_proj`, `mtp.fc`) are multiplied by `a`, and
//!   the untied `lm_head` by `1/a`. Then an RMSNorm over `H'` (zeros in the
//!   new channels) sees the source's mean square exactly, with the source's
//!   `rms_norm_eps`, and a gain `(1 + w)/a` (zero-centred storage: `w'` =
//!   `(1 + w)/a − 1`) gives the source's normalised value. The final norm and
//!   `mtp.norm` keep their gain (their output feeds `lm_head/a`), and the MTP
//!   head's two input norms take `/a` like a layer's. So every norm that
//!   does not run over `H'` (the q/k norms over `head_dim`, the Gated
//!   DeltaNet's gated norm over `Dv`) sees unchanged inputs and eps: nothing
//!   depends on `eps·H/H'` as in the dense upscale. The embedding must be
//!   untied for this (`embed·a`, `lm_head/a`): `tie_word_embeddings` becomes
//!   false.
//! * Head widths stay: the Gated DeltaNet scales its L2-normalised queries by
//!   `1/sqrt(Dk)`, and gated attention's softmax scale and partial rotary
//!   width depend on `head_dim`, so widening a head would change the output.
//!   Head counts grow instead: query head `i` of an old group `g` moves to
//!   `g'·(i div g) + i mod g` (its query and gate rows, its `o_proj`
//!   columns), and value head `j` of the Gated DeltaNet likewise under the
//!   new value-per-key group (its `v` rows of `in_proj_qkv`, conv channels,
//!   `in_proj_z`/`a`/`b` rows, `A_log`, `dt_bias`, `out_proj` columns), so each
//!   keeps its key head. A new head's q/k/v/z/a/b rows and conv channels are
//!   zero: its L2-normalised q and k are exactly 0 (`rms_norm` of zeros), its
//!   recurrent state stays 0, its output and gated norm are 0, and its
//!   `out_proj` / `o_proj` columns are zero anyway.
//! * Experts are duplicated: expert `e` becomes `m` copies `e·m .. e·m+m−1`
//!   with its router row copied, and `top_k` becomes `top_k·m`. The softmax
//!   over the copied logits gives each copy `p_e/m`, so the `top_k·m` largest
//!   are exactly the copies of the source's top-k (when the source's k-th and
//!   (k+1)-th probabilities differ), and with or without `norm_topk_prob`
//!   the copies' weights add up to the source's weight of `e`: the same
//!   output up to float summation order. `moe_intermediate_size` and
//!   `shared_expert_intermediate_size` grow with zero units.
//! * New layers are all zero in the source's `full_attention_interval`
//!   pattern: every mixer's output projection and every expert's `down_proj`
//!   is zero, and nothing before them is infinite or NaN (zero router logits
//!   are a uniform softmax, a zero `A_log` a finite decay), so each adds
//!   exactly 0 to the residual.
//! * The vocabulary is padded as in [`super::widen`] (the bias channel `c = H`
//!   with `BIAS` in every real embedding row, `PAD_WEIGHT` in the padding rows
//!   of `lm_head`, `FC_GAIN` from the MTP head's embedding half); the final
//!   norms' gain at `c` is 1 (`w = 0`).
//!
//! In f32 the upscale is exact up to one rounding of each scaled weight. In
//! bf16 the weights scaled by `a` are rounded to bf16 unless `a` is a power
//! of two (`H'/H` a power of four); the norm gains and the f32 `A_log` /
//! `dt_bias` are stored in f32 either way.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;

use serde_json::{Value, json};

use super::widen::{
    self, BIAS, FC_GAIN, Fill, Out, OutDtype, PAD_WEIGHT, Seg, ShapeKeys, Src, Summary, bad, ident,
};

/// A Qwen3.5-MoE target shape; head dimensions stay the source's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MoeShape {
    /// Hidden width `H'`.
    pub hidden: usize,
    /// Decoder layers (the MTP head keeps its own).
    pub layers: usize,
    /// Gated attention query heads.
    pub heads: usize,
    /// Gated attention KV heads.
    pub kv_heads: usize,
    /// Gated DeltaNet key heads.
    pub linear_key_heads: usize,
    /// Gated DeltaNet value heads.
    pub linear_value_heads: usize,
    /// Copies of each expert (`num_experts` and `num_experts_per_tok` are multiplied by it).
    pub expert_copies: usize,
    /// Each expert's inner width.
    pub moe_intermediate: usize,
    /// The shared expert's inner width.
    pub shared_intermediate: usize,
    /// Unembedding rows.
    pub vocab: usize,
}

/// `moe`: Qwen3.5-35B-A3B's per-token widths from tiny-moe-mtp (head_dim 64
/// kept). Hidden 2048 and 40 layers; attention 64 query / 8 KV heads of 64 is
/// the real 16 / 2 of 256 in projection widths, and Gated DeltaNet 32 key /
/// 64 value heads of 64 the real 16 / 32 of 128; 8 experts × 8 copies, top-16
/// of inner width 256 reads what the real top-8 of 512 reads per token; the
/// shared expert 512 and the vocabulary 248,320 are the real ones.
pub(crate) const NAMED: &[(&str, MoeShape)] = &[(
    "moe",
    MoeShape {
        hidden: 2048,
        layers: 40,
        heads: 64,
        kv_heads: 8,
        linear_key_heads: 32,
        linear_value_heads: 64,
        expert_copies: 8,
        moe_intermediate: 256,
        shared_intermediate: 512,
        vocab: 248_320,
    },
)];

const KEYS: &str = "hidden, layers, heads, kv_heads, linear_key_heads, linear_value_heads, \
                    expert_copies, moe_intermediate, shared_intermediate, vocab";

/// A named shape, or `key=value,...` with every key of [`MoeShape`].
pub(crate) fn parse_shape(s: &str) -> io::Result<MoeShape> {
    if let Some((_, shape)) = NAMED.iter().find(|(n, _)| *n == s) {
        return Ok(*shape);
    }
    if !s.contains('=') {
        return Err(bad(format!(
            "unknown MoE shape `{s}`: use moe or key=value,... with the keys {KEYS}"
        )));
    }
    let hint = format!(" (keys: {KEYS})");
    let mut kv = ShapeKeys::parse(s, &hint)?;
    let shape = MoeShape {
        hidden: kv.take("hidden")?,
        layers: kv.take("layers")?,
        heads: kv.take("heads")?,
        kv_heads: kv.take("kv_heads")?,
        linear_key_heads: kv.take("linear_key_heads")?,
        linear_value_heads: kv.take("linear_value_heads")?,
        expert_copies: kv.take("expert_copies")?,
        moe_intermediate: kv.take("moe_intermediate")?,
        shared_intermediate: kv.take("shared_intermediate")?,
        vocab: kv.take("vocab")?,
    };
    kv.finish(shape)
}

/// Whether the model in `dir` is one this module widens (`qwen3_5_moe`).
pub(crate) fn is_moe_model(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .is_some_and(|c| c["model_type"] == "qwen3_5_moe")
}

/// The source's widths, from config.json's `text_config`.
#[derive(Debug, Clone)]
struct Dims {
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    key_heads: usize,
    value_heads: usize,
    key_dim: usize,
    value_dim: usize,
    conv: usize,
    experts: usize,
    top_k: usize,
    moe_i: usize,
    shared_i: usize,
    vocab: usize,
    interval: usize,
    /// Per source layer: full attention (else Gated DeltaNet).
    full: Vec<bool>,
}

impl Dims {
    fn from_config(c: &Value, path: &Path) -> io::Result<Dims> {
        let t = &c["text_config"];
        if c["model_type"] != "qwen3_5_moe" || !t.is_object() {
            return Err(bad(format!(
                "{}: the MoE upscale knows Qwen3.5-MoE (model_type qwen3_5_moe with a text_config), not {}",
                path.display(),
                c["model_type"]
            )));
        }
        let get = |k: &str| {
            t[k].as_u64().map(|v| v as usize).ok_or_else(|| {
                bad(format!(
                    "{}: text_config has no whole-number `{k}`",
                    path.display()
                ))
            })
        };
        let layers = get("num_hidden_layers")?;
        let interval = get("full_attention_interval")?;
        let full: Vec<bool> = match t["layer_types"].as_array() {
            Some(a) => a.iter().map(|k| k == "full_attention").collect(),
            None => (0..layers)
                .map(|l| (l + 1).is_multiple_of(interval.max(1)))
                .collect(),
        };
        if full.len() != layers {
            return Err(bad(format!(
                "{}: layer_types has {} entries for {layers} layers",
                path.display(),
                full.len()
            )));
        }
        if t["decoder_sparse_step"].as_u64().unwrap_or(1) != 1
            || t["mlp_only_layers"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
        {
            return Err(bad(format!(
                "{}: the MoE upscale needs every layer sparse (decoder_sparse_step 1, no mlp_only_layers)",
                path.display()
            )));
        }
        Ok(Dims {
            hidden: get("hidden_size")?,
            layers,
            heads: get("num_attention_heads")?,
            kv_heads: get("num_key_value_heads")?,
            head_dim: get("head_dim")?,
            key_heads: get("linear_num_key_heads")?,
            value_heads: get("linear_num_value_heads")?,
            key_dim: get("linear_key_head_dim")?,
            value_dim: get("linear_value_head_dim")?,
            conv: get("linear_conv_kernel_dim")?,
            experts: get("num_experts")?,
            top_k: get("num_experts_per_tok")?,
            moe_i: get("moe_intermediate_size")?,
            shared_i: get("shared_expert_intermediate_size")?,
            vocab: get("vocab_size")?,
            interval,
            full,
        })
    }
}

/// How the source maps onto the target shape.
struct Plan {
    old: Dims,
    new: MoeShape,
    dtype: OutDtype,
    /// `sqrt(H'/H)`: the residual stream's scale.
    a: f64,
    bias_channel: Option<usize>,
    /// Whether the source has its own `lm_head.weight`.
    own_head: bool,
    /// Expected source shape of every tensor a rule reads.
    wants: BTreeMap<String, Vec<usize>>,
}

/// `count` blocks of `len`: block `i` from `i·len` to `dst(i)·len` (heads, experts).
fn blocks(count: usize, len: usize, dst: impl Fn(usize) -> usize) -> Vec<Seg> {
    (0..count)
        .map(|i| Seg {
            src: i * len,
            dst: dst(i) * len,
            len,
        })
        .collect()
}

/// Offsets every segment by (`src`, `dst`).
fn shift(segs: Vec<Seg>, src: usize, dst: usize) -> Vec<Seg> {
    segs.into_iter()
        .map(|g| Seg {
            src: g.src + src,
            dst: g.dst + dst,
            len: g.len,
        })
        .collect()
}

/// `g'·(i div g) + i mod g`: head `i` of a group of `g` under a group of `g2`.
fn regroup(i: usize, g: usize, g2: usize) -> usize {
    g2 * (i / g) + i % g
}

impl Plan {
    // Long: one check per width the shape could get wrong.
    fn new(old: Dims, new: MoeShape, dtype: OutDtype, own_head: bool) -> io::Result<Plan> {
        let too_small = [
            ("hidden", new.hidden, old.hidden),
            ("layers", new.layers, old.layers),
            ("heads", new.heads, old.heads),
            ("kv_heads", new.kv_heads, old.kv_heads),
            ("linear_key_heads", new.linear_key_heads, old.key_heads),
            (
                "linear_value_heads",
                new.linear_value_heads,
                old.value_heads,
            ),
            ("expert_copies", new.expert_copies, 1),
            ("moe_intermediate", new.moe_intermediate, old.moe_i),
            ("shared_intermediate", new.shared_intermediate, old.shared_i),
            ("vocab", new.vocab, old.vocab),
        ];
        widen::check_widens(&too_small)?;
        let groups = [
            (
                "heads",
                "kv_heads",
                old.heads,
                old.kv_heads,
                new.heads,
                new.kv_heads,
            ),
            (
                "linear_value_heads",
                "linear_key_heads",
                old.value_heads,
                old.key_heads,
                new.linear_value_heads,
                new.linear_key_heads,
            ),
        ];
        for (n, d, on, od, nn, nd) in groups {
            if od == 0 || nd == 0 || !on.is_multiple_of(od) || !nn.is_multiple_of(nd) {
                return Err(bad(format!(
                    "{n} must be a multiple of {d}, in the source and the shape"
                )));
            }
            if nn / nd < on / od {
                return Err(bad(format!(
                    "shape {n}/{d} = {} is below the source's group of {}: each old head must keep its key head",
                    nn / nd,
                    on / od
                )));
            }
        }
        let bias_channel = widen::bias_channel((old.hidden, new.hidden), (old.vocab, new.vocab))?;
        Ok(Plan {
            a: (new.hidden as f64 / old.hidden as f64).sqrt(),
            old,
            new,
            dtype,
            bias_channel,
            own_head,
            wants: BTreeMap::new(),
        })
    }

    /// A tensor read from `name` (source shape `from`), or all zero when `zero`.
    #[allow(clippy::too_many_arguments)] // the mapping's parts, each named at the call
    fn map(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        from: Vec<usize>,
        rows: Vec<Seg>,
        cols: Vec<Seg>,
        scale: f64,
        zero: bool,
    ) -> Out {
        let mut o = Out::zero(name.to_owned(), shape, self.dtype);
        if zero {
            return o;
        }
        self.wants.insert(name.to_owned(), from);
        o.src = Some(name.to_owned());
        o.rows = rows;
        o.cols = cols;
        o.scale = scale as f32;
        o
    }

    /// A zero-centred norm over `H'` whose gain `1 + w` is multiplied by `gain`
    /// on the source's channels; new channels (the bias channel too) get gain 1.
    fn hidden_norm(&mut self, name: &str, gain: f64, zero: bool) -> Out {
        let (h, h2) = (self.old.hidden, self.new.hidden);
        let mut o = self.map(name, vec![h2], vec![h], ident(1), ident(h), gain, zero);
        o.dtype = OutDtype::F32;
        o.offset = 1.0;
        o
    }

    /// A `[r2, H']` projection that reads the residual stream: its `r` source
    /// rows placed by `segs`, its hidden columns and its values kept.
    fn reads(&mut self, name: &str, (r, r2): (usize, usize), segs: Vec<Seg>, zero: bool) -> Out {
        let (h, h2) = (self.old.hidden, self.new.hidden);
        self.map(name, vec![r2, h2], vec![r, h], segs, ident(h), 1.0, zero)
    }

    /// An `[H', c2]` projection that writes the residual stream, so scaled by
    /// `a`: its `c` source columns placed by `segs`, its hidden rows kept.
    fn writes(&mut self, name: &str, (c, c2): (usize, usize), segs: Vec<Seg>, zero: bool) -> Out {
        let (h, h2) = (self.old.hidden, self.new.hidden);
        self.map(name, vec![h2, c2], vec![h, c], ident(h), segs, self.a, zero)
    }

    /// A `[d]` norm over a head width (head widths never change): copied as it is.
    fn head_norm(&mut self, name: &str, d: usize, zero: bool) -> Out {
        self.map(name, vec![d], vec![d], ident(1), ident(d), 1.0, zero)
    }

    /// An f32 `[Vh']` per-value-head vector (`A_log`, `dt_bias`).
    fn head_vector(&mut self, name: &str, zero: bool) -> Out {
        let (o, n) = (&self.old, &self.new);
        let vh = o.value_heads;
        let (r, r2) = (vh / o.key_heads, n.linear_value_heads / n.linear_key_heads);
        let cols = blocks(vh, 1, |j| regroup(j, r, r2));
        let mut t = self.map(
            name,
            vec![n.linear_value_heads],
            vec![vh],
            ident(1),
            cols,
            1.0,
            zero,
        );
        t.dtype = OutDtype::F32;
        t
    }

    /// The Gated DeltaNet tensors at `p` (`...layers.{i}.linear_attn`).
    fn linear_attn(&mut self, p: &str, zero: bool) -> Vec<Out> {
        let (o, n) = (self.old.clone(), self.new);
        let (dk, dv) = (o.key_dim, o.value_dim);
        let (kh, kh2) = (o.key_heads, n.linear_key_heads);
        let (vh, vh2) = (o.value_heads, n.linear_value_heads);
        let (r, r2) = (vh / kh, vh2 / kh2);
        let (kt, kt2) = (kh * dk, kh2 * dk);
        let (c, c2) = (2 * kt + vh * dv, 2 * kt2 + vh2 * dv);
        // Key heads keep their index; value heads regroup.
        let vrows = || blocks(vh, dv, |j| regroup(j, r, r2));
        let mut qkv = ident(2 * kt);
        qkv[0].len = kt;
        qkv.push(Seg {
            src: kt,
            dst: kt2,
            len: kt,
        });
        qkv.extend(shift(vrows(), 2 * kt, 2 * kt2));
        let heads_1 = || blocks(vh, 1, |j| regroup(j, r, r2));
        let f = |s: &str| format!("{p}.{s}");
        vec![
            self.reads(&f("in_proj_qkv.weight"), (c, c2), qkv.clone(), zero),
            self.map(
                &f("conv1d.weight"),
                vec![c2, 1, o.conv],
                vec![c, 1, o.conv],
                qkv,
                ident(o.conv),
                1.0,
                zero,
            ),
            self.reads(&f("in_proj_z.weight"), (vh * dv, vh2 * dv), vrows(), zero),
            self.reads(&f("in_proj_a.weight"), (vh, vh2), heads_1(), zero),
            self.reads(&f("in_proj_b.weight"), (vh, vh2), heads_1(), zero),
            self.head_vector(&f("A_log"), zero),
            self.head_vector(&f("dt_bias"), zero),
            self.head_norm(&f("norm.weight"), dv, zero),
            self.writes(&f("out_proj.weight"), (vh * dv, vh2 * dv), vrows(), zero),
        ]
    }

    /// The gated attention tensors at `p` (`...self_attn`).
    fn self_attn(&mut self, p: &str, zero: bool) -> Vec<Out> {
        let (o, n) = (self.old.clone(), self.new);
        let d = o.head_dim;
        let (g, g2) = (o.heads / o.kv_heads, n.heads / n.kv_heads);
        let (q, q2) = (o.heads * d, n.heads * d);
        let (kv, kv2) = (o.kv_heads * d, n.kv_heads * d);
        let heads = |len: usize| blocks(o.heads, len, |i| regroup(i, g, g2));
        let f = |s: &str| format!("{p}.{s}");
        vec![
            // Per head: [query D | gate D], both moving with the head.
            self.reads(&f("q_proj.weight"), (2 * q, 2 * q2), heads(2 * d), zero),
            self.reads(&f("k_proj.weight"), (kv, kv2), ident(kv), zero),
            self.reads(&f("v_proj.weight"), (kv, kv2), ident(kv), zero),
            self.writes(&f("o_proj.weight"), (q, q2), heads(d), zero),
            self.head_norm(&f("q_norm.weight"), d, zero),
            self.head_norm(&f("k_norm.weight"), d, zero),
        ]
    }

    /// The MoE block at `p` (`...mlp`): router rows and experts copied
    /// `expert_copies` times, inner widths zero-padded.
    fn moe(&mut self, p: &str, zero: bool) -> Vec<Out> {
        let (o, n) = (self.old.clone(), self.new);
        let (h, h2, e, m) = (o.hidden, n.hidden, o.experts, n.expert_copies);
        let (i, i2, s, s2) = (
            o.moe_i,
            n.moe_intermediate,
            o.shared_i,
            n.shared_intermediate,
        );
        let e2 = e * m;
        let copies = |len: usize, stride: usize, at: usize| -> Vec<Seg> {
            (0..e)
                .flat_map(|x| {
                    (0..m).map(move |j| Seg {
                        src: x * len,
                        dst: (x * m + j) * stride + at,
                        len,
                    })
                })
                .collect()
        };
        // gate_up `[E, 2I, H]` as `E·2I` rows: the gate half, then the up half.
        let mut gate_up = Vec::new();
        for x in 0..e {
            for j in 0..m {
                let to = (x * m + j) * 2 * i2;
                gate_up.push(Seg {
                    src: x * 2 * i,
                    dst: to,
                    len: i,
                });
                gate_up.push(Seg {
                    src: x * 2 * i + i,
                    dst: to + i2,
                    len: i,
                });
            }
        }
        let a = self.a;
        let f = |x: &str| format!("{p}.{x}");
        let shared = |x: &str| format!("{p}.shared_expert.{x}");
        vec![
            self.reads(&f("gate.weight"), (e, e2), copies(1, 1, 0), zero),
            self.map(
                &f("experts.gate_up_proj"),
                vec![e2, 2 * i2, h2],
                vec![e, 2 * i, h],
                gate_up,
                ident(h),
                1.0,
                zero,
            ),
            // down `[E, H, I]` as `E·H` rows.
            self.map(
                &f("experts.down_proj"),
                vec![e2, h2, i2],
                vec![e, h, i],
                copies(h, h2, 0),
                ident(i),
                a,
                zero,
            ),
            self.reads(&shared("gate_proj.weight"), (s, s2), ident(s), zero),
            self.reads(&shared("up_proj.weight"), (s, s2), ident(s), zero),
            self.writes(&shared("down_proj.weight"), (s, s2), ident(s), zero),
            self.reads(&f("shared_expert_gate.weight"), (1, 1), ident(1), zero),
        ]
    }

    /// One decoder layer at `p`: its two norms, its mixer, its MoE block.
    fn layer(&mut self, p: &str, full: bool, zero: bool) -> Vec<Out> {
        let inv = 1.0 / self.a;
        let mut v = vec![
            self.hidden_norm(&format!("{p}.input_layernorm.weight"), inv, zero),
            self.hidden_norm(&format!("{p}.post_attention_layernorm.weight"), inv, zero),
        ];
        if full {
            v.extend(self.self_attn(&format!("{p}.self_attn"), zero));
        } else {
            v.extend(self.linear_attn(&format!("{p}.linear_attn"), zero));
        }
        v.extend(self.moe(&format!("{p}.mlp"), zero));
        v
    }

    /// Whether new layer `l` is full attention: the source's own type, then
    /// the `full_attention_interval` pattern.
    fn full(&self, l: usize) -> bool {
        self.old
            .full
            .get(l)
            .copied()
            .unwrap_or((l + 1).is_multiple_of(self.old.interval.max(1)))
    }

    // Long: the embedding, the trunk, the MTP head and the unembedding in order.
    fn tensors(&mut self, mtp_layers: usize) -> Vec<Out> {
        let (o, n) = (self.old.clone(), self.new);
        let (h, h2, v, v2) = (o.hidden, n.hidden, o.vocab, n.vocab);
        let t = "model.language_model";
        let embed = format!("{t}.embed_tokens.weight");
        let (a, inv, own_head) = (self.a, 1.0 / self.a, self.own_head);
        // Untied (see the module docs): the embedding `·a`, `lm_head` `/a`.
        let mut vocab = |name: &str, scale: f64| {
            self.map(
                name,
                vec![v2, h2],
                vec![v, h],
                ident(v),
                ident(h),
                scale,
                false,
            )
        };
        let mut e = vocab(&embed, a);
        // A tied source's `lm_head` is its embedding, written under the new name.
        let mut head = vocab(if own_head { "lm_head.weight" } else { &embed }, inv);
        head.name = "lm_head.weight".to_owned();
        if let Some(c) = self.bias_channel {
            e.fills.push(Fill {
                rows: 0..v,
                col: c,
                value: BIAS,
            });
            head.fills.push(Fill {
                rows: v..v2,
                col: c,
                value: PAD_WEIGHT,
            });
        }
        let mut outs = vec![
            e,
            head,
            self.hidden_norm(&format!("{t}.norm.weight"), 1.0, false),
        ];
        for l in 0..n.layers {
            let full = self.full(l);
            outs.extend(self.layer(&format!("{t}.layers.{l}"), full, l >= o.layers));
        }
        if mtp_layers > 0 {
            let mut fc = self.map(
                "mtp.fc.weight",
                vec![h2, 2 * h2],
                vec![h, 2 * h],
                ident(h),
                widen::fc_cols(h, h2),
                a,
                false,
            );
            fc.fills.extend(self.bias_channel.map(widen::fc_bias));
            outs.push(fc);
            outs.push(self.hidden_norm("mtp.pre_fc_norm_embedding.weight", inv, false));
            outs.push(self.hidden_norm("mtp.pre_fc_norm_hidden.weight", inv, false));
            outs.push(self.hidden_norm("mtp.norm.weight", 1.0, false));
            for l in 0..mtp_layers {
                outs.extend(self.layer(&format!("mtp.layers.{l}"), true, false));
            }
        }
        outs
    }

    fn edit_config(&self, c: &mut Value) {
        let n = &self.new;
        let t = &mut c["text_config"];
        t["hidden_size"] = n.hidden.into();
        t["num_hidden_layers"] = n.layers.into();
        let types: Vec<Value> = (0..n.layers)
            .map(|l| {
                if self.full(l) {
                    "full_attention"
                } else {
                    "linear_attention"
                }
                .into()
            })
            .collect();
        t["layer_types"] = types.into();
        t["num_attention_heads"] = n.heads.into();
        t["num_key_value_heads"] = n.kv_heads.into();
        t["linear_num_key_heads"] = n.linear_key_heads.into();
        t["linear_num_value_heads"] = n.linear_value_heads.into();
        t["num_experts"] = (self.old.experts * n.expert_copies).into();
        t["num_experts_per_tok"] = (self.old.top_k * n.expert_copies).into();
        t["moe_intermediate_size"] = n.moe_intermediate.into();
        t["shared_expert_intermediate_size"] = n.shared_intermediate.into();
        t["vocab_size"] = n.vocab.into();
        t["tie_word_embeddings"] = false.into();
        t["dtype"] = self.dtype.torch_name().into();
        c["tie_word_embeddings"] = false.into();
        c["torch_dtype"] = self.dtype.torch_name().into();
    }
}

fn shape_json(s: &MoeShape) -> Value {
    json!({"hidden": s.hidden, "layers": s.layers, "heads": s.heads, "kv_heads": s.kv_heads,
           "linear_key_heads": s.linear_key_heads, "linear_value_heads": s.linear_value_heads,
           "expert_copies": s.expert_copies, "moe_intermediate": s.moe_intermediate,
           "shared_intermediate": s.shared_intermediate, "vocab": s.vocab})
}

/// Every source tensor is read by a rule, with the shape the rule expects.
fn check_placed(
    wants: &BTreeMap<String, Vec<usize>>,
    src: &BTreeMap<String, Src>,
) -> io::Result<()> {
    for (name, t) in src {
        let Some(want) = wants.get(name) else {
            return Err(bad(format!(
                "tensor {name} has no MoE upscale rule (it knows the Qwen3.5-MoE hub layout: \
                 model.language_model.*, fused mlp.experts.*, mtp.*)"
            )));
        };
        if &t.shape != want {
            return Err(bad(format!(
                "tensor {name} has shape {:?}, not the {want:?} config.json implies",
                t.shape
            )));
        }
    }
    let missing: BTreeSet<&String> = wants.keys().filter(|k| !src.contains_key(*k)).collect();
    if let Some(name) = missing.first() {
        return Err(bad(format!("the source has no tensor {name}")));
    }
    Ok(())
}

/// Upscales the Qwen3.5-MoE checkpoint in `src` to `shape` into `out`, big
/// weights in `dtype`, in safetensors shards of at most `shard_bytes`. `out`
/// must not exist, or be empty, or hold an earlier upscale (which is replaced).
pub(crate) fn upscale(
    src: &Path,
    shape: &MoeShape,
    out: &Path,
    dtype: OutDtype,
    shard_bytes: u64,
) -> io::Result<Summary> {
    let config_path = src.join("config.json");
    let config: Value = serde_json::from_str(&widen::read_text(&config_path)?)
        .map_err(|e| bad(format!("{}: {e}", config_path.display())))?;
    let old = Dims::from_config(&config, &config_path)?;
    let tensors = widen::read_safetensors(src)?;
    let mut plan = Plan::new(old, *shape, dtype, tensors.contains_key("lm_head.weight"))?;
    let outs = plan.tensors(widen::mtp_layers(&tensors));
    check_placed(&plan.wants, &tensors)?;
    widen::prepare_out(out)?;
    let (files, total) = widen::write_all(src, out, &outs, &tensors, shard_bytes)?;
    let mut new_config = config.clone();
    plan.edit_config(&mut new_config);
    widen::write_text(&out.join("config.json"), &new_config)?;
    let params: u64 = outs.iter().map(|t| t.numel() as u64).sum();
    let summary = Summary {
        params,
        bytes: total,
        files,
        exact_qk: true,
        f32_norms: dtype != OutDtype::F32,
        bias_channel: plan.bias_channel,
    };
    let about = json!({
        "about": "a function-preserving MoE upscale (xtask upscale, xtask/src/upscale/moe.rs): same outputs as the source at a bigger shape, experts duplicated",
        "source": src.display().to_string(),
        "shape": shape_json(shape),
        "dtype": dtype.torch_name(),
        "params": params,
        "residual_scale": plan.a,
        "num_experts": plan.old.experts * shape.expert_copies,
        "num_experts_per_tok": plan.old.top_k * shape.expert_copies,
        "bias_channel": plan.bias_channel,
        "bias": BIAS, "pad_weight": PAD_WEIGHT, "fc_gain": FC_GAIN,
        "complete": true,
    });
    widen::write_text(&out.join("UPSCALE.json"), &about)?;
    Ok(summary)
}
