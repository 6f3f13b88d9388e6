"""The encoder's pooling as the towers read it: what sentence-transformers does is what the torch tower and
the exported graph do (a CLS-pooled model such as bge-small must not be pooled by mean)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from branchgate.errors import BranchgateError
from branchgate.models.encoder import Encoder, packaged_path, pooling_modes

TEXTS = ["varroa mites and colony losses", "electric bus battery degradation in cold climates", "水土流失的原因"]


def cls_copy(folder: Path) -> Path:
    """The packaged model with CLS pooling (bge-small pools this way); weights are linked, not copied."""
    src = Path(packaged_path())
    folder.mkdir()
    for item in src.iterdir():
        if item.name != "1_Pooling":
            os.symlink(item, folder / item.name)
    (folder / "1_Pooling").mkdir()
    config = json.loads((src / "1_Pooling" / "config.json").read_text())
    config.update(pooling_mode_cls_token=True, pooling_mode_mean_tokens=False)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    return folder


def tower_embeddings(encoder, texts) -> np.ndarray:
    feats = encoder.st.preprocess(texts) if hasattr(encoder.st, "preprocess") else encoder.st.tokenize(texts)
    with torch.inference_mode():
        return encoder.torch_module().eval()(feats["input_ids"], feats["attention_mask"]).numpy()


def test_cls_pooled_encoder_is_pooled_by_cls_in_the_tower(encoder, tmp_path):
    cls = Encoder.load(str(cls_copy(tmp_path / "cls")))
    assert cls.id.startswith("local:") and cls.pooling_mode == "cls" and encoder.pooling_mode == "mean"
    got, want = tower_embeddings(cls, TEXTS), cls.encode(TEXTS)
    assert float(np.abs(got - want).max()) <= 1e-5
    assert float(np.abs(want - encoder.encode(TEXTS)).max()) > 0.05  # CLS and mean really differ here


def test_pooling_modes_of_old_and_new_sentence_transformers():
    assert pooling_modes(SimpleNamespace(pooling_mode="cls")) == ("cls",)
    assert pooling_modes(SimpleNamespace(pooling_mode=("cls", "mean"))) == ("cls", "mean")
    old = SimpleNamespace(pooling_mode_cls_token=False, pooling_mode_mean_tokens=True, pooling_mode_max_tokens=False)
    assert pooling_modes(old) == ("mean",)


def test_unsupported_pooling_is_refused(encoder):
    fake = SimpleNamespace(id="x/max-pooled", st=[None, SimpleNamespace(pooling_mode="max")])
    with pytest.raises(BranchgateError, match="x/max-pooled.*max.*cls or mean"):
        Encoder.pooling_mode.fget(fake)
