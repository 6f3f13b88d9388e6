"""The closed-loop policy families and their sweeps, as ``branchgate simulate`` pre-retrieval specs
(syntax: ``pipeline/stage_policies.py``), so that every family is a curve of (tokens, KPR) points:

- ``none`` (no pruning, one point);
- every teacher ``NAME:max_items=K`` for K in ``teacher_max_items`` (its breadth budget);
- each label source's gate ``gate:PATH`` at its calibrated τ and ``gate:PATH,tau=T`` for T in ``gate_taus``,
  and, for the first label source's gate, its variants (``VARIANTS``), each its own curve: the root frame at
  its own threshold, ``gate:PATH,tau=T,root_tau=R`` for T in ``root_taus``, R = ``root_tau`` (curve
  ``gate+root``), and two measured without a gain (the config's ``experimental`` section): the top-1 fallback
  at the root only, ``gate:PATH,tau=T,fallback=root`` for T in ``stop_taus`` (curve ``gate+stop``), and
  set-aware below the root's own threshold, ``gate:PATH,tau=T,greedy=1,root_tau=R`` for T in
  ``greedy_root_taus`` (curve ``gate+greedy_root``);
- ``shallow:NODES`` for NODES in ``shallow_nodes``; ``random:RATE`` for RATE in ``random_rates``;
- optional three-stage combinations ``[pre, post, synth]`` (``stages``; ``gate`` in a slot means the gate);
- run budgets (``budget_points``, the bench's ``budgets`` step): for each fraction F of ``budget_fractions``, the
  budgeted gate ``gate:PATH,budget_tokens=P%`` with and without ``defer=1``, and the baselines of
  ``budget_baselines`` given the same budget (``dpp:budget_tokens=P%``, ``shallow:budget_tokens=P%``), P = 100·F
  percent of each query's own unpruned tokens (``Config.budget_reference``).
"""

from __future__ import annotations

from dataclasses import dataclass

from branchgate.errors import InputError
from branchgate.models import teachers

STAGES = ("pre", "read", "post", "synth")  # a policy point's stage slots, in the order a search meets them


@dataclass(frozen=True)
class PolicyPoint:
    name: str  # unique report key, e.g. "mmr@2", "gate@tau=0.05"
    family: str  # curve it belongs to: none, gate, mmr, ..., shallow, random, or "stages"
    pre: str
    post: str = "none"
    synth: str = "none"
    budget: float | None = None  # the swept value (K, τ, NODES, RATE)
    read: str = "none"  # the read stage (simulate --read): which hits of a search are read

    @property
    def stages(self) -> dict[str, str]:
        """The spec of each stage (``STAGES``), as ``report.json`` records it."""
        return {s: getattr(self, s) for s in STAGES}

    @property
    def spec(self) -> str:
        """The pre-retrieval spec alone when the other stages keep everything, else ``stage=spec`` of each stage
        that prunes, joined by `` | ``."""
        if self.read == self.post == self.synth == "none":
            return self.pre
        if self.read == "none":
            return f"{self.pre} | {self.post} | {self.synth}"
        return " | ".join(f"{s}={v}" for s, v in self.stages.items() if v != "none" or s == "pre")


def baseline_points(section: dict) -> list[PolicyPoint]:
    """The policy points that do not use the gate (``configs/bench.yaml``: ``policies``): ``none``, every teacher
    over its breadth budget, ``shallow``, ``random`` and the three-stage combinations without ``gate``."""
    out = [PolicyPoint("none", "none", "none")]
    names = section.get("teachers") or list(teachers.NAMES)
    for name in names:
        if name not in teachers.NAMES:
            raise InputError(f"unknown teacher {name!r} (known: {', '.join(teachers.NAMES)})", "policies.teachers")
        for k in section.get("teacher_max_items") or [None]:
            if k is None:
                out.append(PolicyPoint(name, name, name))
            else:
                out.append(PolicyPoint(f"{name}@{int(k)}", name, f"{name}:max_items={int(k)}", budget=float(k)))
    for n in section.get("shallow_nodes") or []:
        out.append(PolicyPoint(f"shallow@{int(n)}", "shallow", f"shallow:{int(n)}", budget=float(n)))
    for r in section.get("random_rates") or []:
        out.append(PolicyPoint(f"random@{r:g}", "random", f"random:{r:g}", budget=float(r)))
    out += _stages(section, None, "gate")
    out += late_teacher_points(section)
    return _unique(out)


