import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from t2mlr_jax.data.documents import DOCUMENT_SUFFIXES, iter_documents, list_files, read_records
from t2mlr_jax.data.token_store import METADATA_FILE, read_metadata


def test_reads_txt_jsonl_and_parquet_documents(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("whole file\nis one document")
    (tmp_path / "sub" / "b.jsonl").write_text(
        json.dumps({"text": "one"}) + "\n\n" + json.dumps({"text": "two"})
    )
    pq.write_table(pa.table({"text": ["three", None, "four"], "id": [1, 2, 3]}), tmp_path / "c.parquet")
    (tmp_path / "ignored.md").write_text("not a document")
    files = list_files(str(tmp_path), DOCUMENT_SUFFIXES)
    assert [f.rsplit("/", 1)[1] for f in files] == ["a.txt", "c.parquet", "b.jsonl"]
    docs = [d for f in files for d in iter_documents(f)]
    assert docs == ["whole file\nis one document", "three", "four", "one", "two"]


def test_records_from_json_jsonl_parquet(tmp_path):
    rows = [{"question": "q1", "answer": "1"}, {"question": "q2", "answer": "2"}]
    (tmp_path / "r.json").write_text(json.dumps({"data": rows}))
    (tmp_path / "r.jsonl").write_text("\n".join(map(json.dumps, rows)))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "r.parquet")
    for name in ("r.json", "r.jsonl", "r.parquet"):
        assert read_records(str(tmp_path / name)) == rows


def test_bad_document_inputs_raise(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        list_files(str(tmp_path / "missing"), DOCUMENT_SUFFIXES)
    with pytest.raises(ValueError, match="no .txt/.jsonl/.parquet files"):
        list_files(str(tmp_path), DOCUMENT_SUFFIXES)
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(ValueError, match="is not a"):
        list_files(str(tmp_path / "x.csv"), DOCUMENT_SUFFIXES)
    (tmp_path / "bad.jsonl").write_text(json.dumps({"body": "no text field"}))
    with pytest.raises(ValueError, match="bad.jsonl:1: expected a JSON object with a string field 'text'"):
        list(iter_documents(str(tmp_path / "bad.jsonl")))
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="has no column 'text'"):
        list(iter_documents(str(tmp_path / "bad.parquet")))
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(ValueError, match="holds no records"):
        read_records(str(tmp_path / "empty.json"))


def test_a_file_that_does_not_parse_is_named_with_its_line(tmp_path):
    """Garbage JSONL, a JSON file cut short, text that is not UTF-8, a token store's garbled metadata: each
    error names the file and the line (json's and the codec's own messages named neither)."""
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text('{"text": "fine"}\n\nnot json at all\n')
    for read in (lambda p: list(iter_documents(p)), read_records):
        with pytest.raises(ValueError, match=rf"^{garbage}:3: not valid JSON \(Expecting value, column 1\)$"):
            read(str(garbage))
    cut = tmp_path / "cut.json"
    cut.write_text('[\n  {"prompt": "a",\n')
    with pytest.raises(ValueError, match=rf"^{cut}:3: not valid JSON"):
        read_records(str(cut))
    for name in ("latin1.txt", "latin1.jsonl"):
        path = tmp_path / name
        path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
        with pytest.raises(ValueError, match=rf"^{path}:2: not UTF-8 text \(byte 0xe9 at offset 28\)$"):
            list(iter_documents(str(path)))
    store = tmp_path / "store"
    store.mkdir()
    (store / METADATA_FILE).write_text("{garbled")
    with pytest.raises(ValueError, match=rf"^{store / METADATA_FILE}:1: not valid JSON"):
        read_metadata(str(store))
