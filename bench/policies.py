"""The closed-loop policy families and their sweeps, as ``branchgate simulate`` pre-retrieval specs
(syntax: ``pipeline/policies.py``), so that every family is a curve of (tokens, KPR) points:

- ``none`` (no pruning, one point);
- every teacher ``NAME:max_items=K`` for K in ``teacher_max_items`` (its breadth budget);
- the gate ``gate:PATH`` at its calibrated τ and ``gate:PATH,tau=T`` for T in ``gate_taus``;
- ``shallow:NODES`` for NODES in ``shallow_nodes``; ``random:RATE`` for RATE in ``random_rates``;
- optional three-stage combinations ``[pre, post, synth]`` (``stages``; ``gate`` in a slot means the gate).
"""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__"):  # the repository root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")

from dataclasses import dataclass

from branchgate.errors import InputError


@dataclass(frozen=True)
class PolicyPoint:
    name: str  # unique report key, e.g. "mmr@2", "gate@tau=0.05"
    family: str  # curve it belongs to: none, gate, mmr, ..., shallow, random, or "stages"
    pre: str
    post: str = "none"
    synth: str = "none"
    budget: float | None = None  # the swept value (K, τ, NODES, RATE)

    @property
    def spec(self) -> str:
        return self.pre if self.post == self.synth == "none" else f"{self.pre} | {self.post} | {self.synth}"


def points(section: dict, gate_path: str) -> list[PolicyPoint]:
    """Every policy point the config section asks for (``configs/bench.yaml``: ``policies``)."""
    from branchgate.models import teachers

    out = [PolicyPoint("none", "none", "none")]
    out.append(PolicyPoint("gate", "gate", f"gate:{gate_path}"))
    for tau in section.get("gate_taus") or []:
        out.append(PolicyPoint(f"gate@tau={tau:g}", "gate", f"gate:{gate_path},tau={tau:g}", budget=float(tau)))
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
    gate = lambda s: f"gate:{gate_path}" if s == "gate" else s  # noqa: E731
    for combo in section.get("stages") or []:
        if len(combo) != 3:
            raise InputError(f"expected [pre, post, synth], got {combo!r}", "policies.stages")
        pre, post, synth = (gate(str(s)) for s in combo)
        out.append(PolicyPoint("+".join(str(s) for s in combo), "stages", pre, post, synth))
    seen = set()
    for p in out:
        if p.name in seen:
            raise InputError(f"policy {p.name!r} listed twice", "policies")
        seen.add(p.name)
    return out
