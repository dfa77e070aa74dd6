//! Function-preserving widening of a Qwen3 (+ `mtp.*` head) checkpoint: the
//! same function at a bigger shape, so a step moves the bytes and launches the
//! kernels of a real model of that size.
//!
//! Only `std` and `serde_json`: the runner's upscale test includes this file
//! (`#[path]`) to check an upscale against its source without a second copy.
//!
//! The rules (issue 16), with `H → H'` the hidden width:
//! * Every weight is zero-padded. Rows and columns of the original channels,
//!   MLP units and KV heads keep their index. Query head `i` of an old group of
//!   `g` moves to `g'·(i div g) + (i mod g)` under the new group `g'`, so it
//!   keeps its KV head; `o_proj`'s columns move with it. New heads, units and
//!   layers are all zero: a zero layer adds exactly 0 to the residual.
//! * An RMSNorm over `H'` sees the same sum of squares over `H'` channels, so
//!   its weights on the original channels are multiplied by `s = sqrt(H/H')`
//!   and `rms_norm_eps` by `H/H'`, which makes `x·w'/sqrt(mean' + eps')` equal
//!   to the source's `x·w/sqrt(mean + eps)`.
//! * The q/k norms run over `head_dim`, which does not change, but they share
//!   `rms_norm_eps`: scaling `q_proj` and `k_proj` by the same `s` keeps them
//!   exact (`s·q / sqrt(s²·mean + s²·eps)`). That scaling is only done where it
//!   is exact in the output dtype (f32, or `s` a power of two); otherwise the
//!   q/k norms see `eps·H/H'` instead of `eps`, a relative change of about
//!   `eps / mean(q²)` (≈1e-6), and [`Summary::exact_qk`] says so.
//!   Norm weights whose scaled values bf16 cannot hold are stored in f32.
//! * The MTP head's `fc` (`[H, 2H]`) keeps its two input halves at columns 0
//!   and `H'`.
//! * Vocabulary padding. Qwen3 has no output bias, so a zero row's logit is
//!   exactly 0 and would beat a prompt whose real logits are all negative, and
//!   it would take probability mass from sampling. Instead one new hidden
//!   channel `c = H` carries a tiny constant [`BIAS`] through the residual
//!   stream (every real token's embedding holds it; no layer writes or reads
//!   that channel), the final norms pass it (weight 1 at `c`), and each padding
//!   row of the unembedding holds [`PAD_WEIGHT`] at `c`: padding logits are then
//!   about `-2^14 / rms` (thousands below any real logit; `exp` gives exactly 0),
//!   and the real logits all move by the same ~1e-10. The MTP head's `fc`
//!   copies the channel into its own stream (gain [`FC_GAIN`]) so its drafts
//!   get the same negative padding logits. `BIAS²` is ~1e-10 of a real
//!   embedding's sum of squares, far below f32 rounding of the norms. The
//!   tokenizer stays the source's; padding ids are never produced.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// The constant the bias channel carries in the residual stream (2^-16).
pub(crate) const BIAS: f32 = 1.0 / 65536.0;
/// A padding row's unembedding weight on the bias channel (-2^30).
pub(crate) const PAD_WEIGHT: f32 = -1_073_741_824.0;
/// The MTP head's `fc` weight from the embedding half's bias channel to its own (2^-3).
pub(crate) const FC_GAIN: f32 = 1.0 / 8.0;

/// A target shape; `head_dim` stays the source's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Hidden width `H'`.
    pub hidden: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Decoder layers (the MTP head keeps its own).
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Unembedding rows.
    pub vocab: usize,
}

/// The benchmark shapes of issue 16 (head_dim 64 throughout, as the bundled models).
pub(crate) const NAMED: &[(&str, Shape)] = &[
    (
        "24l",
        Shape {
            hidden: 1024,
            intermediate: 3072,
            layers: 24,
            heads: 16,
            kv_heads: 8,
            vocab: 8192,
        },
    ),
    (
        "1.7b",
        Shape {
            hidden: 2048,
            intermediate: 6144,
            layers: 28,
            heads: 32,
            kv_heads: 16,
            vocab: 151_936,
        },
    ),
    (
        "8b",
        Shape {
            hidden: 4096,
            intermediate: 12288,
            layers: 36,
            heads: 64,
            kv_heads: 16,
            vocab: 151_936,
        },
    ),
    // Qwen3-0.6B's widths with head_dim 64 (32 x 64 = its 2048 query width), for tiny-draft.
    (
        "0.6b",
        Shape {
            hidden: 1024,
            intermediate: 3072,
            layers: 28,
            heads: 32,
            kv_heads: 16,
            vocab: 151_936,
        },
    ),
];

