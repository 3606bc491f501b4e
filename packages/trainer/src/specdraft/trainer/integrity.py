"""Checksums for what training reads back from disk: checkpoints and offline feature shards.

A checkpoint folder carries `manifest.json`, the sha256 of every other file in it, written into
the temporary folder before the rename that publishes the checkpoint, so a published checkpoint
always has a manifest that matches what was written. Loading verifies every file before anything
is read, and names the first file that differs: a flipped block in a DCP shard would otherwise
load silently and change the loss. Checksums detect corruption; they do not make a checkpoint
from someone else trustworthy (anyone can rewrite a manifest), which is why loading also never
unpickles (see `train/safe_dcp.py`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .runtime.atomic import atomic_write

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_CHUNK = 1 << 20


class CorruptFile(RuntimeError):
    """A file's content differs from the checksum recorded when it was written."""


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def files_under(folder: Path) -> list[str]:
    """Every file under `folder` but the manifest, as sorted relative POSIX paths."""
    return sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.name != MANIFEST
    )


def write_manifest(folder: Path, known: dict[str, str] | None = None) -> Path:
    """Record the sha256 of every file under `folder` in `folder/manifest.json` (atomically).

    `known` holds digests already computed (by other ranks); the remaining files are hashed here.
    """
    known = known or {}
    files = {name: known.get(name) or sha256_file(folder / name) for name in files_under(folder)}
    payload = json.dumps({"version": MANIFEST_VERSION, "sha256": files}, indent=1)
    return atomic_write(folder / MANIFEST, payload)


def read_manifest(folder: Path) -> dict[str, str]:
    """The recorded checksums of a folder (relative path -> sha256); refuses a missing manifest."""
    path = folder / MANIFEST
    if not path.is_file():
        raise CorruptFile(
            f"{path} is missing: the checkpoint cannot be verified (it was made by an older "
            "specdraft, or its copy is incomplete); copy the whole checkpoint folder again, or "
            "start a new run"
        )
    try:
        data = json.loads(path.read_text())
        files = data["sha256"]
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items()
        ):
            raise TypeError("sha256 must map file names to hex digests")
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptFile(f"{path} is not a valid checksum manifest ({exc})") from None
    for name in files:
        # The manifest names files inside its folder only.
        if name.startswith("/") or ".." in Path(name).parts:
            raise CorruptFile(f"{path} names a file outside its folder: {name!r}")
    return files


def unlisted_files(folder: Path) -> list[str]:
    """Files under `folder` its manifest does not list (added after it was written), as problems."""
    files = read_manifest(folder)
    return [
        f"{folder / name}: not listed in {MANIFEST} (added after the folder was written)"
        for name in files_under(folder)
        if name not in files
    ]


def manifest_problems(folder: Path, names: Iterable[str] | None = None) -> list[str]:
    """Check files of `folder` against its manifest; one line per problem, naming the file.

    `names` limits the check to those manifest entries (ranks split the work); by default every
    entry is checked and unlisted files are reported too.
    """
    files = read_manifest(folder)
    problems = []
    if names is None:
        names = sorted(files)
        problems += unlisted_files(folder)
    for name in names:
        path = folder / name
        if not path.is_file():
            problems.append(f"{path}: missing (listed in {MANIFEST})")
        elif sha256_file(path) != files[name]:
            problems.append(f"{path}: content differs from its checksum (corrupted or modified)")
    return problems


def verify_files(folder: Path, names: Iterable[str], *, action: str) -> None:
    """Check the named files of `folder` against its manifest; raise CorruptFile naming each.

    For readers that use only part of a checkpoint (export, eval): a file they read must be
    listed and match; `action` says what was refused ("export", "evaluate").
    """
    try:
        files = read_manifest(folder)
        names = list(names)
        # A file the manifest does not list was added or swapped in after the checkpoint was
        # written: it is as untrusted as a modified one.
        problems = [
            f"{folder / name}: not listed in {MANIFEST} (added after the folder was written)"
            for name in names
            if name not in files
        ]
        problems += manifest_problems(folder, [name for name in names if name in files])
    except CorruptFile as exc:
        problems = [str(exc)]
    if problems:
        raise CorruptFile(
            f"cannot {action} {folder}: it does not match the checksums written with it\n  "
            + "\n  ".join(problems)
            + "\nuse an earlier checkpoint (checkpoints/step-*) or copy this one again"
        )


def field_mismatches(
    found: Mapping[str, Any],
    expected: Mapping[str, Any],
    fields: Iterable[str],
    *,
    found_label: str,
    expected_label: str,
    notes: Mapping[str, str] | None = None,
) -> list[str]:
    """One line per differing field: `field (note): <found_label> X, <expected_label> Y`.

    The one comparison behind every "this was made with other settings" refusal (offline
    feature folders, checkpoint fingerprints), so each names the field and both values alike.
    """
    lines = []
    for field in fields:
        if found.get(field) == expected.get(field):
            continue
        note = f" ({notes[field]})" if notes and field in notes else ""
        lines.append(
            f"{field}{note}: {found_label} {found.get(field)!r}, "
            f"{expected_label} {expected.get(field)!r}"
        )
    return lines
