import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from t2mlr_jax.data.documents import DOCUMENT_SUFFIXES, iter_documents, list_files, read_records


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