/// A named shape, or `key=value,...` with the keys hidden, intermediate,
/// layers, heads, kv_heads, vocab (all required).
pub(crate) fn parse_shape(s: &str) -> io::Result<Shape> {
    if let Some((_, shape)) = NAMED.iter().find(|(n, _)| *n == s) {
        return Ok(*shape);
    }
    if !s.contains('=') {
        let names: Vec<&str> = NAMED.iter().map(|(n, _)| *n).collect();
        return Err(bad(format!(
            "unknown shape `{s}`: use one of {} or hidden=N,intermediate=N,layers=N,heads=N,kv_heads=N,vocab=N",
            names.join(", ")
        )));
    }
    let mut kv = ShapeKeys::parse(s, "")?;
    let shape = Shape {
        hidden: kv.take("hidden")?,
        intermediate: kv.take("intermediate")?,
        layers: kv.take("layers")?,
        heads: kv.take("heads")?,
        kv_heads: kv.take("kv_heads")?,
        vocab: kv.take("vocab")?,
    };
    kv.finish(shape)
}

/// The whole numbers of a `key=value,...` shape, for the dense and the MoE
/// [`parse_shape`]: each key is taken once, and a key left over is an error.
pub(crate) struct ShapeKeys<'a> {
    spec: &'a str,
    /// Appended to a missing or unknown key's message (the keys to use), or empty.
    hint: &'a str,
    left: BTreeMap<String, usize>,
}

impl<'a> ShapeKeys<'a> {
    /// Splits `spec` into its keys and whole-number values.
    pub(crate) fn parse(spec: &'a str, hint: &'a str) -> io::Result<ShapeKeys<'a>> {
        let mut left = BTreeMap::new();
        for part in spec.split(',') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("shape `{spec}`: `{part}` is not key=value")))?;
            let n: usize = v
                .trim()
                .parse()
                .map_err(|_| bad(format!("shape `{spec}`: `{v}` is not a whole number")))?;
            left.insert(k.trim().to_owned(), n);
        }
        Ok(ShapeKeys { spec, hint, left })
    }

    /// The value of `key`, which the shape must have.
    pub(crate) fn take(&mut self, key: &str) -> io::Result<usize> {
        let (spec, hint) = (self.spec, self.hint);
        self.left
            .remove(key)
            .ok_or_else(|| bad(format!("shape `{spec}` has no `{key}=`{hint}")))
    }

    /// `shape`, once every key has been taken.
    pub(crate) fn finish<T>(self, shape: T) -> io::Result<T> {
        let (spec, hint) = (self.spec, self.hint);
        match self.left.keys().next() {
            Some(k) => Err(bad(format!("shape `{spec}`: unknown key `{k}`{hint}"))),
            None => Ok(shape),
        }
    }
}

/// The stored dtype of the upscale's big weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutDtype {
    /// bfloat16 (what the GPU benchmarks run).
    Bf16,
    /// float32 (exact norm and q/k scaling everywhere).
    F32,
}

impl OutDtype {
    /// `bf16` or `f32`.
    pub(crate) fn parse(s: &str) -> io::Result<OutDtype> {
        match s {
            "bf16" | "bfloat16" => Ok(OutDtype::Bf16),
            "f32" | "float32" => Ok(OutDtype::F32),
            _ => Err(bad(format!("--dtype `{s}`: use bf16 or f32"))),
        }
    }

    pub(crate) fn size(self) -> usize {
        match self {
            OutDtype::Bf16 => 2,
            OutDtype::F32 => 4,
        }
    }

    fn st_name(self) -> &'static str {
        match self {
            OutDtype::Bf16 => "BF16",
            OutDtype::F32 => "F32",
        }
    }

    pub(crate) fn torch_name(self) -> &'static str {
        match self {
            OutDtype::Bf16 => "bfloat16",
            OutDtype::F32 => "float32",
        }
    }
}

/// What [`upscale`] wrote.
#[derive(Debug, Clone)]
pub(crate) struct Summary {
    /// Parameters of the upscale.
    pub params: u64,
    /// Bytes of tensor data (the files are sparse: the zeros take no disk).
    pub bytes: u64,
    /// The safetensors shards written.
    pub files: Vec<PathBuf>,
    /// Whether the q/k norms are exact (q/k projections scaled, see the module docs).
    pub exact_qk: bool,
    /// Whether norm weights were kept in f32 because bf16 cannot hold them scaled.
    pub f32_norms: bool,
    /// The bias channel, when the vocabulary was padded.
    pub bias_channel: Option<usize>,
}

