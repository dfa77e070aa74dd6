#!/usr/bin/env python3
"""Rebuild the tiny-model training corpus, tokenizer and token streams, exactly.

Pipeline (all outputs under --data, default xtask/train/data/, which git ignores):

  1. download   `pip download NAME==VERSION --no-deps --only-binary=:all:` for every
                package pinned in xtask/train/corpus.lock, into --cache
                (default xtask/train/.cache/wheels/), and check each archive's sha256
                against the lock (a mismatch is an error).
  2. extract    every `*.py` member of each wheel (zip), in lock order then sorted
                path order; a file is kept when it decodes as UTF-8, is 64 B..512 KiB,
                and contains none of the special-token strings.
  3. split      BY FILE with random.Random(SEED) into train (98 %) and held-out (2 %);
                documents are joined with "<|endoftext|>" -> train.txt, heldout.txt.
  4. tokenizer  byte-level BPE (HF `tokenizers`), vocab 8192, special tokens
                <|endoftext|>=0, <|im_start|>=1, <|im_end|>=2, trained on train.txt
                -> tokenizer.json
  5. tokenize   train.txt / heldout.txt -> train.bin / heldout.bin (uint16, little endian)
                plus train.txt.xz / heldout.txt.xz (what travels to the GPU machine) and
                manifest.json (sizes and sha256 of every output).

`--write-lock` (maintainers only) resolves the pinned list below, downloads, and
(re)writes corpus.lock with the archive names and sha256 sums. Normal use verifies.

Usage:
  python3 xtask/train/build_corpus.py                 # steps 1-5, verify against the lock
  python3 xtask/train/build_corpus.py --check-only    # also compare manifest to corpus.lock
Needs: pip (for `pip download`), tokenizers, numpy.
"""
import argparse
import hashlib
import json
import lzma
import os
import random
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
LOCK = os.path.join(HERE, "corpus.lock")
SEED = 1234
HELDOUT_FRACTION = 0.02
VOCAB = 8192
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MIN_BYTES, MAX_BYTES = 64, 512 * 1024

# The pinned package list (name, version). Only used by --write-lock; the lock is the truth.
PINNED = [
    ("sympy", "1.13.3"),
    ("Django", "5.1.4"),
    ("networkx", "3.4.2"),
    ("Twisted", "24.11.0"),
    ("pygments", "2.18.0"),
    ("setuptools", "75.6.0"),
    ("pip", "24.3.1"),
    ("sphinx", "8.1.3"),
    ("docutils", "0.21.2"),
    ("hypothesis", "6.122.3"),
    ("pylint", "3.3.2"),
    ("astroid", "3.3.6"),
    ("rich", "13.9.4"),
    ("werkzeug", "3.1.3"),
    ("flask", "3.1.0"),
    ("requests", "2.32.3"),
    ("jinja2", "3.1.4"),
    ("click", "8.1.7"),
    ("pytest", "8.3.4"),
    ("ansible-core", "2.18.1"),
    ("nltk", "3.9.1"),
    ("dask", "2024.12.0"),
    ("xarray", "2024.11.0"),
    ("openpyxl", "3.1.5"),
    ("sqlparse", "0.5.3"),
    ("scrapy", "2.12.0"),
    ("attrs", "24.2.0"),
    ("boltons", "24.1.0"),
    ("sqlalchemy", "2.0.36"),
    ("pandas", "2.2.3"),
]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(b):
    return hashlib.sha256(b).hexdigest()


def pip_download(name, version, dest):
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux2014_x86_64",
           "--platform", "manylinux_2_17_x86_64", "--platform", "any", "-d", dest, f"{name}=={version}"]
    subprocess.run(cmd, check=True)


def find_archive(dest, name, version):
    norm = name.lower().replace("-", "_")
    for fn in sorted(os.listdir(dest)):
        low = fn.lower()
        if low.startswith(f"{norm}-{version}-") and low.endswith(".whl"):
            return fn
    raise FileNotFoundError(f"no wheel for {name}=={version} in {dest}")


def read_lock():
    with open(LOCK) as f:
        return json.load(f)


def write_lock(cache):
    os.makedirs(cache, exist_ok=True)
    pkgs = []
    for name, version in PINNED:
        pip_download(name, version, cache)
        fn = find_archive(cache, name, version)
        pkgs.append({"name": name, "version": version, "archive": fn,
                     "sha256": sha256_file(os.path.join(cache, fn))})
        print(f"locked {name}=={version} {fn}", flush=True)
    lock = {"comment": "Pinned PyPI wheels whose *.py sources form the tiny-model corpus. "
                       "Rebuild: python3 xtask/train/build_corpus.py",
            "seed": SEED, "heldout_fraction": HELDOUT_FRACTION, "vocab_size": VOCAB,
            "packages": pkgs}
    with open(LOCK, "w") as f:
        json.dump(lock, f, indent=1)
        f.write("\n")
    return lock