LATE_STAGES = {"read": "read_max_items", "post": "post_max_items"}  # stage → its keep-top-k sweep in ``policies``
LATE_THRESHOLDS = {"read": "read_thresholds", "post": "post_thresholds"}  # stage → its threshold sweeps


def late_teacher_points(section: dict) -> list[PolicyPoint]:
    """Every teacher of ``late_teachers`` (default: ``teachers``) alone at the read stage (on the hits' snippets)
    and at post-retrieval (on the full text), each swept over its two knobs, nothing pruned before retrieval:
    keep-top-k per result list (``NAME:max_items=K`` for K in ``read_max_items`` / ``post_max_items``), curve
    ``NAME@read`` / ``NAME@post``; and its threshold (``NAME:threshold=T`` for T in ``read_thresholds[NAME]`` /
    ``post_thresholds[NAME]``), curve ``NAME@read_threshold`` / ``NAME@post_threshold``."""
    names = section.get("late_teachers") or section.get("teachers") or list(teachers.NAMES)
    out = []
    for stage, key in LATE_STAGES.items():
        thresholds = _late_thresholds(section, LATE_THRESHOLDS[stage])
        for name in names:
            if name not in teachers.NAMES:
                raise InputError(
                    f"unknown teacher {name!r} (known: {', '.join(teachers.NAMES)})", "policies.late_teachers"
                )
            for k in section.get(key) or []:
                spec = f"{name}:max_items={int(k)}"
                out.append(
                    PolicyPoint(f"{name}@{stage}{int(k)}", f"{name}@{stage}", "none", budget=float(k), **{stage: spec})
                )
            curve = f"{name}@{stage}_threshold"
            for t in thresholds.get(name) or []:
                point = {stage: f"{name}:threshold={t:g}"}
                out.append(PolicyPoint(f"{curve}={t:g}", curve, "none", budget=float(t), **point))
    return out


def _late_thresholds(section: dict, key: str) -> dict[str, list[float]]:
    """``policies.KEY``: ``{TEACHER: [threshold, ...]}`` (empty: no threshold curves at that stage)."""
    value = section.get(key) or {}
    if not isinstance(value, dict):
        raise InputError(f"expected {{TEACHER: [threshold, ...]}}, got {value!r}", f"policies.{key}")
    for name, ts in value.items():
        if name not in teachers.NAMES:
            raise InputError(f"unknown teacher {name!r} (known: {', '.join(teachers.NAMES)})", f"policies.{key}")
        if not isinstance(ts, list) or not all(isinstance(t, (int, float)) for t in ts):
            raise InputError(f"{name}: expected a list of numbers, got {ts!r}", f"policies.{key}")
    return {k: [float(t) for t in v] for k, v in value.items()}


VARIANTS = {  # a gate variant: (its τ list, SECTION.KEY of the bench config; the gate spec keys it adds)
    "stop": ("experimental.stop_taus", "fallback=root"),  # below the root a frame may keep none
    "root": ("policies.root_taus", "root_tau={root_tau}"),  # the root frame at policies.root_tau, the sweep's τ below
    "greedy_root": ("experimental.greedy_root_taus", "greedy=1,root_tau={root_tau}"),  # set-aware below the root
}


def variant_taus(cfg: dict) -> dict[str, list]:
    """Each gate variant's τ list in the bench config ``cfg`` (``VARIANTS``; empty: the variant does not run)."""
    out = {}
    for variant, (where, _) in VARIANTS.items():
        section, key = where.split(".")
        out[variant] = list((cfg.get(section) or {}).get(key) or [])
    return out


def gate_family(index: int, source: str) -> str:
    """The gate trained on the first label source is ``gate``; the others are ``gate[SOURCE]``."""
    return "gate" if index == 0 else f"gate[{source}]"


