"""data.source=tfds:NAME[/CONFIG]:SPLIT: tiny TFDS datasets (one of them with two builder configs), prepared
here as array_record without TensorFlow (TFDS 4.9 serialises examples without it), read back as text
documents into the text pipeline."""

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from t2mlr_jax.data.batch import validate_batch
from t2mlr_jax.data.tfds_source import TfdsDocuments
from t2mlr_jax.experiment import experiment, resolve
from t2mlr_jax.train.build_data import build_data_source
from tests.tiny import tiny_config

NUM_TRAIN = 22


@pytest.fixture(scope="module", autouse=True)
def nothing_compiles():
    """The data path needs no model and no main.py: no XLA compilation happens in this module."""
    compiles = []
    listener = lambda event, *_, **__: compiles.append(event) if "compile" in event else None
    jax.monitoring.register_event_duration_secs_listener(listener)
    yield
    jax.monitoring.unregister_event_duration_listener(listener)
    assert not compiles, f"XLA compiled during the TFDS data tests: {compiles}"


@pytest.fixture(scope="module")
def tiny_text(tmp_path_factory, english_paragraph) -> tuple[str, list[str], list[str]]:
    """(data_dir, train documents, test documents) of the dataset "tiny_text", prepared once."""
    documents = [s.strip() for s in english_paragraph.split(". ") if s.strip()]
    train, test = documents[:NUM_TRAIN], documents[NUM_TRAIN:]

    # Unregistered, so it is found from its files alone, as a copied data_dir is.
    with tfds.core.registered.skip_registration():

        class TinyText(tfds.core.GeneratorBasedBuilder):
            VERSION = tfds.core.Version("1.0.0")
            # Not in a package: TFDS 4.9.10 finds a packaged builder's code through importlib_resources,
            # which it requires only on Python < 3.9.
            __module__ = "tiny_text"

            def _info(self):
                features = {"title": tfds.features.Text(), "text": tfds.features.Text()}
                return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

            def _split_generators(self, dl_manager):
                return {"train": self._generate_examples(train), "test": self._generate_examples(test)}

            def _generate_examples(self, docs):
                for i, doc in enumerate(docs):
                    yield i, {"title": f"document {i}", "text": doc}

    data_dir = str(tmp_path_factory.mktemp("tfds"))
    tfds.disable_progress_bar()
    TinyText(data_dir=data_dir).download_and_prepare(file_format="array_record")
    return data_dir, train, test


@pytest.fixture(scope="module")
def tiny_cased(tmp_path_factory, tiny_text) -> tuple[str, list[str]]:
    """(data_dir, documents) of "tiny_cased": tiny_text's train documents, lower-cased in its builder config
    "lower" (the first, so the default) and upper-cased in "upper"; both prepared, as `tfds build` does
    for each config."""
    documents = tiny_text[1][:6]
    with tfds.core.registered.skip_registration():

        class TinyCased(tfds.core.GeneratorBasedBuilder):
            VERSION = tfds.core.Version("1.0.0")
            BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="lower"), tfds.core.BuilderConfig(name="upper")]
            __module__ = "tiny_cased"  # as TinyText's

            def _info(self):
                features = tfds.features.FeaturesDict({"text": tfds.features.Text()})
                return tfds.core.DatasetInfo(builder=self, features=features)

            def _split_generators(self, dl_manager):
                return {"train": self._generate_examples()}

            def _generate_examples(self):
                case = str.upper if self.builder_config.name == "upper" else str.lower
                for i, doc in enumerate(documents):
                    yield i, {"text": case(doc)}

    data_dir = str(tmp_path_factory.mktemp("tfds_configs"))
    for name in ("lower", "upper"):
        TinyCased(config=name, data_dir=data_dir).download_and_prepare(file_format="array_record")
    return data_dir, documents


@pytest.fixture
def config_with(tiny_text, tokenizer_dir, smollm2):
    """A text config reading tiny_text's train / test splits, with `data` changes."""

    def make(**data):
        return experiment(
            name="tfds",
            model=tiny_config(vocab_size=smollm2.vocab_size),
            data={
                "kind": "text",
                "tokenizer": tokenizer_dir,
                "seq_len": 64,
                "source": "tfds:tiny_text:train",
                "eval_source": "tfds:tiny_text:test",
                "tfds_data_dir": tiny_text[0],
                **data,
            },
            train=dict(batch_size=2),
            evaluation=dict(batch_size=2, num_examples=4),
        )

    return make