/// Upscales the checkpoint in `src` to `shape` into `out`, big weights in
/// `dtype`, in safetensors shards of at most `shard_bytes`. `out` must not
/// exist, or be empty, or hold an earlier upscale (which is replaced).
// Long: every tensor family of the checkpoint, widened in order.
pub(crate) fn upscale(
    src: &Path,
    shape: &Shape,
    out: &Path,
    dtype: OutDtype,
    shard_bytes: u64,
) -> io::Result<Summary> {
    let config_path = src.join("config.json");
    let config: Value = serde_json::from_str(&read_text(&config_path)?)
        .map_err(|e| bad(format!("{}: {e}", config_path.display())))?;
    let old = Dims::from_config(&config, &config_path)?;
    let tensors = read_safetensors(src)?;
    let plan = Plan::new(&old, shape, dtype, &config, &config_path)?;
    let outs = plan.tensors(&tensors)?;
    prepare_out(out)?;
    let (files, total) = write_all(src, out, &outs, &tensors, shard_bytes)?;
    let mut new_config = config.clone();
    plan.edit_config(&mut new_config);
    write_text(&out.join("config.json"), &new_config)?;
    let params: u64 = outs.iter().map(|t| t.numel() as u64).sum();
    let summary = Summary {
        params,
        bytes: total,
        files,
        exact_qk: plan.qk_scale != 1.0 || plan.s == 1.0,
        f32_norms: plan.norm_dtype != dtype,
        bias_channel: plan.bias_channel,
    };
    let about = json!({
        "about": "a function-preserving upscale (xtask upscale, xtask/src/upscale/widen.rs): same outputs as the source at a bigger shape",
        "source": src.display().to_string(),
        "source_shape": old.shape(),
        "shape": shape_json(shape),
        "dtype": dtype.torch_name(),
        "params": params,
        "norm_scale": plan.s,
        "rms_norm_eps": plan.eps,
        "exact_qk": summary.exact_qk,
        "f32_norms": summary.f32_norms,
        "bias_channel": plan.bias_channel,
        "bias": BIAS, "pad_weight": PAD_WEIGHT, "fc_gain": FC_GAIN,
        "complete": true,
    });
    write_text(&out.join("UPSCALE.json"), &about)?;
    Ok(summary)
}

fn shape_json(s: &Shape) -> Value {
    json!({"hidden": s.hidden, "intermediate": s.intermediate, "layers": s.layers,
           "heads": s.heads, "kv_heads": s.kv_heads, "vocab": s.vocab})
}

pub(crate) fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

pub(crate) fn read_text(p: &Path) -> io::Result<String> {
    std::fs::read_to_string(p)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))
}

pub(crate) fn write_text(p: &Path, v: &Value) -> io::Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(|e| bad(e.to_string()))?;
    std::fs::write(p, text + "\n")
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))
}

/// Makes `out` an empty folder, refusing to clear one that is not an earlier upscale.
pub(crate) fn prepare_out(out: &Path) -> io::Result<()> {
    if out.exists() {
        let mut entries = std::fs::read_dir(out)?.peekable();
        if entries.peek().is_some() {
            if !out.join("UPSCALE.json").is_file() {
                return Err(bad(format!(
                    "{} exists and is not an earlier upscale (no UPSCALE.json): choose an empty or new --out",
                    out.display()
                )));
            }
            std::fs::remove_dir_all(out)?;
        }
    }
    std::fs::create_dir_all(out)
}

/// Marks `out` as an upscale in progress, writes `outs` (values from `tensors`)
/// in safetensors shards of at most `shard_bytes` (with an index when there
/// are several), and copies the tokenizer and generation files from `src`.
/// Returns the shards and their tensor bytes; the caller writes config.json
/// and the final UPSCALE.json.
pub(crate) fn write_all(
    src: &Path,
    out: &Path,
    outs: &[Out],
    tensors: &BTreeMap<String, Src>,
    shard_bytes: u64,
) -> io::Result<(Vec<PathBuf>, u64)> {
    // Marks the folder as an upscale from the start, so a run cut short can be replaced.
    write_text(
        &out.join("UPSCALE.json"),
        &json!({"complete": false, "source": src.display().to_string()}),
    )?;

    // Shards: tensors in name order, a new file when the next would pass `shard_bytes`.
    let mut shards: Vec<Vec<&Out>> = vec![Vec::new()];
    let mut size = 0u64;
    for t in outs {
        let b = t.bytes() as u64;
        if size > 0 && size + b > shard_bytes {
            shards.push(Vec::new());
            size = 0;
        }
        size += b;
        shards.last_mut().expect("one shard").push(t);
    }
    let n = shards.len();
    let mut files = Vec::new();
    let mut weight_map = serde_json::Map::new();
    let mut total = 0u64;
    for (i, shard) in shards.iter().enumerate() {
        let name = if n == 1 {
            "model.safetensors".to_owned()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", i + 1)
        };
        let path = out.join(&name);
        total += write_shard(&path, shard, tensors)?;
        for t in shard {
            weight_map.insert(t.name.clone(), name.clone().into());
        }
        files.push(path);
    }
    if n > 1 {
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        write_text(&out.join("model.safetensors.index.json"), &index)?;
    }
    for entry in std::fs::read_dir(src)? {
        let name = entry?.file_name();
        let s = name.to_string_lossy();
        let keep = s.starts_with("tokenizer")
            || s == "generation_config.json"
            || s == "special_tokens_map.json"
            || s.starts_with("chat_template");
        if keep {
            std::fs::copy(src.join(&name), out.join(&name))?;
        }
    }
    Ok((files, total))
}

/// The source's widths, from config.json.
#[derive(Debug, Clone, Copy)]
struct Dims {
    hidden: usize,
    intermediate: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
}

