"""ShareGPT-style conversation files (.json / .jsonl) read through HF `datasets`, and the
normalisation of every row to role/content messages.

Two input schemas are accepted: `conversations` with `from`/`value` turns (ShareGPT) and `messages`
with `role`/`content` turns (OpenAI style). A file that `datasets` cannot parse as a whole (a bad
JSON line, mixed types, a cut-off JSON array) is read again record by record, so one bad row
becomes one counted bad row instead of a failed run.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any

from .bad_rows import EMPTY, MALFORMED, NO_ASSISTANT_TURN, BadRow
from .json_array import ArrayReadStats, iter_json_array
from .quiet import quiet_datasets
from .records import Malformed, SourceRead

# ShareGPT speaker names and their chat-template roles. ShareGPT dumps name the assistant after the
# product that answered ('gpt', 'chatgpt', 'bing', 'bard').
ROLE_ALIASES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}

SUFFIXES = (".json", ".jsonl")


def check_conversation_file(path: Path, label: str) -> None:
    """Raise, prefixed with `label`, unless `path` is an existing .json or .jsonl file."""
    if path.suffix not in SUFFIXES:
        raise ValueError(
            f"{label}: unsupported extension {path.suffix!r}; conversation files are .json (an "
            f"array of records) or .jsonl (one record per line), the ShareGPT package is "
            f"'pkg:sharegpt'; for offline feature shards set data.format = 'features'"
        )
    if not path.is_file():
        raise FileNotFoundError(f"{label}: no such file")


def read_conversation_file(
    path: str | Path, *, hf_cache_dir: str | Path | None = None
) -> SourceRead:
    """Read a .json (array) or .jsonl (one record per line) conversation file."""
    path = Path(path)
    check_conversation_file(path, f"data path {path}")
    bad_utf8 = first_invalid_utf8(path)
    if bad_utf8 is not None:
        # pyarrow loads invalid UTF-8 without complaint and fails when a row is read, which
        # would stop the whole file; read it per record so the bad row alone is counted.
        note = f"the file is not valid UTF-8 ({bad_utf8}); read per record"
        return _read_per_record(path, note)
    try:
        import datasets

        with quiet_datasets():
            table = datasets.Dataset.from_json(
                str(path), cache_dir=str(hf_cache_dir) if hf_cache_dir else None
            )
        return SourceRead(str(path), table, len(table))
    except Exception as exc:
        # pyarrow refuses the whole file for one bad line or a mix of types; fall back to a
        # record-by-record read that keeps every good row.
        note = f"datasets could not read the file as a whole ({_first_line(exc)}); read per record"
    return _read_per_record(path, note)


def _read_per_record(path: Path, note: str) -> SourceRead:
    if path.suffix == ".jsonl":
        records = _read_jsonl_records(path)
        return SourceRead(str(path), records, len(records), via="records", notes=[note])
    stats = ArrayReadStats()
    records = list(iter_json_array(path, stats))
    return SourceRead(str(path), records, len(records), stats, via="records", notes=[note])


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def first_invalid_utf8(path: str | Path) -> str | None:
    """Where a file first breaks UTF-8 ('line N, byte 0xXX'), or None when it is valid."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    line = 1
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as exc:
                # exc.object is the decoder's pending bytes plus this chunk: near enough to count
                # the lines before the bad byte.
                where = line + exc.object[: exc.start].count(b"\n")
                return f"line {where}, byte 0x{exc.object[exc.start]:02x}"
            line += chunk.count(b"\n")
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return f"line {line}, a multi-byte character cut off at the end of the file"
    return None


def _read_jsonl_records(path: Path) -> list[Any]:
    """One record per non-blank line; a line that is not UTF-8 JSON becomes a Malformed marker."""
    records: list[Any] = []
    with open(path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            if not raw.strip():
                # Blank lines are not rows (as in `datasets`), so row indices agree with it.
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                records.append(
                    Malformed(
                        f"line {line_number} is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at "
                        f"column {exc.start + 1})"
                    )
                )
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                records.append(Malformed(f"line {line_number} is not JSON ({exc.msg})"))
    return records


def normalise_conversation(record: Any) -> list[dict[str, str]]:
    """Turn one record into role/content messages; raise BadRow when it cannot train."""
    if isinstance(record, Malformed):
        raise BadRow(MALFORMED, record.detail)
    if not isinstance(record, dict):
        raise BadRow(MALFORMED, f"the row is a JSON {type(record).__name__}, not an object")
    turns, schema = None, ""
    if record.get("messages") is not None:
        turns, schema = record["messages"], "messages"
    elif record.get("conversations") is not None:
        turns, schema = record["conversations"], "conversations"
    if turns is None:
        raise BadRow(MALFORMED, "the row has neither a 'conversations' nor a 'messages' list")
    if not isinstance(turns, list):
        raise BadRow(MALFORMED, f"'{schema}' is a {type(turns).__name__}, not a list of turns")
    messages = [_normalise_turn(turn, i, schema) for i, turn in enumerate(turns)]
    if not any(m["content"].strip() for m in messages):
        raise BadRow(EMPTY, f"no turn with any text ({len(messages)} turn(s))")
    if not any(m["role"] == "assistant" for m in messages):
        roles = sorted({m["role"] for m in messages})
        raise BadRow(NO_ASSISTANT_TURN, f"only {', '.join(roles)} turns")
    return messages


def _normalise_turn(turn: Any, index: int, schema: str) -> dict[str, str]:
    if not isinstance(turn, dict):
        raise BadRow(MALFORMED, f"{schema}[{index}] is a {type(turn).__name__}, not an object")
    # `datasets` unifies the struct fields of a column, so absent keys come back as None.
    speaker = _first_present(turn, "role", "from")
    content = _first_present(turn, "content", "value")
    if speaker is None:
        raise BadRow(MALFORMED, f"{schema}[{index}] has no 'role' (or 'from')")
    if content is None:
        raise BadRow(MALFORMED, f"{schema}[{index}] has no 'content' (or 'value')")
    if not isinstance(content, str):
        raise BadRow(
            MALFORMED, f"{schema}[{index}] content is a {type(content).__name__}, not a string"
        )
    if not content.isascii() and not _encodable(content):
        # A JSON array read with surrogateescape keeps undecodable bytes as lone surrogates.
        raise BadRow(MALFORMED, f"{schema}[{index}] content is not valid UTF-8 text")
    role = ROLE_ALIASES.get(str(speaker).strip().lower())
    if role is None:
        raise BadRow(
            MALFORMED,
            f"{schema}[{index}] has unknown role {speaker!r} (known: {', '.join(ROLE_ALIASES)})",
        )
    return {"role": role, "content": content}


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _first_present(turn: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        value = turn.get(key)
        if value is not None:
            return value
    return None