def test_documents_are_the_generated_ones(tiny_text):
    data_dir, train, test = tiny_text
    documents = TfdsDocuments("tfds:tiny_text:train", data_dir=data_dir)
    assert len(documents) == len(train) and isinstance(documents[0], str)
    assert sorted(documents) == sorted(train)  # TFDS stores examples in its own shuffled order
    assert sorted(TfdsDocuments("tfds:tiny_text:test", data_dir=data_dir)) == sorted(test)
    assert len(TfdsDocuments("tfds:tiny_text:train[:5]", data_dir=data_dir)) == 5


def test_a_builder_config_is_read_from_its_own_files(tiny_cased):
    data_dir, documents = tiny_cased
    read = lambda spec: sorted(TfdsDocuments(spec, data_dir=data_dir))
    assert read("tfds:tiny_cased/upper:train") == sorted(d.upper() for d in documents)
    assert (
        read("tfds:tiny_cased/lower:train")
        == read("tfds:tiny_cased:train")
        == sorted(map(str.lower, documents))
    )
    assert len(TfdsDocuments("tfds:tiny_cased/upper:train[:2]", data_dir=data_dir)) == 2
    with pytest.raises(ValueError, match="tfds build tiny_cased/title --data_dir="):
        TfdsDocuments("tfds:tiny_cased/title:train", data_dir=data_dir)


def rows_come_from(batch: dict, tokenizer, documents: list[str]) -> bool:
    """Every document piece in every row of `batch` (EOS dropped) decodes to a part of one of `documents`."""
    for tokens, seg in zip(batch["tokens"], batch["segment_ids"]):
        for s in np.unique(seg[seg > 0]):
            text = tokenizer.decode(tokens[(seg == s) & (tokens != tokenizer.eos_id)].tolist())
            if not any(text in doc for doc in documents):
                return False
    return True


def test_train_and_eval_batches_come_from_the_tfds_splits(tiny_text, config_with, smollm2):
    _, train, test = tiny_text
    config = config_with()
    data = build_data_source(resolve(config))
    iterator = data.train_iterator()
    for _ in range(3):
        batch = next(iterator)
        validate_batch(batch, vocab_size=config.model.vocab_size)
        assert batch["tokens"].shape == (2, 64) and rows_come_from(batch, smollm2, train)
    eval_batches = list(data.eval_batches())
    assert eval_batches and all(rows_come_from(batch, smollm2, test) for batch in eval_batches)


def test_batches_come_from_the_named_builder_config(tiny_cased, config_with, smollm2):
    data_dir, documents = tiny_cased
    specs = dict(source="tfds:tiny_cased/upper:train", eval_source="tfds:tiny_cased/lower:train")
    data = build_data_source(resolve(config_with(tfds_data_dir=data_dir, **specs)))
    assert rows_come_from(next(data.train_iterator()), smollm2, [d.upper() for d in documents])
    assert all(rows_come_from(b, smollm2, [d.lower() for d in documents]) for b in data.eval_batches())


@pytest.mark.parametrize(
    "data, message",
    [
        (dict(source="lm1b:train"), "is not tfds:NAME[/CONFIG]:SPLIT"),
        (dict(source="tfds:lm1b"), "is not tfds:NAME[/CONFIG]:SPLIT"),
        (dict(eval_source="tfds::test"), "is not tfds:NAME[/CONFIG]:SPLIT"),
        (dict(source="tfds:no_such_set:train"), "tfds build no_such_set --data_dir="),
        # lm1b has TFDS code but is not prepared there
        (dict(source="tfds:lm1b:train"), 'download_and_prepare(file_format="array_record")'),
        (dict(tfds_text_key="body"), "features: ['text', 'title']"),
        (dict(eval_source="tfds:tiny_text:validation"), "Unknown split 'validation'"),
        (dict(kind="file"), 'are for data.kind="text"'),
    ],
)
def test_bad_inputs_raise_one_clear_error(config_with, data, message):
    with pytest.raises(ValueError) as error:
        build_data_source(resolve(config_with(**data)))
    assert message in str(error.value) and "\n" not in str(error.value)