def fetch(lock, cache):
    os.makedirs(cache, exist_ok=True)
    for p in lock["packages"]:
        path = os.path.join(cache, p["archive"])
        if not os.path.exists(path):
            pip_download(p["name"], p["version"], cache)
        got = sha256_file(path)
        if got != p["sha256"]:
            sys.exit(f"sha256 mismatch for {p['archive']}: lock {p['sha256']} got {got}")
    print(f"verified {len(lock['packages'])} archives against corpus.lock", flush=True)


def extract(lock, cache):
    docs = []  # (package, path, text)
    stats = {}
    for p in lock["packages"]:
        n = nb = 0
        with zipfile.ZipFile(os.path.join(cache, p["archive"])) as z:
            for member in sorted(z.namelist()):
                if not member.endswith(".py"):
                    continue
                raw = z.read(member)
                if not (MIN_BYTES <= len(raw) <= MAX_BYTES):
                    continue
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                if any(s in text for s in SPECIALS):
                    continue
                text = text.replace("\r\n", "\n")
                docs.append((p["name"], member, text))
                n += 1
                nb += len(text.encode("utf-8"))
        stats[f"{p['name']}=={p['version']}"] = {"files": n, "bytes": nb}
    return docs, stats


def train_tokenizer(train_txt, out_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    # Feed the training text document by document (deterministic order).
    with open(train_txt, encoding="utf-8") as f:
        docs = f.read().split(SPECIALS[0])
    tok.train_from_iterator(docs, trainer=trainer)
    assert [tok.token_to_id(s) for s in SPECIALS] == [0, 1, 2], "special token ids"
    tok.save(out_path)
    return tok


def tokenize(tok, txt_path, bin_path):
    import numpy as np
    with open(txt_path, encoding="utf-8") as f:
        docs = f.read().split(SPECIALS[0])
    eot = tok.token_to_id(SPECIALS[0])
    ids = []
    B = 2048
    for i in range(0, len(docs), B):
        for enc in tok.encode_batch(docs[i:i + B], add_special_tokens=False):
            ids.extend(enc.ids)
            ids.append(eot)
    arr = np.asarray(ids, dtype=np.uint16)
    arr.astype("<u2").tofile(bin_path)
    return arr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(HERE, "data"), help="output folder")
    ap.add_argument("--cache", default=os.path.join(HERE, ".cache", "wheels"), help="download cache")
    ap.add_argument("--write-lock", action="store_true", help="(maintainers) re-resolve and rewrite corpus.lock")
    ap.add_argument("--skip-tokenizer", action="store_true", help="stop after writing train.txt/heldout.txt")
    args = ap.parse_args()

    lock = write_lock(args.cache) if args.write_lock else read_lock()
    fetch(lock, args.cache)
    docs, stats = extract(lock, args.cache)
    rng = random.Random(lock["seed"])
    idx = list(range(len(docs)))
    rng.shuffle(idx)
    n_held = max(1, int(round(len(docs) * lock["heldout_fraction"])))
    held_idx, train_idx = sorted(idx[:n_held]), idx[n_held:]  # train order = shuffled
    os.makedirs(args.data, exist_ok=True)
    outs = {}
    for split, ids in (("train", train_idx), ("heldout", held_idx)):
        text = SPECIALS[0].join(docs[i][2] for i in ids)
        path = os.path.join(args.data, f"{split}.txt")
        data = text.encode("utf-8")
        with open(path, "wb") as f:
            f.write(data)
        with lzma.open(path + ".xz", "wb", preset=9) as f:
            f.write(data)
        outs[f"{split}.txt"] = {"files": len(ids), "bytes": len(data), "sha256": sha256_bytes(data)}
        print(f"{split}: {len(ids)} files, {len(data)/1e6:.1f} MB", flush=True)
    with open(os.path.join(args.data, "heldout_files.txt"), "w") as f:
        for i in held_idx:
            f.write(f"{docs[i][0]}\t{docs[i][1]}\n")
    manifest = {"packages": stats, "outputs": outs}
    if not args.skip_tokenizer:
        tok = train_tokenizer(os.path.join(args.data, "train.txt"), os.path.join(args.data, "tokenizer.json"))
        manifest["outputs"]["tokenizer.json"] = {"sha256": sha256_file(os.path.join(args.data, "tokenizer.json"))}
        for split in ("train", "heldout"):
            arr = tokenize(tok, os.path.join(args.data, f"{split}.txt"), os.path.join(args.data, f"{split}.bin"))
            manifest["outputs"][f"{split}.bin"] = {"tokens": int(arr.size),
                                                   "sha256": sha256_file(os.path.join(args.data, f"{split}.bin"))}
            print(f"{split}: {arr.size} tokens", flush=True)
    with open(os.path.join(args.data, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    expected = lock.get("expected_outputs")
    if expected:
        bad = [k for k, v in expected.items() if manifest["outputs"].get(k, {}).get("sha256") != v]
        print("outputs match corpus.lock" if not bad else f"OUTPUT MISMATCH vs corpus.lock: {bad}")
        if bad:
            sys.exit(1)


if __name__ == "__main__":
    main()
