"""How far one draft step is from its FLOP bound on this machine, per family, and where it goes.

    python bench/flop_bound.py                   # medium size: H 512, I 1536, V 32000, 1 layer
    python bench/flop_bound.py --steps 5 --profile

Builds a random Qwen3 target of the given size, then for each family times forward + backward
of one micro-batch (B rows x S tokens, N anchors, block 16, fp32, CPU), counts its model FLOPs
(train/flops.py) and prints the step against the FLOP-bound time at the GEMM probe's rate
(train/peak.py): ratio = step / (model FLOPs / probe rate), MFU = its inverse. With --profile,
the operators that take the most time in one step (the part of the step that keeps it from the
bound). Report the machine's load (uptime) next to the figures: the probe and the step share it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

FAMILIES = ("dflash", "dflash2", "dspark")


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--anchors", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per family (median)")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--profile", action="store_true", help="top operators of one step")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Time each family's step and print it against the FLOP bound."""
    args = build_parser().parse_args(argv)
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from specdraft.config.schema import ModelConfig
    from specdraft.trainer.models import (
        DraftTrainSpec,
        build_draft,
        load_target_config,
        load_target_head,
    )
    from specdraft.trainer.train.flops import format_flops, micro_batch_flops
    from specdraft.trainer.train.peak import probe_tflops

    torch.manual_seed(0)
    hidden, vocab = args.hidden, args.vocab
    target = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=4,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 128),
        head_dim=64,
        tie_word_embeddings=False,
    )
    folder = tempfile.mkdtemp(prefix="flop-bound-")
    Qwen3ForCausalLM(target).save_pretrained(folder)
    rows, length = args.rows, args.length
    batch = {
        "input_ids": torch.randint(0, vocab - 1, (rows, length)),
        "loss_mask": torch.ones(rows, length, dtype=torch.long),
        "hidden_states": torch.randn(rows, length, 2 * hidden),
        "target_last_hidden_states": torch.randn(rows, length, hidden),
        "sample_id": torch.arange(rows),
    }
    spec = DraftTrainSpec(num_anchors=args.anchors, loss_decay_gamma=7.0)
    rate = probe_tflops("cpu", torch.float32) * 1e12
    print(f"load: {os.getloadavg()[0]:.2f} (1 min), threads {torch.get_num_threads()}")
    print(f"GEMM probe: {rate / 1e9:.0f} GFLOP/s (fp32, best of its repeats)")
    print("| family | step (median) | model FLOPs | recomputed | FLOP bound | step / bound | MFU |")
    print("|---|---|---|---|---|---|---|")
    head = load_target_head(folder, torch.float32)
    for family in args.families.split(","):
        model_cfg = ModelConfig(
            target=folder,
            algorithm=family,
            block_size=16,
            num_draft_layers=1,
            target_layer_ids=[0, 2],
            mask_token_id=vocab - 1,
            dflash2={"selector_gold_policy": "exclude"},
        )
        draft = build_draft(model_cfg, load_target_config(folder), dtype=torch.float32)

        def step(draft=draft) -> None:
            draft(batch, head, spec).numerator.backward()

        step()  # warm-up
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        flops = micro_batch_flops(draft.config, rows, length, args.anchors)
        median = statistics.median(times)
        bound = flops.model / rate
        print(
            f"| {family} | {median * 1e3:.0f} ms | {format_flops(flops.model)} | "
            f"{format_flops(flops.recomputed)} | {bound * 1e3:.0f} ms | {median / bound:.2f} | "
            f"{100 * bound / median:.1f}% |"
        )
        if args.profile:
            from torch.profiler import profile

            with profile() as prof:
                step()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
