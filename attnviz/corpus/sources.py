"""Data as people keep it, read into documents: .txt files (a document each) and folders of them, JSON Lines with a
text field, Parquet with a text column, and a `datasets` data set saved with save_to_disk (its Arrow files, read
with pyarrow: the `datasets` package is not needed). Nothing is downloaded.

Every bad input raises CorpusError with a message that names the file and the line, row or document: a missing or
unreadable file, a binary file, bytes that are not UTF-8, an empty document, a JSON Lines line that is not JSON or
lacks the field, a Parquet file or data set without the column. The messages name files as the caller gave them
(`display`), so a page can pass the names a visitor uploaded and never a server path.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from attnviz.errors import AttnvizError

TEXT_SUFFIXES = (".txt", ".text", ".md")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
BINARY_PROBE = 8192  # bytes read to tell a binary file: a NUL byte in them


class CorpusError(AttnvizError, ValueError):
    """A corpus input or run that cannot go on, with a message for the user (naming the file and line or
    document, never more of the machine than the caller named)."""


@dataclass(frozen=True)
class Document:
    """One document: `source` names where it came from ("notes.txt", "data.jsonl line 17", "train.parquet row 4"),
    `text` is its text."""

    source: str
    text: str


def read_documents(paths: Sequence[str | Path], *, field: str = "text",
                   names: Sequence[str] | None = None) -> list[Document]:
    """Every document of every path, in order: a folder's files sorted by name, a file's lines or rows in order.
    names: how each path is named in messages and sources (default: its last part, the file or folder name, so no
    place on the machine is written into a run)."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise CorpusError("No data given: name at least one file or folder.")
    names = [p.name or str(p) for p in paths] if names is None else list(names)
    documents = []
    for path, name in zip(paths, names):
        documents.extend(_documents_of(path, name, field))
    if not documents:
        raise CorpusError(f"No documents in {', '.join(names)}: no .txt, .jsonl or .parquet file was found.")
    return documents


def fingerprint(documents: Sequence[Document]) -> str:
    """sha256 over every document's source and text, in order: the data a run read, whatever files held it."""
    h = hashlib.sha256()
    for d in documents:
        for part in (d.source, d.text):
            data = part.encode("utf-8")
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
    return h.hexdigest()


def _documents_of(path: Path, name: str, field: str) -> Iterator[Document]:
    if not path.exists():
        raise CorpusError(f"{name}: no such file or folder.")
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            yield from _saved_dataset(path, name, field)
            return
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in
                       (*TEXT_SUFFIXES, *JSONL_SUFFIXES, *PARQUET_SUFFIXES))
        for file in files:
            yield from _documents_of(file, f"{name}/{file.relative_to(path).as_posix()}", field)
        return
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        yield from _json_lines(path, name, field)
    elif suffix in PARQUET_SUFFIXES:
        yield from _parquet(path, name, field)
    else:
        yield Document(name, _checked(_text_of(path, name), name))


def _read_bytes(path: Path, name: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CorpusError(f"{name}: cannot be read ({exc.strerror or 'read error'}).") from exc
    if b"\0" in data[:BINARY_PROBE]:
        raise CorpusError(f"{name}: a binary file, not text (give .txt, .jsonl or .parquet files).")
    return data


def _text_of(path: Path, name: str) -> str:
    data = _read_bytes(path, name)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise CorpusError(f"{name} line {line}: bytes that are not UTF-8 (at byte {exc.start:,}); save the file "
                          "as UTF-8.") from exc


def _checked(text: str, source: str) -> str:
    if not text.strip():
        raise CorpusError(f"{source}: an empty document.")
    return text


def _json_lines(path: Path, name: str, field: str) -> Iterator[Document]:
    for number, line in enumerate(_text_of(path, name).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{where}: not JSON ({exc.msg}).") from exc
        if not isinstance(record, dict) or field not in record:
            raise CorpusError(f"{where}: no field {field!r} (choose the text field with --field).")
        if not isinstance(record[field], str):
            raise CorpusError(f"{where}: field {field!r} is not a string.")
        yield Document(where, _checked(record[field], where))


def _column_documents(table, name: str, field: str, what: str, start: int = 0) -> Iterator[Document]:
    if field not in table.column_names:
        raise CorpusError(f"{name}: no column {field!r} (it has {', '.join(table.column_names[:8])}); choose the "
                          f"text {what} with --field.")
    for i, text in enumerate(table.column(field).to_pylist()):
        where = f"{name} row {start + i}"
        if not isinstance(text, str):
            raise CorpusError(f"{where}: column {field!r} is not text.")
        yield Document(where, _checked(text, where))


def _parquet(path: Path, name: str, field: str) -> Iterator[Document]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... on a file it cannot read
        raise CorpusError(f"{name}: cannot be read as a Parquet file.") from exc
    yield from _column_documents(table, name, field, "column")


def _saved_dataset(path: Path, name: str, field: str) -> Iterator[Document]:
    """A folder written by datasets' save_to_disk: a Dataset (state.json listing its Arrow stream files) or a
    DatasetDict (dataset_dict.json listing its splits, each such a folder)."""
    if (path / "dataset_dict.json").is_file():
        splits = json.loads(_text_of(path / "dataset_dict.json", f"{name}/dataset_dict.json")).get("splits", [])
        for split in splits:
            yield from _saved_dataset(path / split, f"{name}/{split}", field)
        return
    import pyarrow as pa

    state = json.loads(_text_of(path / "state.json", f"{name}/state.json"))
    row = 0
    for entry in state.get("_data_files", []):
        file = path / entry["filename"]
        where = f"{name}/{entry['filename']}"
        try:
            with pa.memory_map(str(file)) as source:
                table = pa.ipc.open_stream(source).read_all()
        except FileNotFoundError as exc:
            raise CorpusError(f"{where}: missing from the saved data set.") from exc
        except Exception as exc:
            raise CorpusError(f"{where}: not a readable Arrow file of a saved data set.") from exc
        yield from _column_documents(table, name, field, "column", start=row)
        row += table.num_rows
