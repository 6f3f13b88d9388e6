"""Candidate generation: the offline deterministic generator (default) and an OpenAI-compatible chat one.

A generator proposes the candidate subqueries (with research goals) of a decision point — the plan
(from the root query and the planning retrieval) and follow-ups (from one expanded branch's retained
evidence) — and the extractive learnings of a branch. It never sees key-point labels.

The offline generator imitates what an LLM planner produces, including its waste. Per candidate it
draws an *origin*:
- ``aspect``: a salient key phrase (IDF-weighted, from the better half of the retrieved passages) joined
  to the topic or, for follow-ups, to the parent's focus (drill-down) — usually productive;
- ``redundant``: a rephrasing of the frame query, the root question or a sibling — retrieves what is
  already known;
- ``tangent``: a phrase from the weaker retrieved passages (or, failing that, from a random passage of
  the corpus) asked about without the topic — off-target;
- ``offtopic``: a sub-query written for *another* question of the same environment (its first human-written
  sub-question when it has them, else its topic in a query template) — a planner that drifts off the question;
  it retrieves the other question's pages, so it is labelled as the plainly irrelevant candidate it is. Without
  another question in the environment, a tangent instead;
- ``gold``: when the environment's query carries human-written sub-questions (MuSiQue's
  ``question_decomposition``, in the query's ``meta.decomposition``), the first one is a candidate of the plan and
  the next one (its ``#k`` references filled with the answers found) a follow-up of a gold branch. Without them, a
  real agent's own sub-queries for the question serve the same way (DeepResearchGym: the Search-o1 trace's
  searches, ``meta.agent_queries``, ``agent_steps``).
Candidates read like an agent's queries (the topic is the question without its question words, ``topic_of``;
the templates are phrases an agent writes: "impact of X on T", "X definition"), not strings of keywords.
The mix depends on depth (more redundancy and drift deeper in the tree), the order is shuffled, and every
choice comes from the ``random.Random`` handed in (seeded by the caller from seed, run and frame).
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from dataclasses import dataclass

from branchgate.errors import BranchgateError
from branchgate.llm import chat, json_in
from branchgate.pipeline.textutil import STOPWORDS, content_words, fold, sentences, words


@dataclass
class Cand:
    query: str
    goal: str
    origin: str = "llm"  # generator's intent (aspect / redundant / tangent / llm): for analysis, not a label
    focus: str = ""  # the phrase the candidate is about (drill-down context for its follow-ups)


# origin mix by frame depth: (aspect, redundant, tangent, offtopic); a tenth of the candidates drift off the question
ORIGINS = ("aspect", "redundant", "tangent", "offtopic")
MIX = {0: (0.50, 0.25, 0.15, 0.10), 1: (0.40, 0.30, 0.20, 0.10)}
MIX_DEEP = (0.35, 0.30, 0.25, 0.10)

ASPECT_Q = [
    "{phrase} and {topic}",
    "how does {phrase} affect {topic}",
    "what role does {phrase} play in {topic}",
    "evidence on {phrase} and {topic}",
    "impact of {phrase} on {topic}",
    "why {phrase} matters for {topic}",
    "{phrase} in {topic}",
]
DRILL_Q = [
    "{phrase} and {focus}",
    "how is {phrase} related to {focus}",
    "{focus}: the role of {phrase}",
    "examples of {phrase} in {focus}",
]
ASPECT_G = [
    "Find concrete facts, figures and examples on {phrase} and how it bears on {topic}.",
    "Establish whether and how {phrase} contributes to {topic}; note sources and disagreements.",
    "Collect evidence about {phrase} to explain {topic}.",
]
DRILL_G = [
    "Go deeper into {phrase} as it relates to {focus}; look for specifics not yet covered.",
    "Follow up on {focus}: what does {phrase} add, with supporting details?",
]
REDUNDANT_Q = [
    "overview of {frame}",
    "what is known about {topic}",
    "{topic} explained",
    "{frame}",
    "latest research on {topic}",
    "facts about {topic}",
]
REDUNDANT_G = [
    "Get a general overview of {topic}.",
    "Summarise the main points about {topic}.",
]
FALLBACK_Q = ("more details on", "examples of", "evidence on", "analysis of", "debate on", "sources on")
TANGENT_Q = [
    "history of {phrase}",
    "{phrase} definition",
    "what is {phrase}",
    "{phrase} statistics",
    "{phrase} pros and cons",
]
TANGENT_G = [
    "Background on {phrase}.",
    "Understand {phrase} in general terms.",
]
OFFTOPIC_Q = [
    "{topic}",
    "facts about {topic}",
    "overview of {topic}",
    "{topic} explained",
]
OFFTOPIC_G = [
    "Find out about {topic}.",
    "Collect the main facts on {topic}.",
]

_PHRASE_SPLIT = re.compile(r"[,;:()\[\]\"!?|/]+|\s[-\u2013\u2014]\s")
_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9'\-]*|\d[\d,.%]*")


QUESTION_WORDS = frozenset(
    "what which who whom whose when where why how is are was were do does did can could should would will has have "
    "had many much".split()
)
_TRAILING = frozenset("a an the of in on at to for with by from and or as that which who".split())
_CLAUSE = re.compile(r"\s(?:that|which|who|whom|whose|where|when|while|because|if)\s", re.I)


def topic_of(root: str, max_words: int = 8) -> str:
    """What a question is about, as an agent would write it in a query: the question without its leading question
    words ("Why are honeybee colonies collapsing?" → "honeybee colonies collapsing"), cut at a clause boundary
    (else after ``max_words`` words) when longer than ``max_words``."""
    ws = " ".join(root.replace("?", " ").split()).split(" ")
    while len(ws) > 1 and ws[0].lower().strip(",") in QUESTION_WORDS:
        ws = ws[1:]
    text = " ".join(ws).strip(" ,.;:")
    if len(text.split()) > max_words:
        m = _CLAUSE.search(text)
        if m and 2 <= len(text[: m.start()].split()) <= max_words:
            text = text[: m.start()]
        else:
            text = " ".join(text.split()[:max_words])
        ws = text.split()
        while len(ws) > 1 and ws[-1].lower() in _TRAILING:
            ws = ws[:-1]
        text = " ".join(ws)
    return text or root.strip().rstrip("?")


def gold_steps(meta: dict | None, key_points: list[dict] | None = None) -> list[tuple[str, str]]:
    """A query's human-written sub-questions and their answers, ``[(question, answer)]``, from ``meta.decomposition``
    (MuSiQue's ``question_decomposition``: questions, or ``"X >> relation"`` triples, which read as "relation of
    X"); the answer of a step is what its key point's text adds after the question. Statements (a decomposition
    of supporting sentences, as the HotpotQA sample has) are not sub-questions: none."""
    steps = (meta or {}).get("decomposition") or []
    if not steps or not all(isinstance(q, str) and (q.strip().endswith("?") or ">>" in q or "#" in q) for q in steps):
        return []
    texts = [str(k.get("text", "")) for k in key_points or []]
    out = []
    for i, q in enumerate(steps):
        q = " ".join(q.split())
        kp = texts[i] if i < len(texts) else ""
        answer = kp[len(q) :].strip() if kp.startswith(q) else ""
        if ">>" in q:
            subject, _, relation = (x.strip() for x in q.partition(">>"))
            ends_in_preposition = relation.split()[-1:] and relation.split()[-1].lower() in _TRAILING
            q = f"{relation} {subject}" if ends_in_preposition else f"{relation} of {subject}"
        out.append((q, answer))
    return out


def agent_steps(meta: dict | None) -> list[tuple[str, str]]:
    """A real agent's sub-queries for the question (``meta.agent_queries``, in the order it searched) as steps
    with no known answers, ``[(query, "")]``."""
    asked = (meta or {}).get("agent_queries") or []
    return [(" ".join(q.split()), "") for q in asked if isinstance(q, str) and q.strip()]


def fill_gold(question: str, answers: list[str]) -> str | None:
    """``question`` with its ``#k`` references replaced by the answers of steps k (None when one is unknown)."""

    def sub(m):
        k = int(m.group(1)) - 1
        return answers[k] if 0 <= k < len(answers) and answers[k] else "\x00"

    out = re.sub(r"#(\d+)", sub, question)
    return None if "\x00" in out else " ".join(out.replace(" ?", "?").split())