def gate_points(section: dict, gate_path: str, family: str = "gate", variants: dict | None = None) -> list[PolicyPoint]:
    """The gate's points: ``gate:PATH`` at its calibrated τ, ``gate:PATH,tau=T`` for T in ``gate_taus``, and
    the three-stage combinations that name ``gate``; with ``variants`` (``variant_taus``) also each variant's
    points (curve ``<family>+<variant>``). ``family`` names the curve (``gate`` for the first label source,
    ``gate[SOURCE]`` for the others), and prefixes every point's name."""
    out = tau_sweep(section.get("gate_taus") or [], gate_path, family)
    for variant, (where, keys) in VARIANTS.items():
        curve = variant_family(family, variant)
        taus = (variants or {}).get(variant) or []
        extra = _variant_keys(keys, section, where) if taus else ""
        for tau in taus:
            out.append(
                PolicyPoint(f"{curve}@tau={tau:g}", curve, f"gate:{gate_path},tau={tau:g},{extra}", budget=float(tau))
            )
    out += _stages(section, gate_path, family)
    return _unique(out)


def _variant_keys(keys: str, section: dict, where: str) -> str:
    """A variant's spec keys with the ``policies`` settings they name filled in (``{root_tau}``)."""
    try:
        return keys.format_map(
            {k: f"{v:g}" if isinstance(v, (int, float)) else v for k, v in section.items() if v is not None}
        )
    except KeyError as exc:
        raise InputError(f"{where} needs policies.{exc.args[0]}", f"policies.{exc.args[0]}") from None


def variant_family(family: str, variant: str) -> str:
    """The curve of gate ``family``'s ``variant`` points (``VARIANTS``)."""
    return f"{family}+{variant}"


def _stages(section: dict, gate_path: str | None, family: str) -> list[PolicyPoint]:
    """Three-stage points: with ``gate_path`` those naming ``gate`` (named with ``family``), without it the rest."""
    out: list[PolicyPoint] = []
    for combo in section.get("stages") or []:
        if not isinstance(combo, (list, tuple)) or len(combo) != 3:
            raise InputError(f"expected [pre, post, synth], got {combo!r}", "policies.stages")
        combo = [str(s) for s in combo]
        if ("gate" in combo) != (gate_path is not None):
            continue
        pre, post, synth = (f"gate:{gate_path}" if s == "gate" else s for s in combo)
        name = "+".join(family if s == "gate" else s for s in combo)
        out.append(PolicyPoint(name, "stages", pre, post, synth))
    return out


def _unique(points: list[PolicyPoint]) -> list[PolicyPoint]:
    seen = set()
    for p in points:
        if p.name in seen:
            raise InputError(f"policy {p.name!r} listed twice", "policies")
        seen.add(p.name)
    return points


BUDGET_FAMILIES = ("gate", "gate+defer")  # the budgeted gate's curves; the baselines' are their own names


def budget_family(name: str) -> str:
    return f"budget:{name}"


def budget_points(section: dict, gate_path: str) -> list[PolicyPoint]:
    """The ``budgets`` step's points: per fraction F of ``budget_fractions``, ``gate@budget=F`` (the run-scoped
    gate), ``gate+defer@budget=F`` and ``NAME@budget=F`` for each of ``budget_baselines`` (a teacher or
    ``shallow``), every one with ``budget_tokens=P%`` (P = 100·F of the query's unpruned tokens)."""
    out = []
    baselines = [str(b) for b in (section.get("budget_baselines") or [])]
    for b in baselines:
        if b != "shallow" and b not in teachers.NAMES:
            raise InputError(
                f"unknown budget baseline {b!r} (shallow or a teacher: {', '.join(teachers.NAMES)})",
                "policies.budget_baselines",
            )
    for f in section.get("budget_fractions") or []:
        f = float(f)
        if not 0 < f <= 1:
            raise InputError(f"a budget fraction must be in (0, 1], got {f:g}", "policies.budget_fractions")
        pct = f"{100 * f:g}%"
        extra = "".join(f",{k}={v:g}" for k, v in sorted((section.get("budget_gate") or {}).items()))
        out.append(
            PolicyPoint(
                f"gate@budget={f:g}", budget_family("gate"), f"gate:{gate_path},budget_tokens={pct}{extra}", budget=f
            )
        )
        out.append(
            PolicyPoint(
                f"gate+defer@budget={f:g}",
                budget_family("gate+defer"),
                f"gate:{gate_path},budget_tokens={pct}{extra},defer=1",
                budget=f,
            )
        )
        for b in baselines:
            out.append(PolicyPoint(f"{b}@budget={f:g}", budget_family(b), f"{b}:budget_tokens={pct}", budget=f))
    return _unique(out)


