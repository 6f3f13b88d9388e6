"""Controller files: safetensors round trip, validation errors, and no unpickling of untrusted ``.ckpt`` files."""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from branchgate.cli import main
from branchgate.errors import InputError, MismatchError
from branchgate.models.encoder import EncoderSpec
from branchgate.models.value_model import SCALAR_NAMES, ValueNet
from branchgate.training.checkpoint import (
    CONTROLLER_SCHEMA_VERSION,
    META_KEYS,
    checkpoint_entry,
    load_controller,
    make_meta,
    save_controller,
)

REPO = Path(__file__).resolve().parents[1]


def _meta(**kw):
    return make_meta(
        EncoderSpec("sentence-transformers/all-MiniLM-L6-v2", "/nowhere"),
        tau=0.42,
        data_sha256="abc",
        dim=16,
        max_length=128,
        **kw,
    )


def _net() -> ValueNet:
    torch.manual_seed(1)
    net = ValueNet(16, hidden=8, dropout=0.0)
    net.set_standardisation(
        torch.arange(len(SCALAR_NAMES), dtype=torch.float32), torch.full((len(SCALAR_NAMES),), 2.0), 0.7, 3.0
    )
    net.set_keep_calibration(1.5, -0.25)
    return net.eval()


def _inputs():
    g = torch.Generator().manual_seed(2)

    def unit(*shape):
        return torch.nn.functional.normalize(torch.randn(*shape, generator=g), dim=-1)

    return (
        unit(16),
        unit(16),
        torch.zeros(16),
        unit(2, 16),
        unit(3, 16),
        torch.tensor([[1.0, i, 3, 2] for i in range(3)]),
    )


def _same_outputs(a: ValueNet, b: ValueNet) -> None:
    with torch.no_grad():
        for x, y in zip(a(*_inputs()), b(*_inputs())):
            assert torch.equal(x, y)


def _read(path):
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())


def _rewrite(path, tensors=None, entry=None, text=None):
    """Rewrite a controller file with changed tensors / ``branchgate`` entry (dict) / raw metadata text."""
    old_tensors, header = _read(path)
    metadata = {
        "branchgate": text if text is not None else json.dumps(entry) if entry is not None else header["branchgate"]
    }
    save_file(old_tensors if tensors is None else tensors, str(path), metadata=metadata)
    return path


@pytest.fixture
def saved(tmp_path):
    net = _net()
    return net, save_controller(tmp_path / "controller.safetensors", net, _meta())


def _entry(path) -> dict:
    return json.loads(_read(path)[1]["branchgate"])


# -- the safetensors format ---------------------------------------------------------------------------------
def test_round_trip_preserves_outputs_and_meta(saved):
    net, path = saved
    loaded, meta = load_controller(path)
    assert not loaded.training
    assert set(META_KEYS) <= set(meta)
    assert meta["tau"] == pytest.approx(0.42) and meta["dim"] == 16 and meta["encoder"].endswith("all-MiniLM-L6-v2")
    assert meta["standardisation"]["utility_std"] == pytest.approx(3.0)
    assert float(loaded.keep_scale) == 1.5 and float(loaded.keep_shift) == -0.25
    _same_outputs(net, loaded)


def test_file_is_safetensors_weights_plus_one_json_entry(saved):
    net, path = saved
    assert path.read_bytes()[8:9] == b"{"  # safetensors: u64 header length, then the JSON header (no pickle)
    tensors, header = _read(path)
    assert set(header) == {"branchgate"}
    assert set(tensors) == set(net.state_dict())  # weights and the standardisation / calibration buffers
    for key in ("scalar_mean", "scalar_std", "utility_mean", "utility_std", "keep_scale", "keep_shift"):
        assert torch.equal(tensors[key], net.state_dict()[key]), key
    entry = json.loads(header["branchgate"])
    assert entry["net"] == net.config()
    assert entry["meta"]["schema_version"] == CONTROLLER_SCHEMA_VERSION and set(META_KEYS) <= set(entry["meta"])
    assert entry["meta"]["standardisation"]["scalar_std"] == [2.0] * len(SCALAR_NAMES)


