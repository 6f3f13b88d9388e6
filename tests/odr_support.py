"""An offline open_deep_research run (no tests here): a scripted chat model and a fake web search.

Used by tests/test_open_deep_research.py and scripts/make_openinference_fixture.py. The package's graph
(``open_deep_research.deep_researcher.deep_researcher``) runs unchanged; two things are replaced:

- the chat model: ``langchain.chat_models.base._init_chat_model_helper`` (what the package's configurable
  model and its summariser call to build a provider model) returns a ``ScriptedChat``, so the package's own
  ``configurable_model`` still applies its queued ``bind_tools`` / ``with_structured_output`` / ``with_config``;
- the search: ``open_deep_research.utils.tavily_search_async`` (the package's only network call for search)
  becomes ``fake_search``, which answers from a fixed table.

``ScriptedChat`` supports tool binding and structured output (LangChain's default ``with_structured_output``
goes through ``bind_tools`` with ``tool_choice="any"``), and chooses its reply from the bound tools and the
conversation: the supervisor delegates 4 topics, then 2, then 1 together with ResearchComplete; each
researcher searches 3 queries, then 2, then stops; compression and the final report quote the URLs found.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool

QUESTION = "Why are honeybee colonies collapsing and what interventions work?"
BRIEF = "Why do honeybee colonies collapse, and which interventions reduce losses?"
SUPERVISOR_TOPICS = [
    ["Varroa mite treatments", "Neonicotinoids in field studies", "Honey prices by country", "Beekeeping trivia"],
    ["Bee nutrition and habitat loss", "Deformed wing virus"],
    ["Winter loss management"],
]
RESEARCH_QUERIES = [["{t} evidence", "{t} meta-analysis", "{t} celebrity gossip"], ["{t} field trial", "{t} recipes"]]
OFF_TOPIC = ("gossip", "recipes", "prices", "trivia")
URL = re.compile(r"https://[^\s)\]\"'<>]+")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def search_results(query: str, pages: bool = False) -> list[dict]:
    """The fake search engine: two deterministic hits per query (with ``pages``, each with its page's raw
    content, as Tavily gives it with ``include_raw_content=True``: the package then summarises each page)."""
    return [
        {
            "url": f"https://bees.example.org/{_slug(query)}/{k}",
            "title": f"{query} ({k})",
            "content": f"Passage {k} on {query}.",
            "raw_content": f"The full page {k} on {query}. " * 20 if pages else None,
            "score": 0.9 - 0.1 * k,
        }
        for k in (1, 2)
    ]


async def fake_search(
    search_queries, max_results: int = 5, topic: str = "general", include_raw_content: bool = True, config=None
):
    """Stands in for ``open_deep_research.utils.tavily_search_async`` (same signature and answer shape)."""
    await asyncio.sleep(0)
    return [{"query": q, "results": search_results(q)[:max_results]} for q in search_queries]


async def fake_page_search(
    search_queries, max_results: int = 5, topic: str = "general", include_raw_content: bool = True, config=None
):
    """``fake_search`` with each page's raw content (``search_results(..., pages=True)``)."""
    await asyncio.sleep(0)
    return [{"query": q, "results": search_results(q, pages=include_raw_content)[:max_results]} for q in search_queries]


def _call(name: str, args: dict, n: int) -> dict:
    return {"name": name, "args": args, "id": f"call_{name[:8].lower()}_{n}", "type": "tool_call"}


