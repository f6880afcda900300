"""A random-weight Chinese BERT as a Hugging Face folder, and a check that bertkit loads it
with transformers' outputs (issue 50, item 7).

No Chinese pretrained weights are available offline, so bertkit and transformers are compared
from the same random weights with bert-base-chinese's vocabulary (`zh_vocab/vocab.txt`, 21,128
pieces). The model is small so that many CPU runs fit: 2 layers, hidden 256, 4 heads,
intermediate 1024, 512 positions (BERT-base has 12 / 768 / 12 / 3072). Weights come from
transformers' own initializer under `torch.manual_seed(--seed)` (default 0); the folder holds
`config.json`, `model.safetensors`, `vocab.txt` and `tokenizer_config.json` with
`do_lower_case: true` (the vocabulary has no capital letters; the Hub's bert-base-chinese says
false, see issue 50).

Two halves, each in its own interpreter:

    make   (the torch venv, `--python`): writes the folder and transformers' sequence output
           (`BertModel`, eval mode) on a few Chinese / mixed-script sentences;
    check  (bertkit's venv, this process): loads the folder as `backbone.preset`, tokenizes the
           same sentences with bertkit's tokenizer, asserts its ids equal transformers', runs
           the backbone and prints the largest absolute difference of the sequence outputs
           (it fails above `--tolerance`, default 1e-4).

    python benchmarks/chinese_bert.py --python /work/venv-torch/bin/python --out /tmp/zh-bert

Run with the torch interpreter and `make` it only writes the folder (what `chinese.py` calls).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

DEFAULT_VOCAB = Path(__file__).resolve().parents[1].parent / "shared/data/zh_vocab/vocab.txt"
SIZES = {
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "intermediate_size": 1024,
    "max_position_embeddings": 512,
}
SENTENCES = [
    "北京大学的李明在上海参加了2018年的CMRC比赛。",
    "《三体》的作者刘慈欣获得雨果奖，DOTA2 职业选手 Riddick 在 01:29 登场。",
    "中國人民銀行今天宣布降息，台北市政府表示歡迎",
    "我爱自然语言处理",
]


def make(out: Path, vocab: Path, seed: int) -> None:
    """Writes the folder and `reference_outputs.json` beside it (torch venv only)."""
    import torch
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.txt").write_bytes(vocab.read_bytes())
    torch.manual_seed(seed)
    vocab_size = len(vocab.read_text(encoding="utf-8").rstrip("\n").split("\n"))
    config = transformers.BertConfig(vocab_size=vocab_size, **SIZES)
    model = transformers.BertModel(config, add_pooling_layer=True).eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer_config = {"do_lower_case": True, "tokenizer_class": "BertTokenizer"}
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    tokenizer = transformers.BertTokenizerFast(str(out / "vocab.txt"), do_lower_case=True)
    encoded = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        sequence = model(**encoded).last_hidden_state.numpy()
    lengths = encoded["attention_mask"].sum(dim=1).tolist()
    reference = {
        "seed": seed,
        "token_ids": [
            ids[:n] for ids, n in zip(encoded["input_ids"].tolist(), lengths, strict=True)
        ],
        "sequence_output": [row[:n].tolist() for row, n in zip(sequence, lengths, strict=True)],
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    (out.parent / f"{out.name}.reference_outputs.json").write_text(json.dumps(reference))
    print(f"wrote {out} ({sum(p.numel() for p in model.parameters()):,} parameters)")


def check(out: Path, tolerance: float) -> float:
    """bertkit's ids and sequence output against transformers'; the max abs difference."""
    import numpy as np

    from bertkit.model.backbone import load_pretrained

    reference = json.loads((out.parent / f"{out.name}.reference_outputs.json").read_text())
    loaded = load_pretrained(str(out), sequence_length=128)
    worst = 0.0
    for text, ids, expected in zip(
        SENTENCES, reference["token_ids"], reference["sequence_output"], strict=True
    ):
        ours, _ = loaded.tokenizer.encode([text], sequence_length=128)
        if ours[0].tolist() != ids:
            raise SystemExit(f"token ids differ on {text!r}: {ours[0].tolist()} vs {ids}")
        inputs = {
            "token_ids": ours[0][None, :],
            "segment_ids": np.zeros_like(ours[0])[None, :],
            "padding_mask": np.ones_like(ours[0])[None, :],
        }
        sequence = np.asarray(loaded.backbone(inputs)["sequence_output"])[0]
        worst = max(worst, float(np.abs(sequence - np.asarray(expected)).max()))
    print(
        f"bertkit vs transformers {reference['transformers']}: same token ids on "
        f"{len(SENTENCES)} sentences; sequence output max abs diff {worst:.2e}"
    )
    if worst > tolerance:
        raise SystemExit(f"max abs diff {worst:.2e} is over the tolerance {tolerance:.0e}")
    return worst


def build(python: str, out: Path, vocab: Path = DEFAULT_VOCAB, seed: int = 0) -> None:
    """Runs `make` in `python` (the torch venv)."""
    argv = [python, __file__, "make", "--out", str(out), "--vocab", str(vocab), "--seed", str(seed)]
    subprocess.run(argv, check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=["make", "check", "both"], default="both")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write / check")
    parser.add_argument("--vocab", type=Path, default=DEFAULT_VOCAB)
    parser.add_argument("--seed", type=int, default=0, help="torch's seed for the weights")
    parser.add_argument("--python", default="python3", help="the torch venv's interpreter")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args()
    if args.command == "make":
        return make(args.out, args.vocab, args.seed)
    if args.command == "both":
        build(args.python, args.out, args.vocab, args.seed)
    sys.path.insert(0, str(Path(__file__).parent))
    import common  # noqa: F401 (TensorFlow's environment before bertkit loads)

    check(args.out, args.tolerance)


if __name__ == "__main__":
    main()