def test_meta_with_nan_and_numpy_values_is_written_as_plain_json(tmp_path):
    import numpy as np

    path = save_controller(
        tmp_path / "c.safetensors", _net(), _meta(train_stats={"n_pos": np.int64(3), "u": float("nan")})
    )
    assert _entry(path)["meta"]["train_stats"] == {"n_pos": 3, "u": None}
    assert load_controller(path)[1]["train_stats"] == {"n_pos": 3, "u": None}


def test_save_is_atomic_and_leaves_no_temporary_file(tmp_path):
    path = save_controller(tmp_path / "c.safetensors", _net(), _meta())
    before = path.read_bytes()
    with pytest.raises(ValueError, match="lacks"):
        save_controller(path, _net(), {"encoder": "x"})  # bad meta: the old file stays as it was
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.safetensors"]


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="not found") as err:
        load_controller(tmp_path / "missing.safetensors")
    assert "missing.safetensors" in str(err.value)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "header_only"])
def test_corrupt_or_truncated_file_is_a_named_input_error(saved, damage):
    _, path = saved
    data = path.read_bytes()
    path.write_bytes({"truncated": data[:-7], "garbage": b"\x07" * 64, "empty": b"", "header_only": data[:40]}[damage])
    with pytest.raises(InputError, match="not a readable safetensors controller file") as err:
        load_controller(path)
    assert err.value.file == str(path)


def test_safetensors_without_the_branchgate_entry(tmp_path):
    path = tmp_path / "other.safetensors"
    save_file({"w": torch.zeros(2)}, str(path), metadata={"other": "1"})
    with pytest.raises(InputError, match="no 'branchgate' entry") as err:
        load_controller(path)
    assert err.value.file == str(path)


@pytest.mark.parametrize(
    "text, match",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not an object"),
        ('{"net": {}, "meta": 3}', r"'branchgate.meta' is missing or not an object"),
    ],
)
def test_wrong_json_is_a_named_input_error(saved, text, match):
    _, path = saved
    _rewrite(path, text=text)
    with pytest.raises(InputError, match=match) as err:
        load_controller(path)
    assert err.value.file == str(path)


