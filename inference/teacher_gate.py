"""A teacher behind the Gate's interface (``TeacherGate``): the zero-training default of a stage whose pretrained
controller did not beat its best teacher on the real Search-o1 decisions (``branchgate.pretrained``).

    gate = Gate.load("pretrained:read-teacher")     # or pretrained:read when choice.json says "teacher"
    sel = gate.select(state, hits)                   # the same inputs, keep rule and Selection as Gate.select

Texts are embedded by a shipped controller's text tower (``Gate.embed``: the graph's tower alone), and each
candidate is scored by the core teacher (``models.teachers``) exactly as ``dataset build`` writes its
``teacher_<name>`` column: x = the candidates' texts, state = ``State([root query], retained texts, frame query,
goal, depth, {"pool": x})``. Keep rule: ``decide`` on the teacher's score with the teacher's τ (calibrated on the
bundled samples' training rows by the controllers' own rule, F1 on the validation split: ``choice.json``): a
pre-retrieval decision keeps its top-1 when none passes τ; a read decision keeps none (or the top hit at depth 0
with ``floor="root"``). ``Selection.p_keep`` and ``utility`` hold the teacher's scores, not probabilities.
Core only (numpy + the Gate).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from branchgate.decide import decide, threshold_at
from branchgate.errors import BranchgateError
from branchgate.inference.inputs import DecisionState, as_decision, as_max_keep, as_tau
from branchgate.inference.read_state import check_floor, select_hits
from branchgate.inference.selection import Selection
from branchgate.models.teachers import Items, State, get


class TeacherGate:
    """``teacher`` (a name in ``models.teachers.NAMES``) at threshold ``tau``, embedding with ``gate``'s tower."""

    higher_is_better = True

    def __init__(self, gate, teacher: str, tau: float, root_tau: float | None = None):
        self.gate = gate
        self.teacher = get(teacher)
        self.name = f"teacher:{self.teacher.name}"
        self.stage = gate.stage
        self.tau = float(tau)
        self.root_tau = None if root_tau is None else float(root_tau)
        self.path = gate.path
        self.encoder = gate.encoder
        self.meta = {**gate.meta, "teacher": self.teacher.name, "tau": str(self.tau)}

    @property
    def threshold(self) -> float:
        return self.tau

    def thresholds(self, tau: float | None = None, root_tau: float | None = None) -> tuple[float, float | None]:
        """``Gate.thresholds``' rule, but a ``tau`` is a teacher score (any real number, e.g. MMR's are negative),
        not a probability, so it is not checked against [0, 1] as the Gate's is."""
        if tau is None and root_tau is None:
            return self.tau, self.root_tau
        return (self.tau if tau is None else float(tau)), (None if root_tau is None else as_tau(root_tau, "root_tau"))

    def scores(self, state: DecisionState, texts: Sequence[str]) -> np.ndarray:
        """The teacher's score of each candidate text given the decision's state."""
        if not texts:
            return np.zeros(0, np.float32)
        retained = [t for t in (state.retained or []) if t and str(t).strip()]
        emb = self.gate.embed([state.root_query or "", *retained, *texts])
        q, ctx, x = emb[:1], emb[1 : 1 + len(retained)], emb[1 + len(retained) :]
        cands = Items(list(texts), x)
        context = Items(retained, ctx) if retained else Items.empty(self.gate.dim)
        st = State(
            Items([state.root_query or ""], q),
            context,
            state.frame_query or "",
            state.parent_goal or "",
            int(state.depth or 0),
            {"pool": cands},
        )
        return np.asarray(self.teacher.score(cands, st), np.float32)

    def select(
        self,
        state,
        candidates: Sequence,
        tau: float | None = None,
        max_keep: int | None = None,
        root_tau: float | None = None,
        floor: str | None = None,
    ) -> Selection:
        """``Gate.select``'s inputs and answer, the teacher's scores in place of p_keep (module docstring)."""
        tau, root_tau = self.thresholds(tau, root_tau)
        max_keep, floor = as_max_keep(max_keep), check_floor(self.stage, floor)
        hib = self.teacher.higher_is_better
        if self.stage == "read":
            return select_hits(state, candidates, self._scored, tau, root_tau, max_keep, floor, hib)
        st, texts = as_decision(state, candidates)
        t = threshold_at(st.depth, tau, root_tau)
        s, _ = self._scored(st, texts)
        d = decide(s, t, higher_is_better=hib, max_keep=max_keep)
        return Selection(d.kept, s, s.copy(), d.fallback, t, [])

    def _scored(self, state: DecisionState, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The teacher's scores in the Gate's (p_keep, utility) place."""
        s = self.scores(state, texts)
        return s, s.copy()

    def score(self, x, state) -> np.ndarray:
        """The ``ValueModel`` protocol: the teacher's own score (the texts embedded by the tower)."""
        return np.asarray(self.teacher.score(x, state), np.float32)

    @property
    def dim(self) -> int:
        return self.gate.dim

    @property
    def max_length(self) -> int:
        return self.gate.max_length

    def run(self, *a, **kw):
        raise BranchgateError(
            f"{self.name}: a teacher gate has no budgeted runs; use a learned pre controller "
            "(e.g. Gate.load('pretrained:pre-model'))"
        )
