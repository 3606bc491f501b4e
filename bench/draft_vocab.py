"""Draft vocabulary vs full vocabulary: step time and peak memory per family and size, one run.

    python bench/draft_vocab.py                          # both parts below
    python bench/draft_vocab.py --part medium --rounds 4  # the medium CPU preset only

- medium: a random Qwen3 target of the medium CPU preset (H 512, I 1536, V 32000; 2 rows x
  1024 tokens, 32 anchors, block 16, fp32), every family at the full vocabulary and at draft
  vocabularies of 8k and 16k tokens (32k is the whole vocabulary here);
- real: the real target SmolLM2-135M-Instruct (V 49152) with the recipe's plain DFlash draft
  (1 layer, block 8, 32 anchors, 4 rows of its regenerated answers and their real features,
  cached by bench/real_target_ablation.py), at the full vocabulary and at 8k, 16k and 28,096
  (the size `specdraft explain-vocab` suggests for 98% of held-out labels).

A step is forward + backward + AdamW, as the trainer runs it (the model's own forward and
objective; no data pipeline). Each case runs in a fresh child process, so its peak memory is its
own: `peak MiB` is the peak resident set during two steps above the resident set before the
first step (the model and the batch are in it), read from ru_maxrss. Step times are measured
in one process per family, its sizes taking turns each round (the median of --rounds), so load
from other work falls on every size alike; the ratios are to the full-vocabulary case. The draft
vocabulary is the first D token ids on the random target and the most frequent supervised labels
(as training chooses them) on the real one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
MEDIUM_SIZES = (None, 8192, 16384)
REAL_SIZES = (None, 8192, 16384, 28096)
FAMILIES = ("dflash", "dflash2", "dspark")
REAL_FEATURES = ROOT / "build" / "bench" / "real_target" / "features-train-333.pt"


def rss_mib() -> float:
    """This process's resident set now (MiB), from /proc."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    """This process's peak resident set so far (MiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def medium_case(family: str, size: int | None):
    """(draft, head, batch, spec) of the medium preset on a random target."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from specdraft.config.schema import ModelConfig
    from specdraft.trainer.models import (
        DraftTrainSpec,
        build_draft,
        load_target_config,
        load_target_head,
    )

    torch.manual_seed(0)
    hidden, vocab, rows, length = 512, 32000, 2, 1024
    folder = tempfile.mkdtemp(prefix="draft-vocab-bench-")
    Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=1536, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=4, head_dim=64, tie_word_embeddings=False,
        )
    ).save_pretrained(folder)  # fmt: skip
    options = {
        "dflash2": {"dflash2": {"selector_gold_policy": "insert"}},
        "dspark": {"dspark": {"markov_type": "vanilla"}},
    }.get(family, {})
    cfg = ModelConfig(
        target=folder, algorithm=family, block_size=16, num_draft_layers=1,
        target_layer_ids=[0, 2], mask_token_id=vocab - 1, dtype="float32",
        draft_vocab_size=size, **options,
    )  # fmt: skip
    head = load_target_head(folder, torch.float32)
    ids = None if size is None else list(range(size))
    draft = build_draft(cfg, load_target_config(folder), dtype=torch.float32, draft_vocab=ids)
    draft.init_draft_head(head)
    batch = {
        "input_ids": torch.randint(0, vocab - 1, (rows, length)),
        "loss_mask": torch.ones(rows, length, dtype=torch.long),
        "hidden_states": torch.randn(rows, length, 2 * hidden),
        "target_last_hidden_states": torch.randn(rows, length, hidden),
        "sample_id": torch.arange(rows),
    }
    return draft, head, batch, DraftTrainSpec(num_anchors=32, loss_decay_gamma=7.0)


def real_case(family: str, size: int | None):
    """(draft, head, batch, spec) of the SmolLM2 recipe on 4 rows of real features."""
    from specdraft.config import load_config
    from specdraft.trainer.assets import build_smollm2_target
    from specdraft.trainer.models import (
        DraftTrainSpec,
        build_draft,
        load_target_config,
        load_target_head,
    )
    from specdraft.trainer.vocab import choose_draft_vocab, supervised_token_counts

    target = build_smollm2_target()
    data = torch.load(REAL_FEATURES)
    config = load_config(
        ROOT / "examples" / "smollm2-135m-dflash.toml",
        [f"model.target={json.dumps(str(target))}", f"model.algorithm={json.dumps(family)}"]
        + ([] if size is None else [f"model.draft_vocab_size={size}"]),
    )
    head = load_target_head(target, torch.float32)
    ids = None
    if size is not None:
        counts = supervised_token_counts(
            data["ids"].flatten(), data["loss_mask"].flatten(), head.vocab_size
        )
        ids = choose_draft_vocab(counts, size).ids
    torch.manual_seed(0)
    draft = build_draft(
        config.model, load_target_config(target), dtype=torch.float32, draft_vocab=ids
    )
    draft.init_draft_head(head)
    rows = [0, 1, 2, 3]
    batch = {
        "input_ids": data["ids"][rows],
        "loss_mask": data["loss_mask"][rows],
        "hidden_states": data["h"][rows].float(),
        "sample_id": torch.tensor(rows),
    }
    del data
    return draft, head, batch, DraftTrainSpec(num_anchors=32, loss_decay_gamma=4.0)


def train_step(draft, head, batch, spec, optimizer, step: int) -> float:
    """One forward + backward + AdamW step; its wall time."""
    started = time.perf_counter()
    out = draft(batch, head, spec.for_epoch(step))
    (out.numerator / out.denominator).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def build(part: str, family: str, size: int | None):
    """A case's (draft, head, batch, spec, optimizer)."""
    draft, head, batch, spec = (medium_case if part == "medium" else real_case)(family, size)
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-4)
    return draft, head, batch, spec, optimizer