impl Dims {
    fn from_config(c: &Value, path: &Path) -> io::Result<Dims> {
        let get = |k: &str| {
            c[k].as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| bad(format!("{}: no whole-number `{k}`", path.display())))
        };
        let arch = c["architectures"][0].as_str().unwrap_or("");
        if c["model_type"] != "qwen3" || arch != "Qwen3ForCausalLM" {
            return Err(bad(format!(
                "{}: upscale knows Qwen3 (model_type qwen3, Qwen3ForCausalLM), not {} / {arch}",
                path.display(),
                c["model_type"]
            )));
        }
        if c["mtp_norm_zero_centered"] == true {
            return Err(bad(format!(
                "{}: zero-centred MTP norms (mtp_norm_zero_centered) are not supported by upscale",
                path.display()
            )));
        }
        let hidden = get("hidden_size")?;
        let heads = get("num_attention_heads")?;
        Ok(Dims {
            hidden,
            intermediate: get("intermediate_size")?,
            layers: get("num_hidden_layers")?,
            heads,
            kv_heads: get("num_key_value_heads")?,
            head_dim: c["head_dim"]
                .as_u64()
                .map_or(hidden / heads.max(1), |v| v as usize),
            vocab: get("vocab_size")?,
        })
    }

    fn shape(&self) -> Value {
        json!({"hidden": self.hidden, "intermediate": self.intermediate, "layers": self.layers,
               "heads": self.heads, "kv_heads": self.kv_heads, "head_dim": self.head_dim,
               "vocab": self.vocab})
    }
}

/// Source tensor dtypes upscale reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SrcDtype {
    Bf16,
    F32,
}

/// One tensor, its bytes copied out of the file.
#[derive(Debug)]
pub(crate) struct Src {
    /// Stored dtype.
    pub dtype: SrcDtype,
    /// Shape.
    pub shape: Vec<usize>,
    data: Vec<u8>,
}

impl Src {
    /// Element `i` (row-major) as f32.
    pub(crate) fn get(&self, i: usize) -> f32 {
        match self.dtype {
            SrcDtype::Bf16 => {
                let b = [self.data[2 * i], self.data[2 * i + 1]];
                f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16)
            }
            SrcDtype::F32 => {
                let b = &self.data[4 * i..4 * i + 4];
                f32::from_le_bytes([b[0], b[1], b[2], b[3]])
            }
        }
    }

    fn elem(&self) -> usize {
        match self.dtype {
            SrcDtype::Bf16 => 2,
            SrcDtype::F32 => 4,
        }
    }
}

/// Every tensor of every `*.safetensors` file in `dir`.
pub(crate) fn read_safetensors(dir: &Path) -> io::Result<BTreeMap<String, Src>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(bad(format!("{}: no *.safetensors files", dir.display())));
    }
    let mut out = BTreeMap::new();
    for f in files {
        let bytes = std::fs::read(&f)?;
        let fail = |m: &str| bad(format!("{}: {m}", f.display()));
        let n = u64::from_le_bytes(
            bytes
                .get(..8)
                .ok_or_else(|| fail("shorter than a safetensors header"))?
                .try_into()
                .expect("8 bytes"),
        ) as usize;
        let header: Value = serde_json::from_slice(
            bytes
                .get(8..8 + n)
                .ok_or_else(|| fail("header runs past the end"))?,
        )
        .map_err(|e| fail(&format!("header: {e}")))?;
        let data = &bytes[8 + n..];
        for (name, info) in header
            .as_object()
            .ok_or_else(|| fail("header is not an object"))?
        {
            if name == "__metadata__" {
                continue;
            }
            let dtype = match info["dtype"].as_str() {
                Some("BF16") => SrcDtype::Bf16,
                Some("F32") => SrcDtype::F32,
                other => {
                    return Err(fail(&format!(
                        "tensor {name} is {other:?}: upscale reads BF16 and F32 (dequantize or convert first)"
                    )));
                }
            };
            let shape: Vec<usize> = info["shape"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|d| d.as_u64().map(|d| d as usize))
                        .collect()
                })
                .unwrap_or_default();
            let (b, e) = (
                info["data_offsets"][0].as_u64().unwrap_or(0) as usize,
                info["data_offsets"][1].as_u64().unwrap_or(0) as usize,
            );
            let src = Src {
                dtype,
                shape,
                data: data
                    .get(b..e)
                    .ok_or_else(|| fail(&format!("tensor {name} runs past the end")))?
                    .to_vec(),
            };
            if src.data.len() != src.shape.iter().product::<usize>() * src.elem() {
                return Err(fail(&format!(
                    "tensor {name}: data size does not match its shape"
                )));
            }
            out.insert(name.clone(), src);
        }
    }
    Ok(out)
}

/// `len` source indices from `src` land at `dst`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seg {
    pub src: usize,
    pub dst: usize,
    pub len: usize,
}

pub(crate) fn ident(len: usize) -> Vec<Seg> {
    vec![Seg {
        src: 0,
        dst: 0,
        len,
    }]
}