def tau_sweep(
    taus, gate_path: str, family: str, stage: str = "pre", extra: str = "", **fixed: str
) -> list[PolicyPoint]:
    """One learned controller's curve ``family`` at ``stage``: ``gate:PATH`` at its calibrated τ, then
    ``gate:PATH,tau=T`` for T in ``taus`` (``extra``: spec keys added to every point, e.g. ``floor=root``);
    ``fixed`` holds the other stages' specs (e.g. ``pre="gate:PRE"`` while the read stage is swept)."""
    keys = f",{extra}" if extra else ""
    out = [PolicyPoint(family, family, **{"pre": "none", **fixed, stage: f"gate:{gate_path}{keys}"})]
    for tau in taus:
        spec = f"gate:{gate_path},tau={tau:g}{keys}"
        out.append(
            PolicyPoint(f"{family}@tau={tau:g}", family, budget=float(tau), **{"pre": "none", **fixed, stage: spec})
        )
    return out


READ_FAMILY = "read_gate"  # the read gate's curve (``read_gate[SOURCE]`` for a later label source)
BOTH_FAMILY = "gate+read_gate"  # the pre gate at its calibrated point, the read gate's τ swept
BOTH_REVERSE_FAMILY = "read_gate+gate"  # the read gate at its calibrated point, the pre gate's τ swept


def both_family(pre_tau: float) -> str:
    """Both learned stages with the pre gate at a fixed ``pre_tau`` (``policies.both_pre_taus``), the read τ swept."""
    return f"{BOTH_FAMILY}[pre={pre_tau:g}]"


def is_both_family(family: str) -> bool:
    return family == BOTH_FAMILY or family.startswith(f"{BOTH_FAMILY}[pre=")


def looser_families(families) -> list[str]:
    """The ``both_family`` curves among ``families`` (both stages, the pre gate at a looser τ), sorted, once each."""
    return sorted({f for f in families if is_both_family(f)} - {BOTH_FAMILY})


FLOOR_FAMILY = "read_gate+floor"  # the read gate keeping the top hit at the root frame when none passes τ


def read_family(index: int, source: str) -> str:
    return READ_FAMILY if index == 0 else f"{READ_FAMILY}[{source}]"


def read_gate_points(section: dict, read_path: str, family: str, pre_path: str | None = None) -> list[PolicyPoint]:
    """The read gate's points (``read_gate_taus``, default ``gate_taus``): alone (curve ``family``); for the
    first label source also with the floor at the root (``FLOOR_FAMILY``) and, given the pre-retrieval gate
    ``pre_path``, both learned stages each way (``BOTH_FAMILY``, ``BOTH_REVERSE_FAMILY``) and with the pre gate at
    each looser τ of ``both_pre_taus`` (``both_family``), the read τ swept."""
    taus = section.get("read_gate_taus") or section.get("gate_taus") or []
    out = tau_sweep(taus, read_path, family, "read")
    if family == READ_FAMILY:
        out += tau_sweep(taus, read_path, FLOOR_FAMILY, "read", extra="floor=root")
        if pre_path is not None:
            out += tau_sweep(taus, read_path, BOTH_FAMILY, "read", pre=f"gate:{pre_path}")
            for pre_tau in section.get("both_pre_taus") or []:
                pre = f"gate:{pre_path},tau={pre_tau:g}"
                out += tau_sweep(taus, read_path, both_family(pre_tau), "read", pre=pre)
            pre_taus = section.get("gate_taus") or []
            out += tau_sweep(pre_taus, pre_path, BOTH_REVERSE_FAMILY, "pre", read=f"gate:{read_path}")
    return _unique(out)
