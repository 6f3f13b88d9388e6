"""Tampered and broken models (issue 48: 2, 10, 11, 13): an export replaces its set of files whole or not at all;
a controller is never labelled with an encoder its weights are not; required ONNX metadata and the tokenizer hash
are checked at every load; a checkpoint's net config and an encoder's weights file are refused with a named error."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from export_support import exported

from branchgate.cli import main
from branchgate.errors import BranchgateError, InputError, MismatchError
from branchgate.export.controller import export_controller, export_model
from branchgate.export.onnx_metadata import write_metadata
from branchgate.inference.gate import Gate
from branchgate.inference.model_file import read_metadata
from branchgate.models.encoder import PACKAGED, EncoderSpec, packaged_path
from branchgate.training.checkpoint import load_controller, save_controller

BGE = "BAAI/bge-small-en-v1.5"
SET = ("controller.onnx", "controller.int8.onnx", "controller.tokenizer.json", "controller.md")
RECORD = ".controller.onnx.branchgate.json"  # the export's record of what it wrote (fileio.write_file_set)


def _old_set(folder: Path) -> dict[str, bytes]:
    """An earlier export's four files in ``folder`` (distinct bytes, recorded as the export's), as {name: bytes}."""
    from branchgate.fileio import write_file_set

    folder.mkdir(parents=True, exist_ok=True)
    old = {name: f"old {name}\n".encode() for name in SET}
    for name, data in old.items():
        (folder / f"new.{name}").write_bytes(data)
    write_file_set({folder / n: folder / f"new.{n}" for n in SET}, folder / RECORD, "export")
    return old


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != RECORD}


def _export(encoder, out: Path, **kw):
    return export_controller(exported(encoder)["checkpoint"], out, int8=False, max_decisions=2, encoder=encoder, **kw)


# -- 2: the export's files are replaced as one set ------------------------------------------------------
def test_an_export_that_fails_while_moving_files_in_leaves_the_old_set_byte_identical(encoder, tmp_path, monkeypatch):
    import branchgate.fileio as fileio

    out = tmp_path / "m"
    old = _old_set(out)
    real = os.replace

    def fails_on_the_tokenizer(src, dst, *args, **kwargs):  # the 2nd file of the set cannot be put in place
        if Path(dst) == out / "controller.tokenizer.json" and Path(src).parent != out:
            raise PermissionError(13, "Permission denied (simulated)", str(dst))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(fileio.os, "replace", fails_on_the_tokenizer)
    with pytest.raises(InputError, match="cannot write the files .Permission denied"):  # named, not a traceback
        _export(encoder, out / "controller.onnx")
    assert _files(out) == old and sorted(p.name for p in out.iterdir()) == sorted([*SET, RECORD])  # nothing else


def test_a_folder_in_place_of_one_file_of_the_set_is_refused_before_anything_moves(encoder, tmp_path):
    out = tmp_path / "m"
    old = _old_set(out)
    (out / "controller.md").unlink()
    (out / "controller.md").mkdir()
    (out / "controller.md" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="controller.md: exists and is not a file"):
        _export(encoder, out / "controller.onnx")
    assert (out / "controller.md" / "notes.txt").read_text() == "mine"
    assert _files(out) == {k: v for k, v in old.items() if k != "controller.md"}
    assert sorted(p.name for p in out.iterdir()) == sorted([*SET, RECORD])


def test_a_successful_export_replaces_every_file_of_the_old_set(encoder, tmp_path):
    out = tmp_path / "m"
    old = _old_set(out)
    report = _export(encoder, out / "controller.onnx")
    assert sorted(p.name for p in out.iterdir()) == sorted([*(n for n in SET if n != "controller.int8.onnx"), RECORD])
    for name in ("controller.onnx", "controller.tokenizer.json", "controller.md"):
        assert (out / name).read_bytes() != old[name]
    assert "removed the stale controller.int8.onnx" in (out / "controller.md").read_text()
    assert report["passed"] and Gate.load(out, threads=1).encoder == PACKAGED


def test_replace_files_puts_every_old_file_back_when_a_step_fails(tmp_path, monkeypatch):
    import branchgate.fileio as fileio

    targets = [tmp_path / f"f{i}" for i in range(4)]
    for i, t in enumerate(targets[:3]):
        t.write_text(f"old {i}")
    news = []
    for i in range(3):
        news.append(tmp_path / "new" / f"f{i}")
        news[-1].parent.mkdir(exist_ok=True)
        news[-1].write_text(f"new {i}")
    calls = []
    real = os.replace

    def third_move_fails(src, dst, *args, **kwargs):
        calls.append(dst)
        if len(calls) == 5:  # f0 aside, f0 in, f1 aside, f1 in, then f2 aside fails
            raise OSError(5, "I/O error (simulated)")
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(fileio.os, "replace", third_move_fails)
    with pytest.raises(OSError, match="simulated"):
        fileio.replace_files({targets[0]: news[0], targets[1]: news[1], targets[2]: news[2], targets[3]: None})
    assert [t.read_text() for t in targets[:3]] == ["old 0", "old 1", "old 2"] and not targets[3].exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f0", "f1", "f2", "new"]  # no .old left behind
    monkeypatch.setattr(fileio.os, "replace", real)
    fileio.replace_files({targets[0]: news[0], targets[1]: news[1], targets[2]: None})
    assert [t.read_text() for t in targets[:2]] == ["new 0", "new 1"] and not targets[2].exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f0", "f1", "new"]


# -- 10: the ONNX carries the encoder its weights are ------------------------------------------------------
def test_the_fingerprint_tells_the_packaged_encoder_from_a_relabelled_one(encoder):
    from branchgate.inference.metadata import FINGERPRINT_PROBES, check_fingerprint

    vecs = encoder.encode(list(FINGERPRINT_PROBES))
    check_fingerprint(PACKAGED, vecs)
    check_fingerprint("local:/somewhere#0123456789ab", vecs)  # a local folder is named by its files' content
    with pytest.raises(MismatchError, match=f"recorded as '{BGE}', but its weights are '{PACKAGED}'"):
        check_fingerprint(BGE, vecs)
    vecs[1, 3] += 0.01
    with pytest.raises(MismatchError, match="not 'sentence-transformers/all-MiniLM-L6-v2'"):
        check_fingerprint(PACKAGED, vecs)


def test_export_refuses_weights_labelled_with_another_encoder(encoder, tmp_path):
    import copy

    net, meta = load_controller(exported(encoder)["checkpoint"])
    relabelled = copy.copy(encoder)
    relabelled.id, relabelled.spec = BGE, EncoderSpec(BGE, encoder.spec.path)
    with pytest.raises(MismatchError, match=f"its weights are '{PACKAGED}'"):
        export_model(net, dict(meta, encoder=BGE), tmp_path / "c.onnx", encoder=relabelled, int8=False)
    assert not list(tmp_path.iterdir())


def _hub_copy_of_packaged(root: Path, repo_id: str) -> Path:
    """The packaged model's files under a Hugging Face cache layout for ``repo_id`` (symbolic links)."""
    snap = root / ("models--" + repo_id.replace("/", "--")) / "snapshots" / ("0" * 40)
    for src in Path(packaged_path()).rglob("*"):
        dst = snap / src.relative_to(packaged_path())
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.symlink_to(src)
    return snap


