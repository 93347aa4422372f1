"""Finding and reading raw documents and record files: .txt (one document per file), .jsonl, .json,
.parquet. Bad paths and empty files fail here, before any tokenization."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

DOCUMENT_SUFFIXES = (".txt", ".jsonl", ".parquet")


def list_files(paths: str | Sequence[str], suffixes: Sequence[str]) -> list[str]:
    """Expand files and folders (recursively, sorted) to the files ending in `suffixes`; raise ValueError
    on a missing path, an empty file, or when nothing matches."""
    files: list[str] = []
    for path in [paths] if isinstance(paths, str) else list(paths):
        if not os.path.exists(path):
            raise ValueError(f"data path {path!r} does not exist")
        if os.path.isdir(path):
            found = sorted(
                os.path.join(root, name)
                for root, _, names in os.walk(path)
                for name in names
                if name.endswith(tuple(suffixes))
            )
            if not found:
                raise ValueError(f"no {'/'.join(suffixes)} files under {path!r}")
            files += found
        elif path.endswith(tuple(suffixes)):
            files.append(path)
        else:
            raise ValueError(f"{path!r} is not a {'/'.join(suffixes)} file")
    for file in files:
        if os.path.getsize(file) == 0:
            raise ValueError(f"data file {file!r} is empty")
    return files


def read_text(file: str | Path) -> str:
    """A file's text; ValueError naming the file, line and byte where it is not UTF-8."""
    data = Path(file).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(
            f"{file}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None


def parse_json(text: str, file: str | Path, first_line: int = 1) -> Any:
    """`text` (of `file`, from its line `first_line`) as JSON; ValueError naming the file and line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        line = first_line + e.lineno - 1
        raise ValueError(f"{file}:{line}: not valid JSON ({e.msg}, column {e.colno})") from None


def _json_lines(file: str) -> Iterator[tuple[int, Any]]:
    """(line number, object) for each non-blank line of a .jsonl file."""
    for line_no, line in enumerate(read_text(file).split("\n"), 1):
        if line.strip():
            yield line_no, parse_json(line, file, line_no)


def iter_documents(file: str, *, text_key: str = "text") -> Iterator[str]:
    """The documents of one file: a whole .txt, the `text_key` of each .jsonl line / .parquet row."""
    if file.endswith(".txt"):
        yield read_text(file)
    elif file.endswith(".jsonl"):
        for line_no, row in _json_lines(file):
            yield _text_field(row, text_key, f"{file}:{line_no}")
    elif file.endswith(".parquet"):
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(file)
        if text_key not in parquet.schema_arrow.names:
            raise ValueError(f"{file} has no column {text_key!r} (columns: {parquet.schema_arrow.names})")
        for batch in parquet.iter_batches(columns=[text_key]):
            yield from (t for t in batch.column(0).to_pylist() if t is not None)
    else:
        raise ValueError(f"unsupported document file {file!r}; expected one of {DOCUMENT_SUFFIXES}")


def _text_field(row: dict, key: str, where: str) -> str:
    if not isinstance(row, dict) or not isinstance(row.get(key), str):
        raise ValueError(f"{where}: expected a JSON object with a string field {key!r}")
    return row[key]


def read_records(file: str) -> list[dict]:
    """All records of a .jsonl, .json (a list, or {"data": [...]}) or .parquet file."""
    list_files(file, (".jsonl", ".json", ".parquet"))
    if file.endswith(".jsonl"):
        records = [row for _, row in _json_lines(file)]
    elif file.endswith(".json"):
        loaded = parse_json(read_text(file), file)
        records = loaded.get("data") if isinstance(loaded, dict) else loaded
    else:
        import pyarrow.parquet as pq

        records = pq.read_table(file).to_pylist()
    if not isinstance(records, list) or not records or not all(isinstance(r, dict) for r in records):
        raise ValueError(f"{file} holds no records (expected a non-empty list of JSON objects)")
    return records
