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


def pooled_copy(folder: Path, pooling: dict) -> Path:
    """The packaged model with ``pooling`` as its pooling config; weights are linked, not copied."""
    src = Path(packaged_path())
    folder.mkdir()
    for item in src.iterdir():
        if item.name != "1_Pooling":
            os.symlink(item, folder / item.name)
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return folder


def cls_copy(folder: Path) -> Path:
    """The packaged model with CLS pooling (bge-small pools this way), in the config format it ships with."""
    config = json.loads((Path(packaged_path()) / "1_Pooling" / "config.json").read_text())
    return pooled_copy(folder, dict(config, pooling_mode_cls_token=True, pooling_mode_mean_tokens=False))


def tower_embeddings(encoder, texts) -> np.ndarray:
    feats = encoder.features(texts)
    with torch.inference_mode():
        return encoder.torch_module().eval()(feats["input_ids"], feats["attention_mask"]).numpy()


@pytest.fixture(scope="module")
def cls_encoder(tmp_path_factory):
    return Encoder.load(str(cls_copy(tmp_path_factory.mktemp("enc") / "cls")))


def test_cls_pooled_encoder_is_pooled_by_cls_in_the_tower(encoder, cls_encoder):
    assert cls_encoder.id.startswith("local:") and cls_encoder.pooling_mode == "cls" and encoder.pooling_mode == "mean"
    got, want = tower_embeddings(cls_encoder, TEXTS), cls_encoder.encode(TEXTS)
    assert float(np.abs(got - want).max()) <= 1e-5
    assert float(np.abs(want - encoder.encode(TEXTS)).max()) > 0.05  # CLS and mean really differ here


def test_cls_pooled_controller_exports_and_gates_like_the_encoder(cls_encoder, tmp_path):
    from export_support import trained_controller

    from branchgate.export.controller import export_model
    from branchgate.inference.gate import Gate
    from branchgate.inference.model_file import read_metadata

    net, meta = trained_controller(cls_encoder)
    report = export_model(net, meta, tmp_path / "controller.onnx", encoder=cls_encoder, int8=False)
    assert report["passed"] and report["parity"]["fp32_max_abs_diff_p_keep"] <= 1e-4
    assert read_metadata(report["files"]["fp32"])["pooling"] == "cls"
    got = Gate.load(report["files"]["fp32"], threads=1).embed(TEXTS)  # the packed graph, last layer on CLS rows
    assert float(np.abs(got - cls_encoder.encode(TEXTS)).max()) <= 1e-5


def test_a_model_saved_by_sentence_transformers_6_is_read_without_loading_it(encoder, tmp_path):
    from branchgate.models.encoder import LazyEncoder, resolve

    folder = pooled_copy(tmp_path / "st6", {"embedding_dimension": 384, "pooling_mode": "mean", "include_prompt": True})
    lazy = LazyEncoder(resolve(str(folder)))
    assert lazy.dim == 384 and not lazy.loaded  # read from the new config key, weights untouched
    assert lazy.load().pooling_mode == "mean"
    assert float(np.abs(lazy.encode(TEXTS) - encoder.encode(TEXTS)).max()) <= 1e-5


def test_pooling_modes_of_old_and_new_sentence_transformers():
    assert pooling_modes(SimpleNamespace(pooling_mode="cls")) == ("cls",)
    assert pooling_modes(SimpleNamespace(pooling_mode=("cls", "mean"))) == ("cls", "mean")
    old = SimpleNamespace(pooling_mode_cls_token=False, pooling_mode_mean_tokens=True, pooling_mode_max_tokens=False)
    assert pooling_modes(old) == ("mean",)


def test_unsupported_pooling_is_refused(encoder):
    fake = SimpleNamespace(id="x/max-pooled", st=[None, SimpleNamespace(pooling_mode="max")])
    with pytest.raises(BranchgateError, match="x/max-pooled.*max.*cls or mean"):
        Encoder.pooling_mode.fget(fake)


def test_a_local_encoder_is_named_by_its_content(tmp_path):
    from branchgate.errors import MismatchError
    from branchgate.models.encoder import recorded_spec, resolve

    folder = cls_copy(tmp_path / "mine")
    first = resolve(str(folder))
    assert first.id.startswith(f"local:{folder.resolve()}#") and recorded_spec(first.id, first.path).path == first.path
    assert recorded_spec(first.id).path == first.path  # a dataset manifest records only the id, which names the folder
    (folder / "README.md").write_text("notes do not change the model")
    assert resolve(str(folder)).id == first.id
    config = folder / "1_Pooling" / "config.json"
    config.write_text(config.read_text().replace('"pooling_mode_cls_token": true', '"pooling_mode_cls_token": false'))
    changed = resolve(str(folder))
    assert changed.id != first.id  # cached embeddings, manifests and models of the old content no longer match
    with pytest.raises(MismatchError, match=f"{folder}.* has changed since"):
        recorded_spec(first.id, first.path)


BGE_SMALL_FILES = [
    ".gitattributes",
    "README.md",
    "config.json",
    "config_sentence_transformers.json",
    "model.safetensors",
    "modules.json",
    "pytorch_model.bin",
    "sentence_bert_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "1_Pooling/config.json",
    "onnx/model.onnx",
    "onnx/config.json",
    "onnx/tokenizer.json",
]  # the hub repo's files


def test_a_hub_download_fetches_only_what_sentence_transformers_reads(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.utils import filter_repo_objects

    from branchgate.models import encoder as enc

    repos = {
        "BAAI/bge-small-en-v1.5": BGE_SMALL_FILES,
        "org/older-model": [f for f in BGE_SMALL_FILES if f != "model.safetensors"],
    }  # PyTorch weights only
    calls = []

    def snapshot(repo_id, allow_patterns=None, ignore_patterns=None, **kwargs):
        folder = tmp_path / repo_id.replace("/", "--")
        calls.append(
            list(filter_repo_objects(repos[repo_id], allow_patterns=allow_patterns, ignore_patterns=ignore_patterns))
        )
        for name in calls[-1]:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(b"")
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    assert enc._download("BAAI/bge-small-en-v1.5") == str(tmp_path / "BAAI--bge-small-en-v1.5")
    assert calls == [
        [
            "config.json",
            "config_sentence_transformers.json",
            "model.safetensors",
            "modules.json",
            "sentence_bert_config.json",
            "special_tokens_map.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "vocab.txt",
            "1_Pooling/config.json",
        ]
    ]  # no pytorch_model.bin, nothing under onnx/
    calls.clear()
    enc._download("org/older-model")  # no safetensors: a second call adds the PyTorch weights
    assert len(calls) == 2 and "pytorch_model.bin" in calls[1] and "onnx/model.onnx" not in calls[1]
