"""Build a Qwen2/Qwen3 tokenizer folder without the model hub (for explain-buckets figures).

    python bench/qwen_tokenizer.py                     # -> build/bench/qwen-tokenizer
    specdraft explain-buckets examples/qwen3-8b-dflash2-8192.toml \
        --set data.tokenizer=build/bench/qwen-tokenizer --suggest 4

Qwen's byte-level BPE ranks ship inside the `dashscope` package (`qwen.tiktoken`, the 151,643
regular tokens of Qwen2 and Qwen3). This script fetches that wheel with `pip download --no-deps`
(from the package registry, not the hub), converts the ranks with transformers'
`TikTokenConverter` (needs `tiktoken`, a bench-only dependency) using Qwen's pre-tokenizer
pattern and NFC normalisation, appends the chat special tokens at Qwen's ids and saves a HF
tokenizer folder with the Qwen (ChatML) chat template. It checks the result against known Qwen
encodings before saving.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "build" / "bench" / "qwen-tokenizer"
DEFAULT_WHEELS = REPO_ROOT / "build" / "bench" / "dashscope"
RANKS_IN_WHEEL = "dashscope/resources/qwen.tiktoken"

# Qwen2/Qwen3's pre-tokenizer split: like cl100k's, but digits are split one by one.
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
REGULAR_VOCAB = 151643
# The chat specials, appended right after the regular vocabulary as in Qwen.
SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
# Known encodings of the Qwen2/Qwen3 tokenizer, checked before the folder is written.
KNOWN_ENCODINGS = {"Hello world": [9707, 1879]}


class TokenizerBuildError(RuntimeError):
    """The Qwen tokenizer could not be built or does not encode as Qwen does."""


def dashscope_wheel(wheel_dir: Path) -> Path:
    """The dashscope wheel in `wheel_dir`, downloaded with pip (no dependencies) when missing."""
    wheels = sorted(wheel_dir.glob("dashscope-*.whl"))
    if not wheels:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "dashscope", "--no-deps"]
        command += ["--only-binary=:all:", "-d", str(wheel_dir), "-q"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wheels = sorted(wheel_dir.glob("dashscope-*.whl"))
        if done.returncode != 0 or not wheels:
            raise TokenizerBuildError(
                f"`{' '.join(command)}` failed ({done.stderr.strip()[-300:]}); put a dashscope "
                f"wheel into {wheel_dir} by hand, or pass --wheel-dir"
            )
    return wheels[-1]


def extract_ranks(wheel: Path, out_dir: Path) -> Path:
    """Copy `qwen.tiktoken` out of the wheel; return its path."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(RANKS_IN_WHEEL)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise TokenizerBuildError(
            f"{wheel}: no {RANKS_IN_WHEEL} in it ({exc}); use a dashscope release that ships "
            "the Qwen ranks"
        ) from exc
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "qwen.tiktoken"
    path.write_bytes(data)
    return path


def convert(ranks_path: Path) -> object:
    """A `PreTrainedTokenizerFast` with Qwen's vocabulary, specials and chat template."""
    try:
        import tiktoken  # noqa: F401 - TikTokenConverter reads the ranks through it
    except ImportError as exc:
        raise TokenizerBuildError(
            "converting the Qwen ranks needs tiktoken (a bench-only dependency): "
            "pip install tiktoken"
        ) from exc
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from specdraft.trainer.data import QWEN_CHAT_TEMPLATE

    backend = TikTokenConverter(vocab_file=str(ranks_path), pattern=QWEN_PATTERN).converted()
    backend.normalizer = normalizers.NFC()
    if backend.get_vocab_size() != REGULAR_VOCAB:
        raise TokenizerBuildError(
            f"{ranks_path}: {backend.get_vocab_size()} BPE ranks, Qwen has {REGULAR_VOCAB}"
        )
    # Added in id order, so each lands on the next free id: Qwen's.
    for token in sorted(SPECIALS, key=SPECIALS.get):
        backend.add_special_tokens([AddedToken(token, special=True, normalized=False)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=QWEN_CHAT_TEMPLATE,
        model_max_length=131072,
    )


def check_qwen_encodings(tokenizer: object) -> None:
    """Raise unless the tokenizer encodes the known strings and specials as Qwen does."""
    for text, ids in KNOWN_ENCODINGS.items():
        got = tokenizer.encode(text, add_special_tokens=False)
        if got != ids:
            raise TokenizerBuildError(f"{text!r} encodes to {got}, Qwen gives {ids}")
    for token, token_id in SPECIALS.items():
        got = tokenizer.convert_tokens_to_ids(token)
        if got != token_id:
            raise TokenizerBuildError(f"{token} has id {got}, Qwen's is {token_id}")


def build_qwen_tokenizer(out: Path, wheel_dir: Path) -> Path:
    """Build, check and save the Qwen tokenizer folder; return it."""
    ranks = extract_ranks(dashscope_wheel(wheel_dir), wheel_dir)
    tokenizer = convert(ranks)
    check_qwen_encodings(tokenizer)
    tokenizer.save_pretrained(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="tokenizer folder to write")
    parser.add_argument(
        "--wheel-dir", type=Path, default=DEFAULT_WHEELS, help="where the dashscope wheel is"
    )
    args = parser.parse_args(argv)
    try:
        folder = build_qwen_tokenizer(args.out, args.wheel_dir)
    except TokenizerBuildError as exc:
        print(f"qwen_tokenizer: {exc}", file=sys.stderr)
        return 2
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
