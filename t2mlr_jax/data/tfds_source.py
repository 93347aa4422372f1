"""A TFDS split as raw text documents: `tfds:NAME[/CONFIG]:SPLIT` (e.g. tfds:lm1b:train, tfds:c4/en:train,
tfds:wikipedia/20230601.en:train, tfds:lm1b:train[:1%]) for data.kind="text" (t2mlr_jax.train.build_data).

The dataset must already be prepared as array_record in `data_dir` (a machine with network runs
`tfds build NAME --data_dir=DIR --file_format=array_record`, then DIR is copied over): reading goes through
TFDS's random-access data source, which needs no TensorFlow and no network, and shuffles and shards by
index like every other grain source. Every check runs when the source is opened, before anything compiles.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow_datasets as tfds

PREFIX = "tfds:"


def parse_spec(spec: str) -> tuple[str, str]:
    """tfds:NAME[/CONFIG]:SPLIT -> (NAME[/CONFIG], SPLIT); the split keeps TFDS's slicing ("train[:1%]")."""
    prefix, name, split = (spec.split(":", 2) + ["", ""])[:3]
    if prefix + ":" != PREFIX or not name or not split:
        raise ValueError(
            f"data source {spec!r} is not tfds:NAME[/CONFIG]:SPLIT (e.g. tfds:lm1b:train, tfds:c4/en:train)"
        )
    return name, split


class TfdsDocuments(Sequence[str]):
    """The `text_key` feature of every example of a prepared TFDS split, decoded from UTF-8: a grain
    random-access source (picklable, so grain worker processes read it too)."""

    def __init__(self, spec: str, *, data_dir: str = "", text_key: str = "text"):
        name, split = parse_spec(spec)
        data_dir = data_dir or tfds.core.constants.get_default_data_dir()
        not_prepared = (
            f"TFDS dataset {name!r} is not prepared in {data_dir!r} (or the name is wrong); prepare it on a "
            f"machine with network: `tfds build {name} --data_dir={data_dir} --file_format=array_record` or "
            f'tfds.builder("{name}", data_dir="{data_dir}").download_and_prepare(file_format="array_record")'
        )
        try:
            builder = tfds.builder(name, data_dir=data_dir)
        except tfds.core.registered.DatasetNotFoundError:  # its message lists every TFDS dataset
            raise ValueError(not_prepared) from None
        if not builder.is_prepared():
            raise ValueError(not_prepared)
        features = builder.info.features
        feature = features[text_key] if text_key in features else None
        if feature is None or feature.shape != () or feature.np_dtype != np.object_:
            raise ValueError(
                f"TFDS dataset {name!r} has no string feature {text_key!r} (data.tfds_text_key); its "
                f"features: {sorted(features.keys())}"
            )
        try:
            self._examples = builder.as_data_source(split=split)
        except NotImplementedError:  # prepared, but as tfrecord: no random access
            raise ValueError(f"{not_prepared} (found it in another file format)") from None
        except ValueError as e:  # e.g. an unknown split
            raise ValueError(f"{spec}: {e}") from None
        self._text_key = text_key
        self.spec = spec

    def __len__(self) -> int:
        return len(self._examples)

    def __getitem__(self, index: int) -> str:
        if not 0 <= index < len(self):  # TFDS raises ValueError; iterating a Sequence stops at IndexError
            raise IndexError(index)
        return self._examples[index][self._text_key].decode("utf-8")