def keyphrases(texts: list[str], idf, exclude: set[str], max_len: int = 3, df=None) -> list[tuple[str, float]]:
    """Salient phrases of ``texts``: runs of non-stopwords (≤ ``max_len`` words) scored by how many of the
    texts share them and how specific their words are:
    ``(spread + 0.25·extra mentions) · mean clipped idf · (1 + 0.3·(len − 1)) · (0.3 + 0.7·on-topic share)``,
    where words seen in fewer than 3 corpus passages (names, typos) count a third and the on-topic share is
    the fraction of mentions in sentences that also use an ``exclude`` (topic) word. Phrases made only of ``exclude``
    words are dropped. Sorted by score, then alphabetically (deterministic)."""
    tf: dict[str, int] = defaultdict(int)
    topical: dict[str, int] = defaultdict(int)
    spread: dict[str, set[int]] = defaultdict(set)
    for ti, text in enumerate(texts):
        for sent in sentences(text):
            on_topic = bool(exclude & set(words(sent)))
            for piece in _PHRASE_SPLIT.split(fold(sent)):
                run: list[str] = []
                for tok in _TOKEN.findall(piece) + [""]:
                    w = tok.lower().strip("'-.,")
                    if w and w not in STOPWORDS and len(w) > 2 and w.isascii() and w.replace("-", "").isalpha():
                        run.append(w)
                        continue
                    for n in range(1, max_len + 1):
                        for i in range(0, len(run) - n + 1):
                            key = " ".join(run[i : i + n])
                            tf[key] += 1
                            topical[key] += on_topic
                            spread[key].add(ti)
                    run = []
    cap = idf("\x00") * 0.6  # clip: the rarest words are rarely the most useful
    scored = []
    for phrase, count in tf.items():
        ws = phrase.split()
        if all(w in exclude for w in ws) or len(set(ws)) < len(ws):
            continue
        spec = 0.0
        for w in ws:
            v = min(idf(w), cap)
            if df is not None and df(w) < 3:
                v /= 3
            spec += v
        rdf = len(spread[phrase])
        score = (rdf + 0.25 * (count - rdf)) * (spec / len(ws)) * (1 + 0.3 * (len(ws) - 1))
        score *= 0.3 + 0.7 * topical[phrase] / count
        scored.append((phrase, score))
    scored.sort(key=lambda x: (-x[1], x[0]))
    return scored


