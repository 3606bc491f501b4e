"""`specdraft export CHECKPOINT --out DIR [--format sglang|vllm|speculators]`: a draft folder;
`--format gguf --verifier TARGET_DIR --out draft.gguf`: one GGUF file for llama.cpp."""

from __future__ import annotations

import click

FORMAT_NAMES = ("sglang", "vllm", "speculators", "gguf")


class RefusedExport(click.ClickException):
    """A usage error of export (occupied --out, a head the engine cannot build): exit 2."""

    exit_code = 2


@click.command("export")
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False, path_type=str))
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=str),
    help="Folder to write config.json and model.safetensors into (empty or new); for --format "
    "gguf the .gguf file to write.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMAT_NAMES),
    default="sglang",
    show_default=True,
    help="Whose loader reads the export: SGLang, vLLM 0.32, speculators 0.9.0, or llama.cpp "
    "(gguf: one file).",
)
@click.option(
    "--dtype",
    type=click.Choice(["bfloat16", "float16", "float32"]),
    default=None,
    help="Weight dtype (default: model.dtype of the run that made the checkpoint).",
)
@click.option(
    "--verifier",
    metavar="NAME_OR_PATH",
    default=None,
    help="The target the draft serves with: recorded by --format speculators (a hub id or a "
    "local folder; required there); read by --format gguf (its local HF folder; required there).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace the draft files of a non-empty --out, or an existing .gguf file (a folder "
    "holding another model, or a path inside one, is refused even so).",
)
def export(
    checkpoint: str, out: str, fmt: str, dtype: str | None, verifier: str | None, force: bool
) -> None:
    """Export a training checkpoint (checkpoints/step-*) as a draft folder for serving.

    \b
    sglang       config.json as SGLang reads it (nested dflash_config, top-level fallbacks)
      python -m sglang.launch_server --model-path TARGET \\
        --speculative-algorithm DFLASH --speculative-draft-model-path OUT   (DSPARK for DSpark)
    vllm         the layout of vLLM 0.32's qwen3_dflash / qwen3_dflash2 / qwen3_dspark loaders
      LLM(model=TARGET, speculative_config={"method": "dflash", "model": OUT,
          "num_speculative_tokens": block_size - 1})            ("dspark", block_size for DSpark)
    speculators  speculators 0.9.0's self-describing config (needs --verifier TARGET)
    gguf         one file, by llama.cpp's own converter (needs --verifier TARGET_DIR and
                 `bash scripts/llama_cpp_build.sh`); --out is the file (draft.gguf)
      llama-server -m TARGET.gguf -md draft.gguf --spec-type draft-dflash   (draft-dspark)

    \b
    The weights are the same tensors in every format (vllm leaves out any its loader does not
    read). A non-empty --out is refused unless --force; a folder holding a model that is not a
    draft (such as the target's) is always refused. A draft the engine cannot load (for gguf:
    a DSpark confidence head without the Markov features, a Markov head other than vanilla)
    is refused with the option that fixes it. Exit 2 for such refusals.
    """
    from specdraft.trainer.export import ExportError, ExportRefused, export_checkpoint

    try:
        result = export_checkpoint(
            checkpoint, out, dtype=dtype, format=fmt, force=force, verifier=verifier
        )
    except ExportRefused as exc:
        raise RefusedExport(str(exc)) from None
    except ExportError as exc:
        raise click.ClickException(str(exc)) from None
    if result.left_out:
        click.echo(
            f"left out {len(result.left_out)} tensor(s) the {fmt} loader does not read: "
            + ", ".join(result.left_out[:5])
        )
    click.echo(f"exported {checkpoint} -> {result.path} ({fmt})")
