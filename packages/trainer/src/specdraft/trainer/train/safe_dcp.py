"""Loading torch.distributed.checkpoint folders without running code from them.

torch's FileSystemReader unpickles `.metadata` with plain `pickle`, and the default load planner
reads non-tensor items (optimizer hyper-parameters) with `torch.load(weights_only=False)`: a
checkpoint received from someone else could run any code on load. Here the metadata goes through
an unpickler that resolves only the classes DCP metadata is made of (and torch dtypes), and
non-tensor items go through `torch.load(weights_only=True)`. Anything else is refused with an
error that names the file.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

_DCP_METADATA = "torch.distributed.checkpoint.metadata"

# (module, name) pairs a DCP `.metadata` file of model + optimizer state is made of. Each is a
# plain data class, an enum or a lookup by name: resolving it runs no code of the file's choice.
ALLOWED_GLOBALS = frozenset(
    {
        (_DCP_METADATA, "Metadata"),
        (_DCP_METADATA, "MetadataIndex"),
        (_DCP_METADATA, "StorageMeta"),
        (_DCP_METADATA, "TensorStorageMetadata"),
        (_DCP_METADATA, "BytesStorageMetadata"),
        (_DCP_METADATA, "ChunkStorageMetadata"),
        (_DCP_METADATA, "TensorProperties"),
        (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
        ("torch", "Size"),
        ("collections", "OrderedDict"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PureWindowsPath"),
        ("pathlib", "Path"),
    }
)


class UnsafeCheckpoint(RuntimeError):
    """A checkpoint file asks to unpickle something other than checkpoint data."""


class RestrictedUnpickler(pickle.Unpickler):
    """Resolves only ALLOWED_GLOBALS and torch dtypes; refuses every other global."""

    def __init__(self, file: Any, *, source: Path) -> None:
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        """Look up an allowed class, or refuse naming the file and the global."""
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpoint(
            f"{self.source}: refusing to load: it asks to unpickle {module}.{name}, which is not "
            "part of checkpoint metadata (the file was modified, or made by another program); "
            "specdraft never runs code from a checkpoint: use a checkpoint written by "
            "`specdraft train`"
        )


def read_dcp_metadata(path: Path) -> Metadata:
    """Unpickle a DCP `.metadata` file with the restricted unpickler; check what comes out."""
    with path.open("rb") as handle:
        try:
            metadata = RestrictedUnpickler(handle, source=path).load()
        except UnsafeCheckpoint:
            raise
        except Exception as exc:  # truncated or garbled pickle: say which file
            raise UnsafeCheckpoint(f"{path}: not readable as DCP metadata ({exc})") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(
            f"{path}: holds a {type(metadata).__name__}, not DCP metadata; use a checkpoint "
            "written by `specdraft train`"
        )
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """A FileSystemReader whose metadata goes through `read_dcp_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Read `.metadata` (or a rank's `__<rank>.metadata`) without unrestricted unpickling."""
        path = Path(self._get_metadata_path(kwargs.get("rank")))
        metadata = read_dcp_metadata(path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """The default planner, reading non-tensor items with `torch.load(weights_only=True)`."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Restore one non-tensor item (an optimizer hyper-parameter, a step count)."""
        try:
            item = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise UnsafeCheckpoint(
                f"refusing to load checkpoint item {read_item.dest_index.fqn!r}: it is not plain "
                f"data ({exc}); use a checkpoint written by `specdraft train`"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], item)
        else:
            self.state_dict[read_item.dest_index.fqn] = item
