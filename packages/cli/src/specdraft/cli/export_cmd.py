"""`specdraft export CHECKPOINT --out DIR`: a HF draft folder for SGLang and from_pretrained."""

from __future__ import annotations

import click


@click.command("export")
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False, path_type=str))
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=str),
    help="Folder to write config.json and model.safetensors into.",
)
@click.option(
    "--dtype",
    type=click.Choice(["bfloat16", "float16", "float32"]),
    default=None,
    help="Weight dtype (default: model.dtype of the run that made the checkpoint).",
)
def export(checkpoint: str, out: str, dtype: str | None) -> None:
    """Export a training checkpoint (checkpoints/step-*) as a HF-style draft folder.

    \b
    The folder holds config.json (architecture, block_size, target_layer_ids, mask_token_id,
    dtype matching the weights) and model.safetensors. Point SGLang's speculative decoding at it:
      python -m sglang.launch_server --model-path TARGET \\
        --speculative-algorithm DFLASH --speculative-draft-model-path OUT   (DSPARK for DSpark)
    """
    from specdraft.trainer.train.export import ExportError, export_checkpoint

    try:
        path = export_checkpoint(checkpoint, out, dtype=dtype)
    except ExportError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"exported {checkpoint} -> {path}")