@pytest.mark.parametrize("where", ["packaged folder", "hub-like copy"])
def test_a_checkpoint_whose_meta_encoder_was_edited_is_not_exported(encoder, tmp_path, monkeypatch, capsys, where):
    import branchgate.models.encoder as enc

    monkeypatch.setattr(enc, "_hub_path", lambda repo_id, allow_download: None)  # BGE is not in the local cache
    net, meta = load_controller(exported(encoder)["checkpoint"])
    folder = packaged_path() if where == "packaged folder" else str(_hub_copy_of_packaged(tmp_path / "hub", BGE))
    ckpt = save_controller(tmp_path / "edited.safetensors", net, dict(meta, encoder=BGE, encoder_path=folder))
    out = tmp_path / "m" / "controller.onnx"
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(out), "--max-decisions", "2"]) == 2
    err = capsys.readouterr().err
    assert "branchgate: error:" in err and BGE in err and "Traceback" not in err
    assert not out.exists() and not list(out.parent.glob("*"))


def test_the_gate_checks_its_graph_against_the_encoder_and_max_length_its_metadata_name(encoder, tmp_path, capsys):
    model = Path(exported(encoder)["files"]["fp32"])
    props = read_metadata(model)
    relabelled = _copy_with(model, tmp_path / "bge", dict(props, encoder=BGE))
    decision = tmp_path / "d.json"
    decision.write_text(json.dumps({"state": {"root_query": "q"}, "candidates": ["a", "b"]}))
    assert main(["gate", "--pre", str(relabelled), "--input", str(decision), "--expect-encoder", BGE]) == 2
    assert f"recorded as '{BGE}', but its weights are '{PACKAGED}'" in capsys.readouterr().err
    with pytest.raises(MismatchError, match="cannot embed a text of max_length=1000 tokens"):
        Gate.load(_copy_with(model, tmp_path / "long", dict(props, max_length="1000")), threads=1)
    int8 = Gate.load(exported(encoder)["files"]["int8"], threads=1)  # int8 vectors are within its tolerance
    assert int8.encoder == PACKAGED and int8.cache_len == 0


