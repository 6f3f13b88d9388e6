"""Realistic sample decisions (8 candidates each) for the export parity fallback and the latency benchmark, and
sample read decisions (10 hits each) for a read controller's latency.

Core-safe: plain data. Each decision is ``(state_dict, candidates)`` (``(read_state, hits)``) in the Gate's JSON
shape.
"""

from __future__ import annotations

from branchgate.texts import candidate_text

_TOPICS = [
    (
        "What are the long-term health effects of intermittent fasting compared with daily calorie restriction?",
        [
            (
                "intermittent fasting randomized controlled trials weight loss 12 months",
                "Find long-term RCT evidence on weight outcomes",
            ),
            (
                "time-restricted eating effects on insulin sensitivity and HbA1c",
                "Understand metabolic markers beyond body weight",
            ),
            (
                "alternate day fasting vs continuous calorie restriction lean mass loss",
                "Compare muscle preservation between protocols",
            ),
            (
                "intermittent fasting cardiovascular risk LDL triglycerides meta-analysis",
                "Collect pooled cardiovascular outcomes",
            ),
            ("fasting eating disorders risk adolescents adults", "Identify psychological harms and who is at risk"),
            (
                "adherence and dropout rates in fasting diet trials",
                "Check whether benefits survive real-world adherence",
            ),
            ("intermittent fasting gut microbiome human studies", "Look for mechanistic evidence in humans"),
            ("history of intermittent fasting popularity 2010s", "Background on the trend"),
        ],
    ),
    (
        "How did the 2008 financial crisis change banking regulation in the European Union?",
        [
            ("Basel III capital requirements implementation EU CRD IV", "Trace how Basel III entered EU law"),
            ("European Banking Authority creation 2011 mandate", "Understand new supervisory institutions"),
            ("Single Supervisory Mechanism ECB banking union 2014", "Explain the move to centralised supervision"),
            ("Bank Recovery and Resolution Directive bail-in rules", "Describe the new resolution regime"),
            ("EU bonus cap bankers remuneration CRD IV", "Cover pay regulation changes"),
            ("Dodd-Frank Act Volcker rule", "Contrast with the US response"),
            ("sovereign debt crisis Greece 2010 bailout", "Context on the follow-on euro crisis"),
            ("criticism of EU post-crisis regulation lending to SMEs", "Find evaluations of unintended effects"),
        ],
    ),
    (
        "Why are honeybee colonies collapsing and what interventions work?",
        [
            (
                "Varroa destructor mite colony losses treatment efficacy",
                "Assess the main parasitic driver and treatments",
            ),
            ("neonicotinoid pesticides bee health field studies", "Weigh field evidence on pesticides"),
            ("EU neonicotinoid ban 2018 effect on bee populations", "See whether the policy intervention helped"),
            ("habitat loss floral diversity wild pollinators", "Understand nutrition and habitat factors"),
            ("deformed wing virus spread by varroa", "Explain viral mechanisms"),
            ("colony collapse disorder 2006 United States reports", "Background on the original CCD reports"),
            ("beekeeping management practices winter losses survey", "Find practices associated with lower losses"),
            ("honey production statistics by country", "Economic context"),
        ],
    ),
    (
        "是否应该在城市推广电动公交车？ Costs and benefits of electric buses in cities",
        [
            ("electric bus total cost of ownership vs diesel 12 years", "Compare lifetime costs"),
            ("Shenzhen electric bus fleet experience 16000 buses", "Learn from the largest deployment"),
            ("battery degradation electric buses cold climates", "Identify operational risks"),
            ("charging infrastructure depot vs opportunity charging", "Understand infrastructure choices"),
            ("air quality health benefits diesel bus replacement", "Quantify health co-benefits"),
            ("電動バス 導入 課題 日本", "Check experiences in Japan"),
            ("grid carbon intensity lifecycle emissions electric bus", "Check emissions depend on the grid"),
            ("bus rapid transit ridership effects", "Related but off the main question"),
        ],
    ),
]


def sample_decisions() -> list[tuple[dict, list[dict]]]:
    """Two decisions per topic: the root frame (depth 0) and a follow-up frame with retained branches."""
    out = []
    for root, cands in _TOPICS:
        first = [{"query": q, "goal": g} for q, g in cands]
        out.append(({"root_query": root, "frame_query": root, "parent_goal": "", "retained": [], "depth": 0}, first))
        parent_q, parent_g = cands[0]
        retained = [candidate_text(q, g) for q, g in cands[:3]]
        follow = [{"query": f"{q} (follow-up on {parent_q.split()[0]})", "goal": g} for q, g in cands[1:]]
        follow.append({"query": f"{parent_q} latest evidence 2023", "goal": f"Update: {parent_g}"})
        out.append(
            (
                {
                    "root_query": root,
                    "frame_query": parent_q,
                    "parent_goal": parent_g,
                    "retained": retained,
                    "depth": 1,
                },
                follow,
            )
        )
    return out


_KINDS = ("systematic review", "field study", "government report", "news analysis", "cohort study")
HITS_PER_READ = 10


def sample_read_decisions() -> list[tuple[dict, list[dict]]]:
    """Two read decisions per topic, each a search of one sub-query returning ``HITS_PER_READ`` new hits (titles of
    about 10 words, snippets of about 20, ranked, with ids), after 3 and 5 hits of other searches were read."""
    out = []
    for root, cands in _TOPICS:
        for pick, n_read in ((1, 3), (4, 5)):
            query, goal = cands[pick]
            hits = [_hit(query, goal, cands[(pick + r) % len(cands)][0], r) for r in range(HITS_PER_READ)]
            earlier = [cands[(pick + 1 + j) % len(cands)] for j in range(n_read)]
            read = [_hit(q, g, q, 0) for q, g in earlier]
            state = {"root_query": root, "query": query, "goal": goal, "depth": 1}
            out.append(({**state, "read": read, "read_ids": [h["id"] for h in read]}, hits))
    return out


def _hit(query: str, goal: str, other: str, rank: int) -> dict:
    """A search hit for ``query``: its title about ``other`` (the query itself for the top ranks)."""
    subject = query if rank < 3 else other
    kind = _KINDS[rank % len(_KINDS)]
    title = f"{' '.join(subject.split()[:7])}: a {kind} ({2015 + rank})"
    snippet = f"This {kind} examines {' '.join(subject.split()[:6])}; {goal.lower()}, and what remains uncertain."
    return {"title": title, "snippet": snippet, "id": "https://example.org/" + "-".join(title.split()), "rank": rank}
