"""The ASCII WordPiece fast path gives exactly the ids of the `tokenizers` library, or steps aside."""

from __future__ import annotations

import hashlib
import json
import random
import string
from pathlib import Path

import numpy as np
import pytest
from export_support import exported
from tokenizers import Tokenizer

from branchgate.export.samples import sample_decisions
from branchgate.inference.gate import Gate
from branchgate.inference.inputs import as_decision, decision_texts
from branchgate.inference.wordpiece import AsciiWordPiece, checked_wordpiece


@pytest.fixture(scope="module")
def tok_text(encoder) -> str:
    from branchgate.export.onnx_metadata import tokenizer_json

    return tokenizer_json(encoder)


def reference(tok_text: str, max_length: int) -> Tokenizer:
    tok = Tokenizer.from_str(tok_text)
    tok.enable_truncation(max_length=max_length)
    return tok


def ascii_texts(vocab: dict, n: int, seed: int = 0) -> list[str]:
    """Random ASCII texts: vocabulary words and sub-words in any case, punctuation runs, random strings,
    over-long words, tabs and line breaks."""
    rng = random.Random(seed)
    words = [w for w in vocab if w.isascii() and w.isprintable()]
    printable = string.ascii_letters + string.digits + string.punctuation + " "
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 30)):
            r = rng.random()
            if r < 0.45:
                w = rng.choice(words).replace("##", "")
                parts.append(w.upper() if rng.random() < 0.2 else w)
            elif r < 0.65:
                parts.append("".join(rng.choice(printable) for _ in range(rng.randint(1, 12))))
            elif r < 0.72:
                parts.append("".join(rng.choice(string.ascii_letters) for _ in range(rng.randint(95, 110))))
            else:
                parts.append(rng.choice(string.punctuation + " \t\n\r"))
        out.append(rng.choice(["", " ", "\n"]).join(parts))
    return out


@pytest.mark.parametrize("max_length", [512, 9])
def test_same_ids_as_tokenizers_on_ascii_text(tok_text, max_length):
    fast = AsciiWordPiece.from_json(json.loads(tok_text), max_length)
    assert fast is not None
    tok = reference(tok_text, max_length)
    texts = ascii_texts(fast.vocab, 3000) + ["", "a " * 600, "x" * 100, "x" * 101, "U.S.A.", "don't stop!!"]
    texts += [t for s, cands in (as_decision(*d) for d in sample_decisions()) for t in decision_texts(s, cands)]
    for text in texts:
        ids = fast.ids(text)
        if ids is None:  # only non-ASCII texts and texts holding an added token like [MASK] go to tokenizers
            assert not text.isascii() or any(a.lower() in text.lower() for a in fast.added), repr(text[:80])
        else:
            assert ids == tok.encode(text).ids, repr(text[:80])


def test_other_text_goes_to_tokenizers(tok_text):
    fast = AsciiWordPiece.from_json(json.loads(tok_text), 512)
    for text in ("naïve café", "水土流失", "emoji 🐝", "bell \x07 char", "form\x0cfeed", "a [MASK] b", "a [mask] b"):
        assert fast.ids(text) is None, text
    assert fast.ids("plain text, tab\tand\nbreak") is not None


def test_only_bert_wordpiece_tokenizers_get_a_fast_path(tok_text):
    data = json.loads(tok_text)
    assert AsciiWordPiece.from_json(data, 512) is not None
    for key, value in (
        ("normalizer", {"type": "Lowercase"}),
        ("pre_tokenizer", {"type": "Whitespace"}),
        ("post_processor", None),
        ("model", dict(data["model"], type="BPE")),
    ):
        assert AsciiWordPiece.from_json(dict(data, **{key: value}), 512) is None, key
    assert AsciiWordPiece.from_json(data, 1) is None


def test_a_fast_path_that_disagrees_is_not_used(tok_text):
    tok = reference(tok_text, 512)
    assert checked_wordpiece(tok_text, tok, 512) is not None
    cased = json.loads(tok_text)
    cased["normalizer"]["lowercase"] = False  # the fast path would keep capitals the library lowercases
    assert checked_wordpiece(json.dumps(cased), tok, 512) is None


def test_gate_tokens_match_the_library_padded(encoder):
    model = Path(exported(encoder)["files"]["fp32"])
    gate = Gate.load(model, threads=1)
    assert gate._wordpiece is not None
    texts = [
        "Honeybee colony collapse: causes?\nFind the main drivers",
        "Почему пчёлы умирают",
        "",
        "word " * 5000,
        "varroa mites [MASK]",
    ]
    got = gate._tokens(texts)
    gate._wordpiece = None
    want = gate._tokens(texts)
    assert np.array_equal(got["input_ids"], want["input_ids"])
    assert np.array_equal(got["attention_mask"], want["attention_mask"])
    lib = reference(model.with_name("controller.tokenizer.json").read_text(encoding="utf-8"), gate.max_length)
    for row, text in zip(got["input_ids"], texts):
        ids = lib.encode(text).ids
        assert list(row[: len(ids)]) == ids and not row[len(ids) :].any()


def test_padding_saved_in_a_tokenizer_file_is_ignored(encoder, tmp_path):
    model = Path(exported(encoder)["files"]["fp32"])
    data = json.loads(model.with_name("controller.tokenizer.json").read_text(encoding="utf-8"))
    data["padding"] = {
        "strategy": {"Fixed": 64},
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": 0,
        "pad_type_id": 0,
        "pad_token": "[PAD]",
    }
    (tmp_path / "padded.json").write_text(json.dumps(data), encoding="utf-8")
    # a model whose tokenizer file carries a padding setting (its metadata hash is that file's)
    from export_support import relabelled

    from branchgate.inference.model_file import read_metadata

    sha = hashlib.sha256((tmp_path / "padded.json").read_bytes()).hexdigest()
    padded = relabelled(model, tmp_path, dict(read_metadata(model), tokenizer_sha256=sha))
    texts = ["Почему пчёлы умирают", "varroa mites"]
    want = Gate.load(model, threads=1)._tokens(texts)
    got = Gate.load(padded, threads=1, tokenizer=tmp_path / "padded.json")._tokens(texts)
    assert got["input_ids"].shape[1] < 64
    assert np.array_equal(got["input_ids"], want["input_ids"]) and np.array_equal(
        got["attention_mask"], want["attention_mask"]
    )