# -- 11: required metadata and the tokenizer hash, at every load ---------------------------------------------
@pytest.fixture(scope="module")
def model(encoder) -> Path:
    return Path(exported(encoder)["files"]["fp32"])


def _copy_with(model: Path, folder: Path, props: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "controller.onnx"
    write_metadata(model, out, props)
    shutil.copy(model.with_name("controller.tokenizer.json"), folder / "controller.tokenizer.json")
    return out


def test_a_controller_without_tokenizer_sha256_is_refused(model, tmp_path, capsys):
    props = {k: v for k, v in read_metadata(model).items() if k != "tokenizer_sha256"}
    bare = _copy_with(model, tmp_path / "m", props)
    with pytest.raises(MismatchError, match="'tokenizer_sha256' is missing"):
        Gate.load(bare, threads=1)
    decision = tmp_path / "d.json"
    decision.write_text(json.dumps({"state": {"root_query": "q"}, "candidates": ["a", "b"]}))
    assert main(["gate", "--pre", str(bare), "--input", str(decision), "--threads", "1"]) == 2
    assert "tokenizer_sha256" in capsys.readouterr().err


def test_a_tokenizer_given_to_load_is_held_to_the_models_hash(model, tmp_path):
    text = model.with_name("controller.tokenizer.json").read_text(encoding="utf-8")
    same, other = tmp_path / "same.json", tmp_path / "other.json"
    same.write_text(text, encoding="utf-8")
    other.write_text(text.replace('"lowercase":true', '"lowercase":false', 1), encoding="utf-8")  # a cased tokenizer
    assert hashlib.sha256(other.read_bytes()).hexdigest() != read_metadata(model)["tokenizer_sha256"]
    assert Gate.load(model, threads=1, tokenizer=same).encoder == PACKAGED
    with pytest.raises(MismatchError, match="tokenizer_sha256"):
        Gate.load(model, threads=1, tokenizer=other)


def test_every_required_key_is_checked(model, tmp_path):
    from branchgate.inference.metadata import REQUIRED_METADATA

    props = read_metadata(model)
    for key in REQUIRED_METADATA:
        with pytest.raises(MismatchError, match=f"'{key}' is missing"):
            Gate.load(_copy_with(model, tmp_path / key, {k: v for k, v in props.items() if k != key}), threads=1)


# -- 13: a net config no network fits, and an encoder weights file that would need unpickling -------------------
def _edited(encoder, tmp_path: Path, text_edit) -> Path:
    """The session checkpoint with its ``branchgate`` JSON entry passed through ``text_edit``."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = exported(encoder)["checkpoint"]
    with safe_open(src, framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        entry = f.metadata()["branchgate"]
    path = tmp_path / "edited.safetensors"
    save_file(tensors, str(path), metadata={"branchgate": text_edit(entry)})
    return path


def _net_field(key: str, value: str):
    def edit(text: str) -> str:
        entry = json.loads(text)
        entry["net"][key] = "@@"
        return json.dumps(entry).replace('"@@"', value)

    return edit


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("hidden", "-1", "hidden must be an integer in \\[1, 1048576\\], got -1"),
        ("hidden", "1000000000", "hidden must be an integer in \\[1, 1048576\\]"),  # 6 TB if it were built
        ("hidden", "1048576", "weights do not fit"),  # 4 TB: refused before any allocation
        ("dim", "1000000000", "meta.dim 384 != net.dim 1000000000"),
        ("dropout", "NaN", "dropout must be a number in \\[0, 1\\]"),
        ("mmr_lambda", "Infinity", "mmr_lambda must be a number in \\[0, 1\\]"),
        ("hidden", "1" * 5000, "not valid JSON"),
    ],
    ids=[
        "hidden-negative",
        "hidden-1e9",
        "hidden-2^20",
        "dim-1e9",
        "dropout-nan",
        "mmr_lambda-inf",
        "hidden-5000-digits",
    ],
)
def test_a_net_config_no_network_fits_is_a_named_input_error(encoder, tmp_path, capsys, key, value, match):
    path = _edited(encoder, tmp_path, _net_field(key, value))
    with pytest.raises(BranchgateError, match=match) as err:  # InputError; a MismatchError for the dim
        load_controller(path)
    assert str(err.value).startswith(str(path))
    assert main(["export", "--checkpoint", str(path), "--out", str(tmp_path / "m" / "controller.onnx")]) == 2
    assert "branchgate: error:" in capsys.readouterr().err and not (tmp_path / "m").exists()


@pytest.mark.parametrize("value", ["NaN", "1.5", "-0.1"])
def test_a_tau_outside_0_1_is_a_named_input_error(encoder, tmp_path, value):
    def edit(text):
        entry = json.loads(text)
        entry["meta"]["tau"] = "@@"
        return json.dumps(entry).replace('"@@"', value)

    with pytest.raises(InputError, match="meta.tau' must be null or a number in"):
        load_controller(_edited(encoder, tmp_path, edit))


def _pickled_encoder(folder: Path, marker: Path) -> Path:
    """The packaged model's config and tokenizer with a ``pytorch_model.bin`` whose unpickling runs code."""
    import torch

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    shutil.copytree(packaged_path(), folder, ignore=shutil.ignore_patterns("*.safetensors"))
    torch.save({"embeddings.word_embeddings.weight": Payload()}, folder / "pytorch_model.bin")
    return folder


def test_an_encoder_whose_weights_need_unpickling_is_refused_by_name(encoder, tmp_path, capsys):
    from branchgate.models.encoder import Encoder, resolve

    marker = tmp_path / "ran"
    folder = _pickled_encoder(tmp_path / "enc", marker)
    spec = resolve(str(folder))
    with pytest.raises(BranchgateError, match="pytorch_model.bin is a pickle that cannot be loaded safely"):
        Encoder(spec)
    net, meta = load_controller(exported(encoder)["checkpoint"])
    ckpt = save_controller(tmp_path / "c.safetensors", net, dict(meta, encoder=spec.id, encoder_path=spec.path))
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(tmp_path / "m" / "controller.onnx")]) == 2
    err = capsys.readouterr().err
    assert "cannot be loaded safely" in err and str(folder) in err and "Traceback" not in err
    assert not marker.exists()


@pytest.mark.parametrize(
    "name, value",
    [
        ("cand_tower.1.weight", float("nan")),
        ("keep_scale", float("inf")),
        ("scalar_std", 0.0),
        ("feature_min", float("nan")),
    ],
)
def test_weights_that_are_not_finite_numbers_are_refused(encoder, tmp_path, name, value):
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = exported(encoder)["checkpoint"]
    with safe_open(src, framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        metadata = f.metadata()
    tensors[name] = torch.full_like(tensors[name], value)
    save_file(tensors, str(tmp_path / "c.safetensors"), metadata=metadata)
    with pytest.raises(InputError, match=f"weights \\['{name}'\\] hold NaN, an infinity or a spread <= 0"):
        load_controller(tmp_path / "c.safetensors")
