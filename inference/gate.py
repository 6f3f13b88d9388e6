"""The torch-free Gate: an exported ONNX controller behind onnxruntime + tokenizers.

    gate = Gate.load("controller.onnx")
    sel = gate.select({"root_query": "...", "frame_query": "...", "parent_goal": "", "retained": [], "depth": 0},
                      [{"query": "...", "goal": "..."}, ...])
    sel.kept, sel.p_keep, sel.utility, sel.fallback, sel.out_of_range
    run = gate.run(budget_nodes=12, defer=True)    # a budgeted run: inference/run_gate.py (RunGate)

``out_of_range`` names the structured features of a decision outside the train split's range stored in the
model (metadata ``feature_range``; the graph clamps them to it); warned once per Gate.

A pre-retrieval controller (``Gate.stage`` = metadata ``stage`` = ``pre``, or absent) never yields an empty
selection for a non-empty input (the top-1 fallback keeps the best candidate). Read controllers: below.
Embeddings of texts already seen (root query, frame query, retained branches) are cached per Gate, so
the work per decision is proportional to the texts it has not seen. On two or more cores the new texts
of a decision are encoded as two groups at once (two threads, one session), then the head runs on them
(models exported with skippable parts; ``text_groups``). The Gate is thread-safe. With a BERT WordPiece
tokenizer, plain ASCII texts are tokenised by ``inference.wordpiece`` (the same ids, about 5x faster).
An int8 model quantises activations per run, so a text's embedding depends slightly on the texts encoded
with it (and so on what is cached): p_keep can differ by a few hundredths between a cold and a cached
call; an fp32 model gives the same p_keep either way.

It also implements the ``ValueModel`` protocol (``name``, ``threshold`` = τ, ``score(x, state)`` → p_keep).

**Read controllers.** A controller of ``stage`` ``read`` decides, after a sub-query's search returns its hits and
before any is read, which hits to read. Same graph, inputs mapped differently (``inputs.as_read_decision``)::

    gate = Gate.load("read_controller.onnx")       # gate.stage == "read"
    sel = gate.select(
        {"root_query": "the run's question", "query": "the sub-query searched", "goal": "its goal",
         "read": ["texts read so far", {"title": "...", "snippet": "...", "id": "..."}], "read_ids": ["url-1"],
         "depth": 1},
        [{"title": "...", "snippet": "...", "id": "url-2", "rank": 0}, ...],
    )
    sel.kept, sel.p_keep, sel.not_new      # indices into the hit list as given

- state: ``root_query`` (the run's question: the graph's root text), ``query`` (the sub-query searched: its frame
  text), ``goal`` (its goal), ``read`` (what the run has read, the retained texts: texts, or hits, which count as
  ``texts.hit_text(title, snippet)`` and add their ids to ``read_ids``), ``read_ids`` (ids of hits already read),
  ``depth``; or a ``DecisionState`` (``frame_query`` = the sub-query, ``retained`` = the texts read).
- hits: mappings or objects with ``title`` and/or ``snippet`` (at least one non-empty; the candidate text is
  ``hit_text(title, snippet)``), optional ``id`` (else ``url``) and ``rank`` (an integer ≥ 0; every hit or none),
  scored in rank order (else list order): ``order`` = a hit's position among the hits scored, ``n_candidates``
  = their number, ``n_retained`` = the number of texts read (``features.structured_features``).
- A hit whose id is in ``read_ids`` is not scored and never kept: ``Selection.not_new`` lists it (p_keep and
  utility NaN, null in ``to_json``). ``Selection`` indices always refer to the caller's list.
- Keep rule: ``decide`` without the top-1 fallback: when no hit passes τ, none is read (``kept`` is empty, the
  branch ends); ``select(..., floor="root")`` keeps the top hit then at the root frame (depth 0).
- Candidates given to a read controller, or hits to a pre-retrieval one: an ``InputError`` saying which
  controller this is. A read controller has no budgeted runs (``Gate.run``).

The text side (cleaning, tokenising, encoding, the embedding cache) is ``gate_texts.py`` (``GateTexts``, a
mixin of ``Gate``). Imports only numpy, onnxruntime, tokenizers, the standard library and core-safe branchgate
modules.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from branchgate import __version__
from branchgate.decide import decide, threshold_at
from branchgate.errors import BranchgateError, InputError, MismatchError
from branchgate.features import outside_range, structured_features
from branchgate.fileio import read_bounded
from branchgate.inference.gate_texts import BUCKET_OVERHEAD_TOKENS, CHARS_PER_TOKEN_LIMIT, GateTexts, padded_tokens  # noqa: F401  (importable from here)
from branchgate.inference.inputs import (
    DecisionState,
    as_decision,
    as_max_keep,
    as_tau,
    as_threads,
    decision_texts,
)
from branchgate.inference.metadata import (
    FINGERPRINT_PROBES,
    FINGERPRINT_TOL,
    FINGERPRINT_TOL_INT8,
    PARTS,
    check_fingerprint,
    check_graph,
    check_metadata,
    controller_numbers,
    controller_stage,
)
from branchgate.inference.model_file import controller_path, read_metadata
from branchgate.inference.read_state import check_floor, select_hits
from branchgate.inference.run_gate import Budget, RunGate
from branchgate.inference.schedule import group_threads
from branchgate.inference.selection import Selection  # noqa: F401  (the Gate's answer; also importable from here)
from branchgate.inference.teacher_gate import TeacherGate
from branchgate.inference.wordpiece import checked_wordpiece
from branchgate.pretrained import choice, is_pretrained, resolve


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside ``inference/`` for a warning raised by the function that calls
    this: the warning names the caller's own line, whichever path (pre, read, a run) led there."""
    here, frame, level = os.path.dirname(os.path.abspath(__file__)), sys._getframe(2), 2
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)).startswith(here):
        frame, level = frame.f_back, level + 1
    return level