@pytest.mark.parametrize(
    "section, key, value, match",
    [
        ("meta", "tau", None, r"'branchgate.meta' lacks \['tau'\]"),
        ("net", "hidden", None, r"'branchgate.net' lacks \['hidden'\]"),
        ("meta", "dim", "16", r"'branchgate.meta.dim' has the wrong type"),
        ("meta", "schema_version", True, r"'branchgate.meta.schema_version' has the wrong type"),
        ("meta", "encoder", 7, r"'branchgate.meta.encoder' has the wrong type"),
        ("meta", "feature_names", "depth", r"'branchgate.meta.feature_names' has the wrong type"),
        ("meta", "feature_names", [1, 2], r"feature_names' must be a list of strings"),
        ("net", "dropout", "0.1", r"'branchgate.net.dropout' has the wrong type"),
        ("meta", "schema_version", 0, "unknown controller schema_version 0"),
    ],
)
def test_missing_keys_and_wrong_types_name_the_field(saved, section, key, value, match):
    _, path = saved
    entry = _entry(path)
    if value is None:
        del entry[section][key]
    else:
        entry[section][key] = value
    _rewrite(path, entry=entry)
    with pytest.raises(InputError, match=match) as err:
        load_controller(path)
    assert err.value.file == str(path)


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("schema_version", CONTROLLER_SCHEMA_VERSION + 1, "newer than this branchgate"),
        ("feature_names", ["depth"], r"features \(meta.feature_names\) \['depth'\]"),
        ("dim", 384, "meta.dim 384 != net.dim 16"),
    ],
)
def test_meta_disagreeing_with_this_branchgate_or_the_net_is_a_mismatch(saved, key, value, match):
    _, path = saved
    entry = _entry(path)
    entry["meta"][key] = value
    _rewrite(path, entry=entry)
    with pytest.raises(MismatchError, match=match) as err:
        load_controller(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    "change, match",
    [
        ("drop_keep_scale", r"do not fit.*keep_scale"),  # no silent default for missing calibration buffers
        ("extra", r"do not fit.*surplus"),
        ("wrong_shape", r"do not fit.*scalar_mean"),
        ("integer", r"\['utility_std'\] are not floating-point"),
        ("net_config", r"do not fit"),
    ],
)
def test_tensors_that_do_not_fit_the_valuenet(saved, change, match):
    _, path = saved
    tensors, _ = _read(path)
    entry = None
    if change == "drop_keep_scale":
        del tensors["keep_scale"]
    elif change == "extra":
        tensors["surplus"] = torch.zeros(3)
    elif change == "wrong_shape":
        tensors["scalar_mean"] = torch.zeros(5)
    elif change == "integer":
        tensors["utility_std"] = torch.tensor(1, dtype=torch.int64)
    else:  # the config says a wider net than the weights
        entry = _entry(path)
        entry["net"]["hidden"] = 32
    _rewrite(path, tensors=tensors, entry=entry)
    with pytest.raises(InputError, match=match) as err:
        load_controller(path)
    assert err.value.file == str(path)


