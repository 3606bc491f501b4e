"""The child process that runs llama.cpp's own HF -> GGUF converter (`convert_hf_to_gguf.py`).

Run as a script by the Python that has the converter's dependencies (torch, transformers,
numpy, sentencepiece), never imported by specdraft: it imports the converter and the gguf-py of
the llama.cpp tree named by `--home`, which must not mix with a `gguf` package installed beside
specdraft.

    python llama_convert.py --home TREE [--pre-tokenizer NAME] [--append FILE.npz --append-type T]
        -- CONVERTER ARGUMENTS...

- `--pre-tokenizer NAME`: the name written as `tokenizer.ggml.pre` when the converter does not
  know the tokenizer's pre-tokenizer hash (it refuses such a tokenizer). A tokenizer whose hash it
  knows keeps the converter's own name. The parent passes it only for specdraft's tiny tokenizer
  (target_gguf.py decides), never for a third-party one.
- `--append FILE.npz`: tensors added to the converter's output file afterwards, every key and
  tensor of that file kept: `d2t` (int64, absolute target ids) as I64, every other array stored
  as `--append-type` (f32, f16, bf16).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

APPEND_TYPES = ("f32", "f16", "bf16")


def main(argv: list[str]) -> int:
    """Parse the options, run the converter, then append the extra tensors."""
    if "--" not in argv:
        print("llama_convert: the converter's arguments follow `--`", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="llama_convert")
    parser.add_argument("--home", required=True, type=Path)
    parser.add_argument("--pre-tokenizer", default=None)
    parser.add_argument("--append", default=None, type=Path)
    parser.add_argument("--append-type", default="f32", choices=APPEND_TYPES)
    args = parser.parse_args(argv[:split])
    converter_args = argv[split + 1 :]
    home = args.home.resolve()
    # The converter finds its own files (models/ggml-vocab-*.gguf) through sys.path[0].
    sys.path.insert(0, str(home))
    sys.path.insert(1, str(home / "gguf-py"))
    import convert_hf_to_gguf  # the tree's converter script, as a module

    if args.pre_tokenizer:
        name_unknown_pre_tokenizer(args.pre_tokenizer)
    sys.argv = [str(home / "convert_hf_to_gguf.py"), *converter_args]
    convert_hf_to_gguf.main()
    if args.append is not None:
        outfile = Path(converter_args[converter_args.index("--outfile") + 1])
        append_tensors(outfile, args.append, args.append_type)
    return 0


def name_unknown_pre_tokenizer(name: str) -> None:
    """Make the converter write `name` for a pre-tokenizer hash it does not know."""
    from conversion.base import TextModel

    known = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self: Any, tokenizer: Any) -> str:
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            print(f"llama_convert: unknown pre-tokenizer hash, written as {name!r}")
            return name

    TextModel.get_vocab_base_pre = get_vocab_base_pre


def append_tensors(path: Path, extra: Path, kind: str) -> None:
    """Rewrite the GGUF file `path` with the arrays of `extra` added (see the module doc)."""
    import gguf
    import numpy as np

    qtype = {
        "f32": gguf.GGMLQuantizationType.F32,
        "f16": gguf.GGMLQuantizationType.F16,
        "bf16": gguf.GGMLQuantizationType.BF16,
    }[kind]
    with np.load(extra) as arrays:
        added = {name: stored(arrays[name], name, qtype) for name in arrays.files}
    reader = gguf.GGUFReader(path)
    tmp = path.with_name(f".{path.name}.append")
    architecture = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(tmp, architecture)
    for field in reader.fields.values():
        # The writer writes the header fields and the architecture itself.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name == gguf.Keys.General.ALIGNMENT:
            writer.add_custom_alignment(int(field.contents()))
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    existing = {tensor.name for tensor in reader.tensors}
    clash = sorted(existing & set(added))
    if clash:
        raise SystemExit(f"llama_convert: {path} already holds {clash}")
    for tensor in reader.tensors:
        data = tensor.data
        writer.add_tensor_info(tensor.name, data.shape, data.dtype, data.nbytes, tensor.tensor_type)
    for name, (data, tensor_type) in added.items():
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data)
    for data, _ in added.values():
        writer.write_tensor_data(data)
    writer.close()
    del reader  # its memory map, before the file under it is replaced
    os.replace(tmp, path)


def stored(array: Any, name: str, qtype: Any) -> tuple[Any, Any]:
    """An array as the GGUF writer takes it: (data, GGML type); d2t stays int64 (I64)."""
    import gguf
    import numpy as np

    if name == "d2t":
        return np.ascontiguousarray(array, dtype=np.int64), gguf.GGMLQuantizationType.I64
    data = np.ascontiguousarray(array, dtype=np.float32)
    if qtype == gguf.GGMLQuantizationType.F16:
        return data.astype(np.float16), qtype
    if qtype == gguf.GGMLQuantizationType.BF16:
        # Bytes in the BF16 layout; the writer reads the element shape back from them.
        return gguf.quants.quantize(data, qtype), qtype
    return data, qtype


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
