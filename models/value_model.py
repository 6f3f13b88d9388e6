"""The learned pre-retrieval controller: a two-tower value network over frozen-encoder embeddings.

Inputs for ONE decision point (a frame with K candidates), all unit-norm rows from the frozen encoder,
an empty text being the zero vector:

    root[D], frame[D], goal[D]   the state texts (root query, frame query, parent goal)
    retained[R, D]               texts of branches retained before the frame opened (R >= 1: pass one
                                 zero row when nothing is retained; zero rows are ignored)
    cand[K, D]                   candidate_text(query, goal) per candidate
    features[K, F]               raw structured features, columns FEATURE_NAMES

``forward`` returns ``(logit[K], utility[K])``: the keep logit (p_keep = sigmoid; Platt-scaled on
validation after training, so p_keep is a calibrated probability) and the predicted realized utility ĝ
in the dataset's units. Training losses use ``raw_heads`` (before that scaling).

Design:
- State tower: [root, frame, goal, mean(retained)] → Linear → GELU. The retained set enters as a masked
  mean (plus its count and per-candidate max/mean similarities), so a growing set costs one new
  embedding per newly retained branch (each is a candidate text already embedded when it was a
  candidate) and a running sum — encoder work stays proportional to the new texts.
- Candidate tower: cand → Linear → GELU.
- Interactions: the towers' product, plus parameter-free scalar features computed here from the
  embeddings (``INTERACTION_NAMES``): similarities to root/frame/goal, max/mean similarity to the
  retained set and to sibling candidates, rank of the candidate among its siblings, and the cheap
  heuristic-teacher scores — MMR, centroid drift, submodular coverage gain over the frame's pool,
  residual novelty (GRN) and the DPP gain — each the same number as its teacher in ``models/teachers``
  (held to 1e-5 by ``tests/test_feature_parity.py``). The dataset's ``teacher_<name>`` columns are
  deliberately NOT inputs (a Gate would need a second scoring pass to produce them) — they serve as
  baselines only.
- All scalar features are standardised with statistics fitted on the training split and stored as
  buffers, so the exported graph needs nothing else.
- The structured features are first clamped to the training split's range (buffers ``feature_min`` /
  ``feature_max``, ±inf until ``set_feature_range``): a decision with more candidates or a greater depth than
  training saw is scored as the nearest one it did see, never extrapolated (the Gate reports it).
- MLP with two heads (keep logit, utility) plus a linear "wide" path from the scalar features.
- ``towers`` chooses what text the MLP sees besides the scalar features: ``full`` (the default) the candidate
  tower, the state tower and their product; ``interaction`` only the product, so no path reads the candidate
  (or the state) alone — a candidate's phrasing counts only through how it relates to the state;
  ``none`` no towers (the scalar features only: a learned re-weighting of the teachers' quantities).
- ``order``: whether the candidate's position in its list (``order``, ``order_frac``) is an input. Every other
  feature, the towers and the listwise loss are symmetric in the siblings, so with ``order=False`` a decision's
  scores do not depend on the order its candidates are listed in. The simulator shuffles its candidates, so
  there the position carries no signal; ``True`` (the default of files written before the option) keeps it.

``forward`` is ONNX-friendly: no Python control flow on tensor values, masks come from row norms, ranks
from summed pairwise comparisons, and only K and R vary.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from branchgate.features import FEATURE_NAMES as STRUCTURED
from branchgate.models.teachers.common import RIDGE

FEATURE_NAMES = list(STRUCTURED)  # branchgate.features: computed once, for training and the Gate alike
DERIVED_NAMES = ["order_frac", "log_n_candidates", "log_n_retained"]
INTERACTION_NAMES = [
    "sim_root",
    "sim_frame",
    "sim_goal",
    "retained_max",
    "retained_mean",
    "sibling_max",
    "sibling_mean",
    "rank_sim_root",
    "rank_mmr",
    "centroid_drift",
    "mmr",
    "mmr_siblings",
    "coverage_gain",
    "residual_novelty",
    "dpp_gain",
    "root_frame",
    "root_goal",
    "has_frame",
    "has_goal",
]
SCALAR_NAMES = FEATURE_NAMES + DERIVED_NAMES + INTERACTION_NAMES
TOWERS = ("full", "interaction", "none")  # what text the MLP sees besides the scalars (module docstring)
MMR_LAMBDA = 0.35  # the MMR teacher's operating point (models/teachers/mmr.py: λ = 0.35)
MAX_WIDTH = 1 << 20  # sanity bound on dim and hidden (a hidden layer this wide would already be terabytes)


def _valid(x: torch.Tensor) -> torch.Tensor:
    """1.0 for real (unit-norm) rows, 0.0 for zero rows (empty text / padding)."""
    return ((x * x).sum(-1) > 0.25).to(x.dtype)


def _masked_max(values: torch.Tensor, mask: torch.Tensor, any_valid: torch.Tensor) -> torch.Tensor:
    """Max over the last dim where mask == 1; 0 where nothing is valid. Values lie in [-1, 1]-ish."""
    filled = values * mask + (mask - 1.0) * 4.0
    return filled.amax(-1) * any_valid


def _unit64(x: torch.Tensor) -> torch.Tensor:
    """float64 unit rows (as the teachers' ``common.unit``); zero rows (padding) stay zero."""
    return nn.functional.normalize(x.double(), dim=-1, eps=1e-12)


def ridge_residual(c: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``‖x‖² − kᵀ(G + ρI)⁻¹k``, ``G = CCᵀ``, ``k = Cx``: float64 [B,R,D],[B,K,D] → [B,K], in [0, ‖x‖²].

    The graph form of ``models/teachers/common.py::ridge_residual`` (ρ = ``RIDGE``, its docstring says what
    the ridge does). float64 throughout: with ρ = 1e-6 the Gram matrix of nearly duplicated retained rows
    has a condition number up to ~R/ρ, and a float32 inverse of it is garbage (in the exported graph this
    is one onnxruntime Inverse node on double). A zero row of C (padding) has k = 0 and only ρ on its
    diagonal, so it changes nothing.
    """
    r_len = c.shape[1]
    idx = torch.arange(r_len, device=c.device)
    eye = (idx.unsqueeze(0) == idx.unsqueeze(1)).to(c.dtype)
    gram = torch.matmul(c, c.transpose(1, 2)) + RIDGE * eye  # [B,R,R]
    k = torch.matmul(c, x.transpose(1, 2))  # [B,R,K]
    quad = (k * torch.matmul(torch.linalg.inv(gram), k)).sum(1)  # [B,K]
    sq = (x * x).sum(-1)
    return torch.minimum((sq - quad).clamp(min=0.0), sq)


def residual_novelty(retained: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """GRN [B,R,D],[B,K,D] → [B,K] float32 in [0, 1]: the GRN teacher (``models/teachers/novelty.py``).

    ``ridge_residual`` of the unit candidate against the unit retained rows; zero rows of ``retained``
    (padding / nothing retained) are ignored, so with nothing retained the novelty is 1.
    """
    return ridge_residual(_unit64(retained), _unit64(cand)).clamp(0.0, 1.0).float()


def dpp_gain(root: torch.Tensor, retained: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """DPP gain [B,D],[B,R,D],[B,K,D] → [B,K] float32: the DPP teacher (``models/teachers/dpp.py``).

    Kernel ``L_ij = w_i w_j ⟨e_i, e_j⟩`` with ``w = max(sim(e, root), 0)`` for the candidate and every
    retained row alike, so the gain is ``ridge_residual`` of ``w_x x`` against the rows ``w_c c``: a
    retained text with non-positive relevance to the root query drops out of the kernel.
    """
    q, c, x = _unit64(root).unsqueeze(1), _unit64(retained), _unit64(cand)
    w_c = (c * q).sum(-1).clamp(min=0.0).unsqueeze(-1)
    w_x = (x * q).sum(-1).clamp(min=0.0).unsqueeze(-1)
    return ridge_residual(c * w_c, x * w_x).float()


def scalar_features(root, frame, goal, retained, cand, features, mmr_lambda: float = MMR_LAMBDA) -> torch.Tensor:
    """Parameter-free scalar features, batched: shapes [B,D],[B,D],[B,D],[B,R,D],[B,K,D],[B,K,F] → [B,K,S].

    Padded candidates (zero rows) are ignored as siblings; their own outputs are meaningless.
    """
    features = features.to(cand.dtype)
    rmask = _valid(retained)  # [B,R]
    cmask = _valid(cand)  # [B,K]
    n_r = rmask.sum(-1, keepdim=True)  # [B,1]
    n_k = cmask.sum(-1, keepdim=True)  # [B,1]
    has_r = (n_r > 0.5).to(cand.dtype)  # [B,1]

    sim_root = (cand * root.unsqueeze(1)).sum(-1)  # [B,K]
    sim_frame = (cand * frame.unsqueeze(1)).sum(-1)
    sim_goal = (cand * goal.unsqueeze(1)).sum(-1)

    s_ret = torch.matmul(cand, retained.transpose(1, 2))  # [B,K,R]
    rm = rmask.unsqueeze(1)  # [B,1,R]
    ret_max = _masked_max(s_ret, rm, has_r)
    ret_mean = (s_ret * rm).sum(-1) / n_r.clamp(min=1.0)

    k = cand.shape[1]
    idx = torch.arange(k, device=cand.device)
    not_self = (idx.unsqueeze(0) != idx.unsqueeze(1)).to(cand.dtype)  # [K,K]
    pair = not_self.unsqueeze(0) * cmask.unsqueeze(1)  # [B,K,K]: j is a valid sibling of k
    n_sib = pair.sum(-1)  # [B,K]
    has_sib = (n_sib > 0.5).to(cand.dtype)
    s_sib = torch.matmul(cand, cand.transpose(1, 2))  # [B,K,K]
    sib_max = _masked_max(s_sib, pair, has_sib)
    sib_mean = (s_sib * pair).sum(-1) / n_sib.clamp(min=1.0)

    mmr = mmr_lambda * sim_root - (1.0 - mmr_lambda) * ret_max  # the MMR teacher (q = root; empty C: max = 0)
    mmr_sib = mmr_lambda * sim_root - (1.0 - mmr_lambda) * sib_max

    def rank_frac(score: torch.Tensor) -> torch.Tensor:  # fraction of valid siblings scoring higher
        higher = (score.unsqueeze(1) > score.unsqueeze(2)).to(cand.dtype)  # [B,K(k),K(j)]: s_j > s_k
        return (higher * pair).sum(-1) / n_sib.clamp(min=1.0)

    # The heuristic teachers' scores, each the number its teacher in models/teachers gives
    # (tests/test_feature_parity.py). Centroid drift (CentroidDrift): 1 − cos(μ_C, μ_{C+x}); with C empty or
    # a zero centroid μ_C = 0 and the drift is 1, and an x that cancels C exactly also gives 1.
    sum_r = (retained * rmask.unsqueeze(-1)).sum(1)  # [B,D]
    mu_c = nn.functional.normalize(sum_r, dim=-1, eps=1e-8)
    mu_cx = nn.functional.normalize(sum_r.unsqueeze(1) + cand, dim=-1, eps=1e-8)
    drift = 1.0 - (mu_cx * mu_c.unsqueeze(1)).sum(-1)

    # Submodular coverage over the frame's pool P (the valid candidates), w = max(sim(., q), 0):
    # gain(x) = Σ_j max(w(x) sim(x, p_j) − cov_C(p_j), 0) / |P|, cov_C(p_j) = max(0, max_{i∈C} w(i) sim(i, p_j)).
    # This is SubmodularCoverage.gains(x, state) / |P| with extra={"pool": candidates}, as the dataset builds
    # the state; the teacher's score divides by the candidate's token cost instead, which the graph does not
    # have, so |P| normalises the gain here.
    w_r = (retained * root.unsqueeze(1)).sum(-1).clamp(min=0.0)  # [B,R]
    cov = _masked_max(w_r.unsqueeze(1) * s_ret, rm, has_r).clamp(min=0.0)  # [B,K] coverage of pool item j
    w_c = sim_root.clamp(min=0.0)
    gain = ((w_c.unsqueeze(-1) * s_sib - cov.unsqueeze(1)).clamp(min=0.0) * cmask.unsqueeze(1)).sum(-1)
    gain = gain / n_k.clamp(min=1.0)

    # GRN and DPP: one ridge-regularised projection each, in float64 (see ridge_residual).
    grn = residual_novelty(retained, cand)
    dpp = dpp_gain(root, retained, cand)

    ones = torch.ones_like(sim_root)
    root_frame = (root * frame).sum(-1, keepdim=True) * ones
    root_goal = (root * goal).sum(-1, keepdim=True) * ones
    has_frame = _valid(frame).unsqueeze(-1) * ones
    has_goal = _valid(goal).unsqueeze(-1) * ones

    order, n_cand, n_ret = features[..., 1], features[..., 2], features[..., 3]
    order_frac = order / (n_cand - 1.0).clamp(min=1.0)
    derived = [order_frac, torch.log1p(n_cand.clamp(min=0.0)), torch.log1p(n_ret.clamp(min=0.0))]
    inter = [
        sim_root,
        sim_frame,
        sim_goal,
        ret_max,
        ret_mean,
        sib_max,
        sib_mean,
        rank_frac(sim_root),
        rank_frac(mmr),
        drift,
        mmr,
        mmr_sib,
        gain,
        grn,
        dpp,
        root_frame,
        root_goal,
        has_frame,
        has_goal,
    ]
    return torch.cat([features, torch.stack(derived + inter, dim=-1)], dim=-1)


def check_config(dim, hidden, dropout, mmr_lambda) -> None:
    """``ValueError`` naming the first of ValueNet's numeric arguments no network can be built with: ``dim`` and
    ``hidden`` integers in [1, ``MAX_WIDTH``], ``dropout`` and ``mmr_lambda`` numbers in [0, 1]. (Sizes that
    fit no weights are the checkpoint's to refuse: ``training.checkpoint``.)"""
    for name, value in (("dim", dim), ("hidden", hidden)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= MAX_WIDTH:
            raise ValueError(f"{name} must be an integer in [1, {MAX_WIDTH}], got {value!r}")
    for name, value in (("dropout", dropout), ("mmr_lambda", mmr_lambda)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")  # also refuses nan


class ValueNet(nn.Module):
    """Two-tower value network; see the module docstring. Pure torch, ONNX-exportable."""

    def __init__(
        self,
        dim: int,
        hidden: int = 128,
        dropout: float = 0.1,
        mmr_lambda: float = MMR_LAMBDA,
        n_features: int = len(FEATURE_NAMES),
        towers: str = "full",
        order: bool = True,
    ):
        super().__init__()
        check_config(dim, hidden, dropout, mmr_lambda)
        if n_features != len(FEATURE_NAMES):
            raise ValueError(f"expected {len(FEATURE_NAMES)} structured features {FEATURE_NAMES}, got {n_features}")
        if towers not in TOWERS:
            raise ValueError(f"towers must be one of {', '.join(TOWERS)}; got {towers!r}")
        self.dim, self.hidden, self.dropout_p, self.mmr_lambda = (
            int(dim),
            int(hidden),
            float(dropout),
            float(mmr_lambda),
        )
        self.towers, self.order = towers, bool(order)
        n_scalar = len(SCALAR_NAMES)
        if towers != "none":
            self.state_tower = nn.Sequential(nn.Dropout(dropout), nn.Linear(4 * dim, hidden), nn.GELU())
            self.cand_tower = nn.Sequential(nn.Dropout(dropout), nn.Linear(dim, hidden), nn.GELU())
        n_text = {"full": 3, "interaction": 1, "none": 0}[towers] * hidden
        self.mlp = nn.Sequential(
            nn.Linear(n_text + n_scalar, hidden),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Dropout(dropout),
        )
        self.heads = nn.Linear(hidden, 2)  # [keep logit, standardised utility]
        self.wide = nn.Linear(n_scalar, 2)
        self.register_buffer("scalar_mean", torch.zeros(n_scalar))
        self.register_buffer("scalar_std", torch.ones(n_scalar))
        self.register_buffer("utility_mean", torch.zeros(()))
        self.register_buffer("utility_std", torch.ones(()))
        # Platt scaling of the keep logit, fitted on validation after training (identity until then).
        self.register_buffer("keep_scale", torch.ones(()))
        self.register_buffer("keep_shift", torch.zeros(()))
        # The train split's range of each structured feature; features are clamped to it (±inf: no clamp).
        self.register_buffer("feature_min", torch.full((n_features,), -math.inf))
        self.register_buffer("feature_max", torch.full((n_features,), math.inf))

    def config(self) -> dict:
        """Constructor arguments (stored in checkpoints)."""
        return {
            "dim": self.dim,
            "hidden": self.hidden,
            "dropout": self.dropout_p,
            "mmr_lambda": self.mmr_lambda,
            "towers": self.towers,
            "order": self.order,
        }

    def scalars(self, root, frame, goal, retained, cand, features) -> torch.Tensor:
        """Raw (unstandardised) scalar features, batched [B,K,S], from the structured features clamped to the
        train split's range (``set_feature_range``): the network is never asked about values it has not seen."""
        features = features.to(cand.dtype)
        features = torch.minimum(
            torch.maximum(features, self.feature_min.to(cand.dtype)), self.feature_max.to(cand.dtype)
        )
        if not self.order:  # the position in the list reads as 0 (order, order_frac): the scores ignore the order
            j = FEATURE_NAMES.index("order")
            features = torch.cat(
                [features[..., :j], torch.zeros_like(features[..., j : j + 1]), features[..., j + 1 :]], -1
            )
        return scalar_features(root, frame, goal, retained, cand, features, self.mmr_lambda)

    @torch.no_grad()
    def set_feature_range(self, lo, hi) -> None:
        """Clamp every structured feature to [lo, hi] (per feature, FEATURE_NAMES order): the train split's range."""
        self.feature_min.copy_(torch.as_tensor(lo, dtype=torch.float32))
        self.feature_max.copy_(torch.as_tensor(hi, dtype=torch.float32))

    def feature_range(self) -> dict | None:
        """``{feature: [min, max]}`` of the train split, or None when no range was set (an older controller)."""
        lo, hi = self.feature_min.tolist(), self.feature_max.tolist()
        if not all(math.isfinite(v) for v in lo + hi):
            return None
        return {name: [a, b] for name, a, b in zip(FEATURE_NAMES, lo, hi)}

    def raw_heads(self, root, frame, goal, retained, cand, features, scalars=None):
        """Batched scoring: [B,D]x3, [B,R,D], [B,K,D], [B,K,F] → (logit[B,K], standardised utility[B,K]).

        ``scalars`` [B,K,S]: this batch's ``scalars(...)`` computed beforehand (training computes them once per
        decision, since they have no parameters); None computes them here, as the exported graph does."""
        if scalars is None:
            scalars = self.scalars(root, frame, goal, retained, cand, features)
        s = (scalars - self.scalar_mean) / self.scalar_std
        parts = [s]
        if self.towers != "none":
            rmask = _valid(retained).unsqueeze(-1)
            ret_mean = (retained * rmask).sum(1) / rmask.sum(1).clamp(min=1.0)
            h_s = self.state_tower(torch.cat([root, frame, goal, ret_mean], dim=-1))  # [B,H]
            h_c = self.cand_tower(cand)  # [B,K,H]
            h_s = h_s.unsqueeze(1) * torch.ones_like(h_c[..., :1])
            parts = [h_c, h_s, h_c * h_s, s] if self.towers == "full" else [h_c * h_s, s]
        out = self.heads(self.mlp(torch.cat(parts, dim=-1))) + self.wide(s)
        return out[..., 0], out[..., 1]

    def score_batch(self, root, frame, goal, retained, cand, features):
        """Batched (padded) version of ``forward``: → (calibrated logit[B,K], utility[B,K])."""
        logit, z = self.raw_heads(root, frame, goal, retained, cand, features)
        return logit * self.keep_scale + self.keep_shift, z * self.utility_std + self.utility_mean

    def forward(self, root, frame, goal, retained, cand, features):
        """One decision: root[D], frame[D], goal[D], retained[R,D], cand[K,D], features[K,F]
        → (logit[K], utility[K])."""
        logit, util = self.score_batch(
            root.unsqueeze(0),
            frame.unsqueeze(0),
            goal.unsqueeze(0),
            retained.unsqueeze(0),
            cand.unsqueeze(0),
            features.unsqueeze(0),
        )
        return logit[0], util[0]

    @torch.no_grad()
    def set_standardisation(self, scalar_mean, scalar_std, utility_mean: float = 0.0, utility_std: float = 1.0) -> None:
        std = torch.as_tensor(scalar_std, dtype=torch.float32).clamp(min=1e-6)
        self.scalar_mean.copy_(torch.as_tensor(scalar_mean, dtype=torch.float32))
        self.scalar_std.copy_(std)
        self.utility_mean.fill_(float(utility_mean))
        self.utility_std.fill_(max(float(utility_std), 1e-6))

    @torch.no_grad()
    def set_keep_calibration(self, scale: float = 1.0, shift: float = 0.0) -> None:
        """p_keep = sigmoid(scale * raw_logit + shift); scale must be positive (the ranking is kept)."""
        if not scale > 0:
            raise ValueError(f"keep calibration scale must be > 0, got {scale}")
        self.keep_scale.fill_(float(scale))
        self.keep_shift.fill_(float(shift))

    def standardisation(self) -> dict:
        return {
            "scalar_names": list(SCALAR_NAMES),
            "scalar_mean": [float(v) for v in self.scalar_mean],
            "scalar_std": [float(v) for v in self.scalar_std],
            "utility_mean": float(self.utility_mean),
            "utility_std": float(self.utility_std),
        }