/// Output rows in `rows` get `value` at column `col`.
#[derive(Debug, Clone)]
pub(crate) struct Fill {
    pub rows: Range<usize>,
    pub col: usize,
    pub value: f32,
}

/// One output tensor: a `[rows, cols]` (or `[cols]`, or `[.., rows, cols]`
/// seen as its rows) zero tensor with the mapped source values `v` written
/// as `(v + offset) · scale − offset` (`offset` 1 scales a zero-centred norm's
/// gain `1 + w`), and fills written into it.
#[derive(Debug)]
pub(crate) struct Out {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: OutDtype,
    pub src: Option<String>,
    pub rows: Vec<Seg>,
    pub cols: Vec<Seg>,
    pub scale: f32,
    pub offset: f32,
    pub fills: Vec<Fill>,
}

impl Out {
    pub(crate) fn zero(name: String, shape: Vec<usize>, dtype: OutDtype) -> Out {
        Out {
            name,
            shape,
            dtype,
            src: None,
            rows: Vec::new(),
            cols: Vec::new(),
            scale: 1.0,
            offset: 0.0,
            fills: Vec::new(),
        }
    }

    pub(crate) fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    fn bytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// (rows, cols) of the output, a vector being one row and a 3-D tensor
    /// its leading dimensions' rows.
    fn dims(&self) -> (usize, usize) {
        let c = self.shape.last().copied().unwrap_or(1);
        (self.numel() / c.max(1), c)
    }
}

/// Refuses a shape that narrows a width: each `(key, shape's, source's)`.
pub(crate) fn check_widens(widths: &[(&str, usize, usize)]) -> io::Result<()> {
    for &(k, n, o) in widths {
        if n < o {
            return Err(bad(format!(
                "shape {k}={n} is smaller than the source's {o}: upscale only widens"
            )));
        }
    }
    Ok(())
}

/// The bias channel `c = H` when the vocabulary grows from `v` to `v2` (see
/// the module docs), which needs the hidden width `h → h2` to grow too.
pub(crate) fn bias_channel(
    (h, h2): (usize, usize),
    (v, v2): (usize, usize),
) -> io::Result<Option<usize>> {
    let c = (v2 > v).then_some(h);
    if c.is_some() && h2 == h {
        return Err(bad(
            "padding the vocabulary needs one spare hidden channel (the padding logits' bias): widen hidden too".into(),
        ));
    }
    Ok(c)
}

/// The columns of the MTP head's `fc` (`[H, 2H]` → `[H', 2H']`): each input
/// half of `h` keeps its place, at column 0 and at `h2`.
pub(crate) fn fc_cols(h: usize, h2: usize) -> Vec<Seg> {
    vec![
        Seg {
            src: 0,
            dst: 0,
            len: h,
        },
        Seg {
            src: h,
            dst: h2,
            len: h,
        },
    ]
}

/// `fc`'s copy of the bias channel `c` from its embedding half (the first
/// in the Qwen layout, `[embed, hidden]`) into its own stream.
pub(crate) fn fc_bias(c: usize) -> Fill {
    Fill {
        rows: c..c + 1,
        col: c,
        value: FC_GAIN,
    }
}