# -- Lightning / torch .ckpt files: weights_only=True or nothing ---------------------------------------------
class _Payload:
    """Unpickling this runs ``os.system("touch MARKER")``: what a crafted checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


def _evil(tmp_path, how: str = "torch") -> tuple[Path, Path]:
    marker = tmp_path / "MARKER"
    evil = tmp_path / "evil.ckpt"
    net = _net()
    obj = {
        "state_dict": {f"net.{k}": v for k, v in net.state_dict().items()},
        "branchgate": checkpoint_entry(net, _meta()),
        "hyper_parameters": _Payload(marker),
    }
    if how == "torch":
        torch.save(obj, evil)
    else:
        evil.write_bytes(pickle.dumps(obj, protocol=int(how)))
    return evil, marker


def test_the_payload_really_runs_code_when_unpickled(tmp_path):
    """Control: the crafted file is live, so the marker checks below can fail."""
    evil, marker = _evil(tmp_path)
    torch.load(evil, weights_only=False)  # what the old fallback did
    assert marker.exists()


@pytest.mark.parametrize("how", ["torch", "2", "5"])
def test_crafted_pickle_is_refused_and_runs_nothing(tmp_path, how):
    evil, marker = _evil(tmp_path, how)
    with pytest.raises(InputError, match="cannot be loaded safely") as err:
        load_controller(evil)
    assert err.value.file == str(evil) and "controller.safetensors" in str(err.value)
    assert not marker.exists()


def _cli_cases(evil: Path, tmp_path: Path) -> dict[str, list[str]]:
    return {
        "export": ["export", "--checkpoint", str(evil), "--out", str(tmp_path / "out" / "controller.onnx")],
        "evaluate": [
            "evaluate",
            "--checkpoint",
            str(evil),
            "--dataset",
            str(tmp_path / "no-dataset"),
            "--out",
            str(tmp_path / "eval"),
        ],
        "bench-gate": [
            "bench-gate",
            "--model",
            str(tmp_path / "controller.onnx"),
            "--checkpoint",
            str(evil),
            "--reps",
            "1",
            "--threads",
            "1",
        ],
    }


@pytest.mark.parametrize("command", ["export", "evaluate", "bench-gate"])
def test_cli_refuses_a_crafted_checkpoint_with_exit_2(tmp_path, capsys, command):
    evil, marker = _evil(tmp_path)
    rc = main(_cli_cases(evil, tmp_path)[command])
    err = capsys.readouterr().err
    assert rc == 2
    assert str(evil) in err and "cannot be loaded safely" in err and "controller.safetensors" in err
    assert not marker.exists()
    assert not (tmp_path / "out").exists() and not (tmp_path / "eval").exists()


def test_plain_tensor_ckpt_still_loads(tmp_path):
    """A Lightning-layout ``.ckpt`` holding only containers and tensors loads with weights_only=True."""
    net = _net()
    path = tmp_path / "plain.ckpt"
    torch.save(
        {
            "state_dict": {f"net.{k}": v for k, v in net.state_dict().items()},
            "branchgate": checkpoint_entry(net, _meta()),
            "epoch": 3,
        },
        path,
    )
    loaded, meta = load_controller(path)
    assert meta["tau"] == pytest.approx(0.42)
    _same_outputs(net, loaded)


def test_ckpt_without_the_branchgate_entry(tmp_path):
    torch.save({"state_dict": {}}, tmp_path / "other.ckpt")
    with pytest.raises(InputError, match="not a branchgate controller") as err:
        load_controller(tmp_path / "other.ckpt")
    assert err.value.file == str(tmp_path / "other.ckpt")


def test_no_product_code_unpickles():
    """Outside tests/, nothing calls full unpickling: no weights_only=False, no pickle module, no allow_pickle."""
    pattern = re.compile(
        r"weights_only\s*=\s*False|^\s*(import|from)\s+(pickle|cPickle|dill|cloudpickle|joblib)\b"
        r"|allow_pickle\s*=\s*True|pickle\.loads?\(",
        re.MULTILINE,
    )
    offenders = []
    for py in REPO.rglob("*.py"):
        rel = py.relative_to(REPO)
        if (
            rel.parts[0] in ("tests", "build", "dist")
            or "egg-info" in rel.parts[0]
            or any(part.startswith(".") for part in rel.parts)
        ):  # .git, .ci/.venv-* (third-party code)
            continue
        if pattern.search(py.read_text(encoding="utf-8", errors="replace")):
            offenders.append(str(rel))
    assert offenders == []
    assert pattern.search("torch.load(p, weights_only=False)") and pattern.search("import pickle\n")


def test_towers_round_trip_and_files_without_the_key(tmp_path):
    torch.manual_seed(3)
    net = ValueNet(16, hidden=8, dropout=0.0, towers="interaction").eval()
    path = save_controller(tmp_path / "c.safetensors", net, _meta())
    loaded, _ = load_controller(path)
    assert loaded.towers == "interaction"
    _same_outputs(net, loaded)
    # a file written before the option: no "towers" key, full towers (the default)
    full = _net()
    old = save_controller(tmp_path / "old.safetensors", full, _meta())
    entry = _entry(old)
    del entry["net"]["towers"]
    loaded, _ = load_controller(_rewrite(old, entry=entry))
    assert loaded.towers == "full"
    _same_outputs(full, loaded)
    entry["net"]["towers"] = 3
    with pytest.raises(InputError, match="towers"):
        load_controller(_rewrite(old, entry=entry))


def test_order_option_round_trips_and_files_without_it_keep_the_position(tmp_path):
    torch.manual_seed(3)
    net = ValueNet(16, hidden=8, dropout=0.0, order=False).eval()
    tmp = save_controller(tmp_path / "c.safetensors", net, _meta())
    loaded, _ = load_controller(tmp)
    assert loaded.order is False
    _same_outputs(net, loaded)
    entry = _entry(tmp)
    del entry["net"]["order"]  # a file written before the option: the position is an input
    assert load_controller(_rewrite(tmp, entry=entry))[0].order is True
    entry["net"]["order"] = "no"
    with pytest.raises(InputError, match="order"):
        load_controller(_rewrite(tmp, entry=entry))