class ScriptedChat(BaseChatModel):
    """A chat model with scripted replies (see the module docstring); ``replies`` counts what it answered."""

    replies: dict = {}
    topics: list = SUPERVISOR_TOPICS  # per supervisor turn; the last turn also calls ResearchComplete
    queries: list = RESEARCH_QUERIES  # per researcher turn; then the researcher stops

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools, *, tool_choice=None, **kwargs):
        specs = [convert_to_openai_tool(t) for t in tools]
        return self.bind(tools=specs, tool_choice=tool_choice, **kwargs)

    def _generate(self, messages, stop=None, run_manager=None, tools=None, tool_choice=None, **kwargs) -> ChatResult:
        names = [t["function"]["name"] for t in tools or []]
        message = self._reply(messages, names, tool_choice)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _reply(self, messages, names: list[str], tool_choice) -> AIMessage:
        turn = sum(isinstance(m, AIMessage) for m in messages)
        n = sum(self.replies.values())
        if tool_choice == "any" and len(names) == 1:  # structured output
            self._count(names[0])
            return AIMessage(content="", tool_calls=[_call(names[0], self._structured(names[0], messages), n)])
        if "ConductResearch" in names:
            self._count("supervisor")
            topics = self.topics[turn] if turn < len(self.topics) else []
            calls = [_call("ConductResearch", {"research_topic": t}, n * 10 + i) for i, t in enumerate(topics)]
            if turn >= len(self.topics) - 1:
                calls.append(_call("ResearchComplete", {}, n * 10 + 9))
            return AIMessage(content="", tool_calls=calls)
        search = next((x for x in names if "search" in x.lower() and x != "ResearchComplete"), None)
        if search is not None:
            self._count("researcher")
            topic = next(m.content for m in messages if isinstance(m, HumanMessage))
            if turn >= len(self.queries):
                return AIMessage(content="Done.")
            queries = [q.format(t=topic) for q in self.queries[turn]]
            return AIMessage(content="", tool_calls=[_call(search, {"queries": queries}, n)])
        text = "\n".join(str(m.content) for m in messages)
        urls = list(dict.fromkeys(URL.findall(text)))
        if "clean up these findings" in str(messages[-1].content):
            self._count("compress")
            return AIMessage(content="Findings: " + " ".join(urls))
        self._count("report")
        cited = [u for u in urls if not any(w in u for w in OFF_TOPIC)]  # the writer uses relevant findings only
        return AIMessage(
            content="# Honeybee colony losses\n\nMites and pesticides drive losses. "
            + " ".join(f"[{i + 1}]({u})" for i, u in enumerate(cited))
            + "\n\n### Sources\n"
            + "\n".join(f"- {u}" for u in cited)
        )

    def _structured(self, name: str, messages) -> dict[str, Any]:
        if name == "ClarifyWithUser":
            return {"need_clarification": False, "question": "", "verification": "Starting the research now."}
        if name == "ResearchQuestion":
            return {"research_brief": BRIEF}
        if name == "Summary":
            return {"summary": "A short summary.", "key_excerpts": "An excerpt."}
        raise AssertionError(f"no scripted structured output for {name}")

    def _count(self, what: str) -> None:
        self.replies[what] = self.replies.get(what, 0) + 1


class KeywordGate:
    """A fixed-rule gate (p_keep 0.1 for off-topic words, else 0.9) through branchgate's keep rule; records the
    decisions it saw as ``(state, candidates, kept)``."""

    name = "keyword"

    def __init__(self, tau: float = 0.5):
        self.tau, self.seen = tau, []

    def select(self, state, candidates, tau=None, max_keep=None):
        import numpy as np

        from branchgate.decide import decide
        from branchgate.inference.gate import Selection

        p = np.array([0.1 if any(w in q.lower() for w in OFF_TOPIC) else 0.9 for q, _ in candidates], np.float32)
        tau = self.tau if tau is None else tau
        d = decide(p, tau, max_keep=max_keep)
        self.seen.append((state, list(candidates), list(d.kept)))
        return Selection(list(d.kept), p, p, d.fallback, tau)


class KeywordReadGate:
    """A fixed-rule read controller (``stage`` read; p_keep 0.1 for a hit whose title has an off-topic word, else
    0.9); records the hit lists it saw."""

    name, stage = "keyword-read", "read"

    def __init__(self, tau: float = 0.5):
        self.tau, self.seen = tau, []

    def select(self, state, hits, tau=None, max_keep=None, floor=None):
        import numpy as np

        from branchgate.decide import decide
        from branchgate.inference.gate import Selection

        p = np.array([0.1 if any(w in h["title"].lower() for w in OFF_TOPIC) else 0.9 for h in hits], np.float32)
        tau = self.tau if tau is None else tau
        d = decide(p, tau, max_keep=max_keep, fallback=False)
        self.seen.append((state, list(hits)))
        return Selection(list(d.kept), p, p, d.fallback, tau)


def install_offline(monkeypatch, **script) -> ScriptedChat:
    """Replace the chat-model factory and the search (``monkeypatch``: pytest's, or any object with
    ``setattr(target, name, value)``); returns the one scripted model every call gets (``script``: its
    ``topics`` / ``queries``)."""
    import langchain.chat_models.base as chat_base
    import open_deep_research.utils as odr_utils

    model = ScriptedChat(**script)
    model.replies = {}
    monkeypatch.setattr(chat_base, "_init_chat_model_helper", lambda *args, **kwargs: model)
    monkeypatch.setattr(odr_utils, "tavily_search_async", fake_search)
    return model


CONFIG = {
    "configurable": {
        "allow_clarification": False,
        "max_concurrent_research_units": 2,
        "max_researcher_iterations": 3,
        "max_react_tool_calls": 4,
        "search_api": "tavily",
    }
}


def run_graph(question: str = QUESTION, config: dict | None = None) -> dict:
    """Run the package's full graph once on ``question``; returns its final state."""
    from open_deep_research.deep_researcher import deep_researcher

    return asyncio.run(deep_researcher.ainvoke({"messages": [HumanMessage(content=question)]}, config or CONFIG))