/// How many MTP layers (`mtp.layers.{i}.*`) the source has.
pub(crate) fn mtp_layers(src: &BTreeMap<String, Src>) -> usize {
    src.keys()
        .filter_map(|k| {
            k.strip_prefix("mtp.layers.")?
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .max()
        .map_or(0, |m| m + 1)
}

/// How the source maps onto the target shape.
#[derive(Debug)]
struct Plan {
    old: Dims,
    new: Shape,
    dtype: OutDtype,
    /// `sqrt(H/H')`.
    s: f64,
    /// What q/k projections are multiplied by: `s` where exact, else 1.
    qk_scale: f32,
    /// Where the norm weights are stored.
    norm_dtype: OutDtype,
    /// The new `rms_norm_eps`.
    eps: f64,
    bias_channel: Option<usize>,
    tied: bool,
}

impl Plan {
    fn new(
        old: &Dims,
        new: &Shape,
        dtype: OutDtype,
        config: &Value,
        path: &Path,
    ) -> io::Result<Plan> {
        let too_small = [
            ("hidden", new.hidden, old.hidden),
            ("intermediate", new.intermediate, old.intermediate),
            ("layers", new.layers, old.layers),
            ("heads", new.heads, old.heads),
            ("kv_heads", new.kv_heads, old.kv_heads),
            ("vocab", new.vocab, old.vocab),
        ];
        check_widens(&too_small)?;
        if old.kv_heads == 0
            || !old.heads.is_multiple_of(old.kv_heads)
            || new.kv_heads == 0
            || !new.heads.is_multiple_of(new.kv_heads)
        {
            return Err(bad(
                "heads must be a multiple of kv_heads, in the source and the shape".into(),
            ));
        }
        let (g, g2) = (old.heads / old.kv_heads, new.heads / new.kv_heads);
        if g2 < g {
            return Err(bad(format!(
                "shape heads/kv_heads = {g2} is below the source's group of {g}: each old query head must keep its KV head"
            )));
        }
        let bias_channel = bias_channel((old.hidden, new.hidden), (old.vocab, new.vocab))?;
        let eps0 = config["rms_norm_eps"]
            .as_f64()
            .ok_or_else(|| bad(format!("{}: no `rms_norm_eps`", path.display())))?;
        let ratio = old.hidden as f64 / new.hidden as f64;
        let s = ratio.sqrt();
        // `s` is a power of two exactly when H'/H is a power of four.
        let q = new.hidden / old.hidden;
        let pow4 = new.hidden.is_multiple_of(old.hidden)
            && q.is_power_of_two()
            && q.trailing_zeros().is_multiple_of(2);
        let exact = dtype == OutDtype::F32 || pow4;
        Ok(Plan {
            old: *old,
            new: *new,
            dtype,
            s,
            qk_scale: if exact { s as f32 } else { 1.0 },
            norm_dtype: if exact { dtype } else { OutDtype::F32 },
            eps: eps0 * ratio,
            bias_channel,
            tied: config["tie_word_embeddings"] != false,
        })
    }

    fn edit_config(&self, c: &mut Value) {
        let n = &self.new;
        c["hidden_size"] = n.hidden.into();
        c["intermediate_size"] = n.intermediate.into();
        c["num_hidden_layers"] = n.layers.into();
        c["max_window_layers"] = n.layers.into();
        c["num_attention_heads"] = n.heads.into();
        c["num_key_value_heads"] = n.kv_heads.into();
        c["head_dim"] = self.old.head_dim.into();
        c["vocab_size"] = n.vocab.into();
        c["rms_norm_eps"] = self.eps.into();
        c["torch_dtype"] = self.dtype.torch_name().into();
    }

    /// Query head `i`'s new index.
    fn q_head(&self, i: usize) -> usize {
        let (g, g2) = (
            self.old.heads / self.old.kv_heads,
            self.new.heads / self.new.kv_heads,
        );
        g2 * (i / g) + i % g
    }

    fn q_segs(&self) -> Vec<Seg> {
        let d = self.old.head_dim;
        (0..self.old.heads)
            .map(|i| Seg {
                src: i * d,
                dst: self.q_head(i) * d,
                len: d,
            })
            .collect()
    }

    /// A norm over `H'`: the source's weights times `s`, plus `extra` at the bias channel.
    fn hidden_norm(&self, name: &str, extra: Option<f32>) -> Out {
        let mut o = Out::zero(name.to_owned(), vec![self.new.hidden], self.norm_dtype);
        o.src = Some(name.to_owned());
        o.rows = ident(1);
        o.cols = ident(self.old.hidden);
        o.scale = self.s as f32;
        if let (Some(c), Some(v)) = (self.bias_channel, extra) {
            o.fills.push(Fill {
                rows: 0..1,
                col: c,
                value: v,
            });
        }
        o
    }

    /// A mapped 2-D (or 1-D bias) tensor.
    fn mapped(
        &self,
        name: &str,
        shape: Vec<usize>,
        rows: Vec<Seg>,
        cols: Vec<Seg>,
        scale: f32,
    ) -> Out {
        let mut o = Out::zero(name.to_owned(), shape, self.dtype);
        o.src = Some(name.to_owned());
        o.rows = rows;
        o.cols = cols;
        o.scale = scale;
        o
    }

    /// The tensors of one decoder layer at `prefix`; zero when `zero`.
    fn layer(&self, prefix: &str, zero: bool, has: &dyn Fn(&str) -> bool) -> Vec<Out> {
        let (o, n) = (&self.old, &self.new);
        let (d, h2) = (o.head_dim, n.hidden);
        let (q2, kv2) = (n.heads * d, n.kv_heads * d);
        let p = |s: &str| format!("{prefix}.{s}");
        let mut v = vec![
            (p("input_layernorm.weight"), vec![h2]),
            (p("post_attention_layernorm.weight"), vec![h2]),
            (p("self_attn.q_proj.weight"), vec![q2, h2]),
            (p("self_attn.k_proj.weight"), vec![kv2, h2]),
            (p("self_attn.v_proj.weight"), vec![kv2, h2]),
            (p("self_attn.o_proj.weight"), vec![h2, q2]),
            (p("self_attn.q_norm.weight"), vec![d]),
            (p("self_attn.k_norm.weight"), vec![d]),
            (p("mlp.gate_proj.weight"), vec![n.intermediate, h2]),
            (p("mlp.up_proj.weight"), vec![n.intermediate, h2]),
            (p("mlp.down_proj.weight"), vec![h2, n.intermediate]),
        ];
        for b in ["q_proj", "k_proj", "v_proj"] {
            let name = p(&format!("self_attn.{b}.bias"));
            if has(&name) {
                v.push((name, vec![if b == "q_proj" { q2 } else { kv2 }]));
            }
        }
        if zero {
            return v
                .into_iter()
                .map(|(name, shape)| Out::zero(name, shape, self.dtype))
                .collect();
        }
        let (h, kvd) = (o.hidden, o.kv_heads * d);
        let qk = self.qk_scale;
        v.into_iter()
            .map(|(name, shape)| {
                let short = &name[prefix.len() + 1..];
                match short {
                    "input_layernorm.weight" | "post_attention_layernorm.weight" => {
                        self.hidden_norm(&name, None)
                    }
                    "self_attn.q_proj.weight" => {
                        self.mapped(&name, shape, self.q_segs(), ident(h), qk)
                    }
                    "self_attn.k_proj.weight" => {
                        self.mapped(&name, shape, ident(kvd), ident(h), qk)
                    }
                    "self_attn.v_proj.weight" => {
                        self.mapped(&name, shape, ident(kvd), ident(h), 1.0)
                    }
                    "self_attn.o_proj.weight" => {
                        self.mapped(&name, shape, ident(h), self.q_segs(), 1.0)
                    }
                    "self_attn.q_norm.weight" | "self_attn.k_norm.weight" => {
                        self.mapped(&name, shape, ident(1), ident(d), 1.0)
                    }
                    "mlp.gate_proj.weight" | "mlp.up_proj.weight" => {
                        self.mapped(&name, shape, ident(o.intermediate), ident(h), 1.0)
                    }
                    "mlp.down_proj.weight" => {
                        self.mapped(&name, shape, ident(h), ident(o.intermediate), 1.0)
                    }
                    "self_attn.q_proj.bias" => {
                        self.mapped(&name, shape, ident(1), self.q_segs(), qk)
                    }
                    "self_attn.k_proj.bias" => self.mapped(&name, shape, ident(1), ident(kvd), qk),
                    _ => self.mapped(&name, shape, ident(1), ident(kvd), 1.0),
                }
            })
            .collect()
    }

    /// An unembedding-shaped `[V', H']` tensor: real rows copied, and the bias
    /// channel holding `real` on real rows and `pad` on padding rows.
    fn vocab_matrix(&self, name: &str, real: Option<f32>, pad: Option<f32>) -> Out {
        let (o, n) = (&self.old, &self.new);
        let mut t = self.mapped(
            name,
            vec![n.vocab, n.hidden],
            ident(o.vocab),
            ident(o.hidden),
            1.0,
        );
        if let Some(c) = self.bias_channel {
            if let Some(v) = real {
                t.fills.push(Fill {
                    rows: 0..o.vocab,
                    col: c,
                    value: v,
                });
            }
            if let Some(v) = pad {
                t.fills.push(Fill {
                    rows: o.vocab..n.vocab,
                    col: c,
                    value: v,
                });
            }
        }
        t
    }

    /// Every output tensor, checked against the source's names and shapes.
    // Long: one arm per tensor name of the layout.
    fn tensors(&self, src: &BTreeMap<String, Src>) -> io::Result<Vec<Out>> {
        let has = |n: &str| src.contains_key(n);
        let (o, n) = (&self.old, &self.new);
        let mut outs = vec![
            self.vocab_matrix(
                "model.embed_tokens.weight",
                Some(BIAS),
                self.tied.then_some(PAD_WEIGHT),
            ),
            self.hidden_norm("model.norm.weight", Some(1.0)),
        ];
        if has("lm_head.weight") {
            outs.push(self.vocab_matrix("lm_head.weight", None, Some(PAD_WEIGHT)));
        } else if !self.tied {
            return Err(bad(
                "tie_word_embeddings is false but there is no lm_head.weight".into(),
            ));
        }
        for l in 0..n.layers {
            outs.extend(self.layer(&format!("model.layers.{l}"), l >= o.layers, &has));
        }
        if has("mtp.fc.weight") {
            let h = o.hidden;
            let mut fc = self.mapped(
                "mtp.fc.weight",
                vec![n.hidden, 2 * n.hidden],
                ident(h),
                fc_cols(h, n.hidden),
                1.0,
            );
            fc.fills.extend(self.bias_channel.map(fc_bias));
            outs.push(fc);
            outs.push(self.hidden_norm("mtp.pre_fc_norm_embedding.weight", Some(1.0)));
            outs.push(self.hidden_norm("mtp.pre_fc_norm_hidden.weight", None));
            outs.push(self.hidden_norm("mtp.norm.weight", Some(1.0)));
            for l in 0..mtp_layers(src) {
                outs.extend(self.layer(&format!("mtp.layers.{l}"), false, &has));
            }
        }
        // Every source tensor must be placed, with the shape the plan expects.
        let placed: BTreeMap<&str, &Out> = outs
            .iter()
            .filter_map(|t| Some((t.src.as_deref()?, t)))
            .collect();
        for (name, s) in src {
            let Some(t) = placed.get(name.as_str()) else {
                return Err(bad(format!(
                    "tensor {name} has no upscale rule (upscale knows Qwen3 layers and the `mtp.*` head layout)"
                )));
            };
            let (r, c) = match s.shape[..] {
                [c] => (1, c),
                [r, c] => (r, c),
                _ => return Err(bad(format!("tensor {name} is not 1-D or 2-D"))),
            };
            let fits = |segs: &[Seg], lim: usize, out_lim: usize| {
                segs.iter()
                    .all(|g| g.src + g.len <= lim && g.dst + g.len <= out_lim)
                    && segs.iter().map(|g| g.len).sum::<usize>() == lim
            };
            let (r2, c2) = t.dims();
            if !fits(&t.rows, r, r2) || !fits(&t.cols, c, c2) {
                return Err(bad(format!(
                    "tensor {name} has shape {:?}, not what config.json implies for it",
                    s.shape
                )));
            }
        }
        for t in &outs {
            if let Some(name) = &t.src
                && !src.contains_key(name)
            {
                return Err(bad(format!("the source has no tensor {name}")));
            }
        }
        Ok(outs)
    }
}

/// Writes one safetensors file; returns its data bytes. Only the non-zero
/// rows are written (into a file of the full length), so the zeros are holes.
fn write_shard(path: &Path, tensors: &[&Out], src: &BTreeMap<String, Src>) -> io::Result<u64> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0u64;
    let mut starts = Vec::new();
    for t in tensors {
        let b = t.bytes() as u64;
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype.st_name(), "shape": t.shape, "data_offsets": [offset, offset + b]}),
        );
        starts.push(offset);
        offset += b;
    }
    let mut text = serde_json::to_string(&Value::Object(header)).map_err(|e| bad(e.to_string()))?;
    while (8 + text.len()) % 8 != 0 {
        text.push(' ');
    }
    let file = File::create(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let base = 8 + text.len() as u64;
    file.set_len(base + offset)?;
    file.write_all_at(&(text.len() as u64).to_le_bytes(), 0)?;
    file.write_all_at(text.as_bytes(), 8)?;
    for (t, start) in tensors.iter().zip(starts) {
        let s = t.src.as_ref().map(|n| &src[n]);
        write_tensor(&file, base + start, t, s)?;
    }
    Ok(offset)
}