def memory_case(part: str, family: str, size: int | None) -> dict:
    """Peak resident memory of two steps of one case, above the memory before its first step."""
    case = build(part, family, size)
    before = rss_mib()
    for step in range(2):
        train_step(*case, step)
    draft, head = case[0], case[1]
    rows = head.vocab_size if draft.lm_head is None else draft.lm_head.weight.shape[0]
    return {"peak_mib": peak_rss_mib() - before, "head_rows": rows}


def time_family(part: str, family: str, sizes: tuple, rounds: int) -> dict:
    """Median step time of every size of a family, the sizes taking turns each round (so the
    machine's load, shared with other work, falls on all of them alike)."""
    cases = {size: build(part, family, size) for size in sizes}
    times: dict = {size: [] for size in sizes}
    for step in range(rounds + 1):  # round 0 allocates the optimizer state: not timed
        for size, case in cases.items():
            seconds = train_step(*case, step)
            if step:
                times[size].append(seconds)
    return {str(size or 0): statistics.median(values) for size, values in times.items()}


def child(*args: str) -> dict:
    """Run this script's `--case` mode in a fresh process; its JSON answer."""
    command = [sys.executable, __file__, "--case", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"case {args} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    """Run the cases and print one table of ratios to the full vocabulary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("medium", "real", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=4, help="timed steps per case (median)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.case:
        mode, part, family, *sizes = args.case
        sizes = tuple(int(size) or None for size in sizes)
        if mode == "time":
            print(json.dumps(time_family(part, family, sizes, args.rounds)))
        else:
            print(json.dumps(memory_case(part, family, sizes[0])))
        return
    groups = []
    if args.part in ("medium", "both"):
        groups += [("medium", family, MEDIUM_SIZES) for family in FAMILIES]
    if args.part in ("real", "both"):
        groups += [("real", "dflash", REAL_SIZES)]
    rows = []
    for part, family, sizes in groups:
        names = [str(size or 0) for size in sizes]
        times = child("time", part, family, *names, "--rounds", str(args.rounds))
        for size, name in zip(sizes, names, strict=True):
            memory = child("memory", part, family, name)
            rows.append({"part": part, "family": family, "size": size, **memory,
                         "s_per_step": times[name]})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'preset':<7} {'family':<8} {'vocab':>7} {'s/step':>7} {'speedup':>8} "
          f"{'peak MiB':>9} {'vs full':>8}")  # fmt: skip
    full = {}
    for r in rows:
        key = (r["part"], r["family"])
        if r["size"] is None:
            full[key] = r
        base = full[key]
        print(
            f"{r['part']:<7} {r['family']:<8} {r['head_rows']:>7} {r['s_per_step']:>7.3f} "
            f"{base['s_per_step'] / r['s_per_step']:>7.2f}x {r['peak_mib']:>9.0f} "
            f"{r['peak_mib'] / max(base['peak_mib'], 1e-9):>7.2f}x"
        )


if __name__ == "__main__":
    main()