class Gate(GateTexts):
    """An ONNX controller ready to gate decisions. Build it with ``Gate.load(path)``."""

    name = "gate"
    higher_is_better = True
    stage = "pre"  # the controller's metadata ``stage`` (set at load): "pre" or "read"

    def __init__(
        self,
        session,
        tokenizer,
        meta: dict[str, str],
        path: Path,
        cache_size: int = 4096,
        bucketing: bool = True,
        text_groups: int = 1,
        wordpiece=None,
    ):
        self.session = session
        self.parts = meta.get("parts") == PARTS  # empty input_ids skips the tower, empty cand_idx the head
        self.text_groups = int(text_groups)  # new texts of a decision are encoded as this many groups at once
        self._pool = None
        if self.text_groups > 1:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self.text_groups - 1, thread_name_prefix="branchgate-gate")
        self.tokenizer = tokenizer
        self.meta = dict(meta)
        self.path = path
        self.encoder = meta["encoder"]
        self.stage = controller_stage(meta, str(path))
        numbers = controller_numbers(meta, str(path))
        self.dim, self.max_length, self.tau = numbers.dim, numbers.max_length, numbers.tau
        self.root_tau = numbers.root_tau  # the root frame's own threshold, or None (``thresholds``)
        # The train split's range of each structured feature: the graph clamps to it; select reports leaving it.
        self.feature_range = numbers.feature_range
        self._range_warned = False
        self.cache_size = int(cache_size)
        self.bucketing = bool(bucketing)  # encode texts of very different lengths in separate runs
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._max_chars = self.max_length * CHARS_PER_TOKEN_LIMIT
        self.pad_id = numbers.pad_token_id
        self._wordpiece = wordpiece  # fast path for plain ASCII texts (``checked_wordpiece``), or None

    # -- loading ---------------------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        path: str | Path,
        expected_encoder: str | None = None,
        threads: int | None = None,
        cache_size: int = 4096,
        tokenizer: str | Path | None = None,
        bucketing: bool | None = None,
        text_groups: int | None = None,
    ) -> Gate:
        """Load ``controller.onnx`` (or a directory holding it) and validate its metadata. ``"pretrained:NAME"``
        loads a packaged controller (``branchgate.pretrained``; its teacher variants are ``TeacherGate``s).

        ``threads``: CPU threads the Gate may use, at most ``inputs.THREADS_PER_CORE`` per core (default: all
        cores; onnxruntime's choice of intra-op threads when there is one text group). The tokenizer is the
        ``tokenizer_file`` named in the metadata, beside the model, unless ``tokenizer`` is given; either must hash
        to its ``tokenizer_sha256``.
        Loading embeds a few probe texts: the graph must give the fingerprint of the encoder its metadata names
        (``metadata.check_fingerprint``) and embed a text of ``max_length`` tokens.
        ``cache_size``: embeddings kept (LRU); ``bucketing``: encode texts of very different token lengths
        in separate runs (e.g. a long frame query and short candidates) instead of padding all to the longest;
        by default on only for graphs whose text tower pays for padding (metadata ``text_tower`` ≠ packed).
        ``text_groups``: encode a decision's new texts as this many groups at once, each from its own thread,
        then run the head (needs metadata ``parts``). The groups' runs share one onnxruntime intra-op pool
        (``group_threads``), sized so that the calling threads and its workers together are ``threads``.
        Default: 2 when there are ≥ 2 threads (a decision's few hundred tokens keep two threads busier as two
        runs than as one, int8 especially), else 1 (one graph run per decision).
        """
        if is_pretrained(path):  # a packaged controller (branchgate.pretrained): a Gate, or its teacher behind one
            kw = dict(cache_size=cache_size, tokenizer=tokenizer, bucketing=bucketing, text_groups=text_groups)
            stage, kind, file = resolve(path)
            gate = cls.load(file, expected_encoder=expected_encoder, threads=threads, **kw)
            if kind == "model":
                return gate
            c = choice(stage)
            return TeacherGate(gate, c["teacher"], float(c["teacher_taus"][c["teacher"]]))
        import onnxruntime as ort
        from tokenizers import Tokenizer

        threads = as_threads(threads)
        path = controller_path(path)
        meta = read_metadata(path)
        check_metadata(meta, str(path), expected_encoder)
        cores = int(threads) if threads else (os.cpu_count() or 1)
        parts = meta.get("parts") == PARTS
        groups = int(text_groups) if text_groups is not None else (2 if parts and cores >= 2 else 1)
        if groups < 1:
            raise InputError(f"must be ≥ 1, got {text_groups}", "text_groups")
        if groups > 1 and not parts:
            raise MismatchError(
                f"{path}: text_groups={groups} needs a model whose tower and head are separate "
                f"parts (metadata parts={PARTS!r}); re-export it with branchgate {__version__}"
            )
        intra = group_threads(cores, groups) if groups > 1 else threads
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if intra:
            opts.intra_op_num_threads = int(intra)
            opts.inter_op_num_threads = 1
        try:
            session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise BranchgateError(
                f"{path}: not a loadable ONNX model ({(str(exc).splitlines() or [''])[0][:200]})"
            ) from None
        check_graph(session.get_inputs(), session.get_outputs(), int(meta["dim"]), str(path))
        tok_path = Path(tokenizer) if tokenizer else path.parent / meta["tokenizer_file"]
        if not tok_path.is_file():
            raise BranchgateError(
                f"{tok_path}: tokenizer file missing (it is written beside the model by `branchgate export`)"
            )
        tok_bytes = read_bounded(tok_path, str(tok_path))

        if (
            hashlib.sha256(tok_bytes).hexdigest() != meta["tokenizer_sha256"]
        ):  # required (check_metadata), also for `tokenizer`
            raise MismatchError(f"{tok_path}: tokenizer does not match the model (metadata tokenizer_sha256)")
        try:
            tok_text = tok_bytes.decode("utf-8")
            tok = Tokenizer.from_str(tok_text)
        except Exception as exc:
            raise BranchgateError(
                f"{tok_path}: not a tokenizers tokenizer.json ({str(exc).splitlines()[0][:200]})"
            ) from None
        tok.enable_truncation(max_length=int(meta["max_length"]))
        tok.no_padding()  # the Gate pads itself (a padding setting saved in the file would add pad ids)
        if bucketing is None:
            bucketing = meta.get("text_tower") != "packed"
        gate = cls(
            session,
            tok,
            meta,
            path,
            cache_size=cache_size,
            bucketing=bucketing,
            text_groups=groups,
            wordpiece=checked_wordpiece(tok_text, tok, int(meta["max_length"])),
        )
        try:  # the graph embeds max_length tokens, and as the encoder its metadata names (check_fingerprint)
            vectors = gate.embed([*FINGERPRINT_PROBES, "x " * gate.max_length])
        except Exception as exc:  # e.g. a max_length beyond the text tower's positions
            raise MismatchError(
                f"{path}: the graph cannot embed a text of max_length={gate.max_length} tokens "
                f"({(str(exc).splitlines() or [''])[0][:200]})"
            ) from None
        finally:
            gate.clear_cache()
        int8 = meta.get("precision") == "int8"
        check_fingerprint(gate.encoder, vectors[:-1], str(path), FINGERPRINT_TOL_INT8 if int8 else FINGERPRINT_TOL)
        return gate

    # -- the ValueModel protocol ---------------------------------------------------------------------
    @property
    def threshold(self) -> float:
        return self.tau

    def score(self, x, state) -> np.ndarray:
        """p_keep of the candidate texts ``x.texts`` given a teachers' ``State`` (pre-retrieval)."""
        root = state.query.texts[0] if len(state.query.texts) else ""
        p, _ = self.predict(
            DecisionState(
                root, state.frame_query or "", state.parent_goal or "", list(state.context.texts), int(state.depth or 0)
            ),
            list(x.texts),
        )
        return p

    # -- gating ----------------------------------------------------------------------------------------
    def thresholds(self, tau: float | None = None, root_tau: float | None = None) -> tuple[float, float | None]:
        """``(τ, root τ)`` of a decision: with neither given, the controller's own (its ``root_tau`` metadata, when
        it has one, at the root frame); a ``tau`` given alone applies at every depth; a ``root_tau`` given alone
        keeps the controller's τ below the root."""
        if tau is None and root_tau is None:
            return self.tau, self.root_tau
        return (self.tau if tau is None else as_tau(tau)), (None if root_tau is None else as_tau(root_tau, "root_tau"))

    def select(
        self,
        state,
        candidates: Sequence,
        tau: float | None = None,
        max_keep: int | None = None,
        root_tau: float | None = None,
        floor: str | None = None,
    ) -> Selection:
        """Gate one decision: keep candidates with p_keep ≥ τ (best ``max_keep`` of them), else the top-1.
        τ is ``root_tau`` at the root frame (depth 0) when there is one (``thresholds``), else ``tau``.

        ``state``: a ``DecisionState`` or a mapping with ``root_query, frame_query, parent_goal, retained,
        depth`` (missing keys default to empty). ``candidates``: a list of mappings ``{"query", "goal"}``,
        ``(query, goal)`` pairs or plain strings (the one rule: ``inputs.as_candidates``; a string is refused).

        A read controller (``stage`` ``read``) takes a read state and the search's hits instead (module docstring)
        and keeps no hit when none passes τ, unless ``floor="root"`` (then the top hit at depth 0).
        """
        tau, root_tau = self.thresholds(tau, root_tau)
        max_keep, floor = as_max_keep(max_keep), check_floor(self.stage, floor)
        if self.stage == "read":
            return select_hits(state, candidates, self.predict, tau, root_tau, max_keep, floor, True, self.out_of_range)
        state, texts = as_decision(state, candidates)
        tau = threshold_at(state.depth, tau, root_tau)
        p, u = self.predict(state, texts)
        d = decide(p, tau, max_keep=max_keep)
        return Selection(d.kept, p, u, d.fallback, tau, self.out_of_range(state, len(texts)))

    def run(
        self,
        budget_nodes: int | None = None,
        budget_tokens: int | None = None,
        defer: bool = False,
        run_id: str | None = None,
        **options,
    ):
        """A run-scoped gate spending at most ``budget_nodes`` expansions / ``budget_tokens`` tokens
        (``inference.run_gate.RunGate``; ``options``: tau, max_keep, price_start, price_end, price_exponent,
        defer_margin, revisit_floor, tokens_per_node, max_share). A budgeted run admits by its price, which starts
        at τ at every depth: the controller's ``root_tau`` does not apply."""
        if self.stage != "pre":
            raise BranchgateError(
                f"{self.path}: a budgeted run admits candidate sub-queries: it needs a pre-retrieval controller, and "
                f"this one is a {self.stage} controller (metadata stage={self.stage})"
            )
        return RunGate(self, Budget(budget_nodes, budget_tokens), defer=defer, run_id=run_id, **options)

    def out_of_range(self, state: DecisionState, k: int) -> list[str]:
        """The structured features of this decision outside the train split's range stored in the model (the
        graph clamps them to it); [] for controllers without ranges. Warns once per Gate."""
        out = outside_range(self.feature_range, state.depth or 0, k, len(state.retained or []))
        if out and not self._range_warned:
            self._range_warned = True
            seen = ", ".join(f"{n} {self.feature_range[n][0]:g}..{self.feature_range[n][1]:g}" for n in out)
            warnings.warn(
                f"{self.path}: decision outside the training range ({seen}): clamped to it, named in "
                "Selection.out_of_range (warned once per Gate)",
                RuntimeWarning,
                stacklevel=_caller_level(),
            )
        return out

    def predict(self, state: DecisionState, candidate_texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(p_keep[K], utility[K]) for candidate texts (already formed with ``candidate_text``)."""
        k = len(candidate_texts)
        if k == 0:
            return np.zeros(0, np.float32), np.zeros(0, np.float32)
        texts = [self._clean(t) for t in decision_texts(state, candidate_texts)]
        new, cached, rows = self._plan(texts)
        if self.parts and (not new or (self.text_groups > 1 and len(new) > 1)):
            # New texts in groups at once (or none), then the head alone; every text's embedding is now
            # passed in cached_emb: the new ones first, then the cached ones.
            n = len(new)
            if new:
                fresh = self._encode(new)
                self._remember(new, fresh)
                cached = [*fresh, *cached]
                rows = [r if r is None else ("cached", r[1] if r[0] == "new" else n + r[1]) for r in rows]
            feed = self._head_feed(state, k, rows, 0, cached)
            feed.update({"input_ids": np.zeros((0, 1), np.int64), "attention_mask": np.zeros((0, 1), np.int64)})
            p_keep, utility = self.session.run(["p_keep", "utility"], feed)
        else:
            feed = self._tokens(new)
            if self.bucketing and len(new) > 1:
                new, cached, rows, feed = self._encode_short_first(new, cached, rows, feed)
            feed.update(self._head_feed(state, k, rows, max(len(new), 1), cached))
            p_keep, utility, text_emb = self.session.run(None, feed)
            self._remember(new, text_emb)
        return np.asarray(p_keep, np.float32).reshape(k), np.asarray(utility, np.float32).reshape(k)

    def _head_feed(self, state: DecisionState, k: int, rows, n_new: int, cached) -> dict[str, np.ndarray]:
        """The head's inputs: graph row of every text (new rows first, then ``cached``, then the zero row)."""
        zero_row = n_new + len(cached)
        index = [zero_row if r is None else (r[1] if r[0] == "new" else n_new + r[1]) for r in rows]
        n_ret = len(state.retained or [])
        feats = structured_features(state.depth or 0, k, n_ret)
        return {
            "cached_emb": np.stack(cached).astype(np.float32) if len(cached) else np.zeros((0, self.dim), np.float32),
            "root_idx": np.array(index[0:1], np.int64),
            "frame_idx": np.array(index[1:2], np.int64),
            "goal_idx": np.array(index[2:3], np.int64),
            "retained_idx": np.array(index[3 : 3 + n_ret] if n_ret else [zero_row], np.int64),
            "cand_idx": np.array(index[3 + n_ret :], np.int64),
            "features": feats,
        }