def learnings(query: str, texts: list[str], idf, max_sentences: int = 3, max_words: int = 60) -> list[str]:
    """Extractive learnings: the sentences of ``texts`` that best match the query's terms (IDF-weighted)."""
    return [s for s, _ in cited_learnings(query, texts, idf, max_sentences, max_words)]


def env_learnings(env, query: str, texts: list[str]) -> list[str]:
    """``learnings`` over an env's statistics, remembered per env (both generators extract them this way)."""
    return list(env.memo.get_or(("learnings", query, tuple(texts)), lambda: tuple(learnings(query, texts, env.idf))))


def cited_learnings(
    query: str, texts: list[str], idf, max_sentences: int = 3, max_words: int = 60
) -> list[tuple[str, list[int]]]:
    """``learnings`` with, for each sentence, the indices of the texts it was taken from (every text that
    holds the same sentence: a sentence is said once, and cites all of them)."""
    terms = set(content_words(query))
    scored = []
    sources: dict[str, list[int]] = {}
    for ti, text in enumerate(texts):
        for si, sent in enumerate(sentences(text)):
            key = sent.strip().lower()
            if len(sent.split()) < 5:
                continue
            if key in sources:
                if ti not in sources[key]:
                    sources[key].append(ti)
                continue
            sources[key] = [ti]
            ws = set(content_words(sent))
            score = sum(idf(w) for w in sorted(ws & terms)) + 0.01 * len(ws)  # sorted: the same float in every process
            scored.append((-score, ti, si, " ".join(sent.split()[:max_words]), key))
    scored.sort()
    return [(s, sources[key]) for *_, s, key in scored[:max_sentences]]