fn put(buf: &mut [u8], i: usize, v: f32, dtype: OutDtype) {
    match dtype {
        OutDtype::F32 => buf[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
        OutDtype::Bf16 => {
            let bits = v.to_bits();
            // Round to nearest, ties to even (NaN stays NaN: its high bits are kept).
            let r = if v.is_nan() {
                bits | 0x0040_0000
            } else {
                bits + 0x7FFF + ((bits >> 16) & 1)
            };
            buf[2 * i..2 * i + 2].copy_from_slice(&((r >> 16) as u16).to_le_bytes());
        }
    }
}

fn write_tensor(file: &File, base: u64, t: &Out, src: Option<&Src>) -> io::Result<()> {
    let (rows, cols) = t.dims();
    let es = t.dtype.size();
    let mut src_row = vec![usize::MAX; rows];
    if src.is_some() {
        for g in &t.rows {
            for k in 0..g.len {
                src_row[g.dst + k] = g.src + k;
            }
        }
    }
    let src_cols = src.map_or(0, |s| s.shape.last().copied().unwrap_or(1));
    // Same stored dtype and no scaling: copy bytes.
    let raw = src.is_some_and(|s| {
        t.scale == 1.0
            && t.offset == 0.0
            && matches!(
                (s.dtype, t.dtype),
                (SrcDtype::Bf16, OutDtype::Bf16) | (SrcDtype::F32, OutDtype::F32)
            )
    });
    let mut buf = vec![0u8; cols * es];
    for (r, &sr) in src_row.iter().enumerate() {
        let fills: Vec<&Fill> = t.fills.iter().filter(|f| f.rows.contains(&r)).collect();
        if sr == usize::MAX && fills.is_empty() {
            continue;
        }
        let (mut lo, mut hi) = (usize::MAX, 0);
        if let (Some(s), true) = (src, sr != usize::MAX) {
            for g in &t.cols {
                let from = sr * src_cols + g.src;
                if raw {
                    buf[g.dst * es..(g.dst + g.len) * es]
                        .copy_from_slice(&s.data[from * es..(from + g.len) * es]);
                } else {
                    for k in 0..g.len {
                        put(
                            &mut buf,
                            g.dst + k,
                            (s.get(from + k) + t.offset) * t.scale - t.offset,
                            t.dtype,
                        );
                    }
                }
                lo = lo.min(g.dst);
                hi = hi.max(g.dst + g.len);
            }
        }
        for f in fills {
            put(&mut buf, f.col, f.value, t.dtype);
            lo = lo.min(f.col);
            hi = hi.max(f.col + 1);
        }
        if lo < hi {
            file.write_all_at(&buf[lo * es..hi * es], base + ((r * cols + lo) * es) as u64)?;
            buf[lo * es..hi * es].fill(0);
        }
    }
    Ok(())
}