class OfflineGenerator:
    """Deterministic, LLM-free candidate generator (see the module docstring)."""

    name = "offline"

    def __init__(self, env):
        self.env = env
        queries = getattr(env, "queries", [])
        self._gold = {q.query.strip(): gold_steps(q.meta, q.key_points) or agent_steps(q.meta) for q in queries}
        self._questions = sorted(self._gold)  # the environment's questions: where an off-topic candidate comes from

    def _df(self, word: str) -> int:
        return self.env.df.get(word, 0)

    def _keyphrases(self, texts: list[str], exclude: set[str]) -> list[tuple[str, float]]:
        """``keyphrases`` over the env's statistics, remembered per env (pure: same texts, same phrases)."""
        return list(
            self.env.memo.get_or(
                ("keyphrases", tuple(texts), frozenset(exclude)),
                lambda: tuple(keyphrases(texts, self.env.idf, exclude, df=self._df)),
            )
        )

    def plan(self, root: str, texts: list[str], k: int, rng: random.Random) -> list[Cand]:
        return self._with_gold(self._frame(root, root, "", texts, k, rng, depth=0), root, 0, rng)

    def followups(
        self,
        root: str,
        parent: Cand,
        texts: list[str],
        k: int,
        rng: random.Random,
        depth: int,
        learned: list[str] | None = None,
    ) -> list[Cand]:
        out = self._frame(root, parent.query, parent.focus, texts, k, rng, depth)
        return self._with_gold(out, root, depth, rng) if parent.origin == "gold" else out

    def learnings(self, query: str, texts: list[str]) -> list[str]:
        return env_learnings(self.env, query, texts)

    def _with_gold(self, cands: list[Cand], root: str, depth: int, rng: random.Random) -> list[Cand]:
        """``cands`` with the query's sub-question of step ``depth`` (its references filled) in place of one
        candidate (an aspect one when there is one), when the query has human-written sub-questions."""
        steps = self._gold.get(root.strip()) or []
        if depth >= len(steps) or not cands:
            return cands
        q = fill_gold(steps[depth][0], [a for _, a in steps])
        if q is None or any(c.query.lower() == q.lower() for c in cands):
            return cands
        aspects = [j for j, c in enumerate(cands) if c.origin == "aspect"]
        j = aspects[rng.randrange(len(aspects))] if aspects else rng.randrange(len(cands))
        cands[j] = Cand(q, f"Answer: {q}", "gold", topic_of(q, 4))
        return cands

    def _frame(
        self, root: str, frame_query: str, focus: str, texts: list[str], k: int, rng: random.Random, depth: int
    ) -> list[Cand]:
        topic = topic_of(root)
        exclude = set(content_words(root)) | set(content_words(frame_query)) | set(focus.split())
        half = max(1, (len(texts) + 1) // 2)
        strong = self._keyphrases(texts[:half], exclude)
        weak = self._keyphrases(texts[half:], exclude) if len(texts) > 1 else []
        strong_words = {w for p, _ in strong[:12] for w in p.split()}
        weak = [(p, s) for p, s in weak if not set(p.split()) & strong_words]
        mix = MIX.get(depth, MIX_DEEP)
        origins = rng.choices(ORIGINS, weights=mix, k=k)
        if "aspect" not in origins and strong:
            origins[0] = "aspect"
        out: list[Cand] = []
        used: set[str] = set()
        queries: set[str] = set()
        for origin in origins:
            cand = None
            for _ in range(4):  # retry on duplicates
                cand = self._one(origin, root, frame_query, focus, topic, strong, weak, used, out, rng, depth)
                if cand and cand.query not in queries:
                    break
                cand = None
            if cand is None:  # nothing left to say: fall back to a rephrasing
                fresh = [f"{w} {topic}" for w in FALLBACK_Q if f"{w} {topic}" not in queries]
                cand = Cand(
                    rng.choice(fresh) if fresh else f"{topic} ({len(out) + 1})",
                    rng.choice(REDUNDANT_G).format(topic=topic),
                    "redundant",
                    focus,
                )
            queries.add(cand.query)
            out.append(cand)
        rng.shuffle(out)
        return out

    def _one(self, origin, root, frame_query, focus, topic, strong, weak, used, siblings, rng, depth) -> Cand | None:
        if origin == "aspect":
            phrase = _pick(strong, used, rng, top=3)
            if phrase is None:
                return None
            if focus and depth > 0 and rng.random() < 0.7:
                q = rng.choice(DRILL_Q).format(focus=focus, phrase=phrase)
                g = rng.choice(DRILL_G).format(focus=focus, phrase=phrase)
            else:
                q = rng.choice(ASPECT_Q).format(topic=topic, phrase=phrase)
                g = rng.choice(ASPECT_G).format(topic=root.strip().rstrip("?"), phrase=phrase)
            return Cand(q, g, "aspect", phrase)
        if origin == "redundant":
            aspects = [c for c in siblings if c.origin == "aspect"]
            if aspects and rng.random() < 0.5:  # restate a sibling with another template
                sib = rng.choice(aspects)
                q = rng.choice(ASPECT_Q).format(topic=topic, phrase=sib.focus)
                return Cand(q, rng.choice(ASPECT_G).format(topic=topic, phrase=sib.focus), "redundant", sib.focus)
            frame = frame_query.strip().rstrip("?")
            q = rng.choice(REDUNDANT_Q).format(frame=frame, topic=topic)
            return Cand(q, rng.choice(REDUNDANT_G).format(topic=topic), "redundant", focus)
        if origin == "offtopic":
            cand = self._offtopic(root, rng)
            if cand is not None:
                return cand
        phrase = _pick(weak, used, rng, top=8)
        if phrase is None:  # drift to a random passage of the corpus
            text = self.env.texts[rng.randrange(len(self.env.texts))]
            phrase = _pick(keyphrases([text], self.env.idf, set()), used, rng, top=5)
            if phrase is None:
                return None
        q = rng.choice(TANGENT_Q).format(phrase=phrase)
        return Cand(q, rng.choice(TANGENT_G).format(phrase=phrase), "tangent", phrase)

    def _offtopic(self, root: str, rng: random.Random) -> Cand | None:
        """A sub-query written for another question of the environment (None when it has no other): that question's
        first sub-question when it has human-written ones (its references filled), else its topic in a template."""
        others = [q for q in self._questions if q != root.strip()]
        if not others:
            return None
        other = others[rng.randrange(len(others))]
        steps = self._gold.get(other) or []
        q = fill_gold(steps[0][0], [a for _, a in steps]) if steps else None
        topic = topic_of(other)
        if q is None:
            q = rng.choice(OFFTOPIC_Q).format(topic=topic)
        return Cand(q, rng.choice(OFFTOPIC_G).format(topic=topic), "offtopic", topic_of(q, 4))


def _pick(scored: list[tuple[str, float]], used: set[str], rng: random.Random, top: int) -> str | None:
    """One of the ``top`` best phrases not yet used (nor sharing a word with a used one), phrases of two or more
    words first (a single word rarely makes a query an agent would write)."""
    used_words = {w for p in used for w in p.split()}
    free = [p for p, _ in scored if p not in used and not set(p.split()) & used_words]
    pool = ([p for p in free if " " in p] + [p for p in free if " " not in p])[:top]
    if not pool:
        return None
    phrase = pool[rng.randrange(len(pool))]
    used.add(phrase)
    return phrase


# ----------------------------------------------------------------------------------------------------------
# OpenAI-compatible chat generator (the client is branchgate/llm.py)
# ----------------------------------------------------------------------------------------------------------

PLAN_PROMPT = """You are planning web research for the question below. Write {k} distinct search queries, each with
a research goal (what it should find out). Answer with a JSON list only:
[{{"query": "...", "research_goal": "..."}}, ...]

Question: {root}
{context}"""


class ChatGenerator:
    """Candidates from an OpenAI-compatible ``/chat/completions`` endpoint; learnings stay extractive.

    Token usage is taken from the response's ``usage`` when present and recorded by the caller.
    """

    name = "chat"

    def __init__(
        self,
        env,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        temperature: float = 0.0,
    ):
        self.env, self.base_url, self.model = env, base_url.rstrip("/"), model
        self.api_key, self.timeout, self.temperature = api_key, timeout, temperature
        self.last_usage: dict = {}

    def plan(self, root: str, texts: list[str], k: int, rng: random.Random) -> list[Cand]:
        context = "Search results:\n" + "\n".join(f"- {t[:400]}" for t in texts[:5]) if texts else ""
        return self._ask(PLAN_PROMPT.format(k=k, root=root, context=context), k)

    def followups(
        self,
        root: str,
        parent: Cand,
        texts: list[str],
        k: int,
        rng: random.Random,
        depth: int,
        learned: list[str] | None = None,
    ) -> list[Cand]:
        context = (
            f"We searched: {parent.query} (goal: {parent.goal})\nLearnings:\n"
            + "\n".join(f"- {s}" for s in (learned or []))
            + "\nWrite follow-up queries that go deeper."
        )
        return self._ask(PLAN_PROMPT.format(k=k, root=root, context=context), k)

    def learnings(self, query: str, texts: list[str]) -> list[str]:
        return env_learnings(self.env, query, texts)

    def _ask(self, prompt: str, k: int) -> list[Cand]:
        reply = chat(
            self.base_url,
            self.model,
            [{"role": "user", "content": prompt}],
            api_key=self.api_key,
            timeout=self.timeout,
            who="chat generator",
            temperature=self.temperature,
        )
        self.last_usage = reply.usage
        return parse_candidates(reply.content)[:k]


def parse_candidates(content: str) -> list[Cand]:
    """Candidates from an LLM answer: a JSON list of {query, research_goal|goal} (or of strings),
    possibly wrapped in prose or a code fence."""
    try:
        items = json_in(content, list)
    except ValueError as exc:
        raise BranchgateError(f"chat generator: {exc}: {content[:200]!r}") from None
    out, seen = [], set()
    for it in items:
        if isinstance(it, str):
            q, g = it, ""
        elif isinstance(it, dict):
            q, g = str(it.get("query", "")), str(it.get("research_goal", it.get("goal", "")))
        else:
            continue
        q = " ".join(q.split())
        if q and q.lower() not in seen:
            seen.add(q.lower())
            out.append(Cand(q, " ".join(g.split()), "llm", " ".join(words(q)[:4])))
    if not out:
        raise BranchgateError("chat generator: the answer's list holds no query")
    return out


def make(spec: str, env, **kw):
    """``offline`` or ``chat`` (kw: base_url, model, api_key)."""
    if spec == "offline":
        return OfflineGenerator(env)
    if spec == "chat":
        if not kw.get("base_url") or not kw.get("model"):
            raise BranchgateError("--generator chat needs --llm-url and --llm-model")
        return ChatGenerator(env, kw["base_url"], kw["model"], kw.get("api_key"))
    raise BranchgateError(f"unknown generator {spec!r}: offline | chat")
