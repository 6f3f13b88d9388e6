"""The stand-ins the open_deep_research hook (``inference/agents/open_deep_research.py``) installs for the package's
``configurable_model`` (``_ModelProxy``: its ``bind_tools`` results are gated by ``GatedToolCalls``) and
``researcher_subgraph`` (``_SubgraphProxy``: each ``ainvoke`` is one researcher run). Everything else they
are asked for passes through to what they stand in for. ``hook`` is the ``OpenDeepResearchHook`` that installed
them (not imported here: that module imports this one).
"""

from __future__ import annotations


class _ModelProxy:
    """Stands in for the package's ``configurable_model``: ``bind_tools`` results are gated."""

    def __init__(self, model, hook):
        self._model, self._branchgate_hook = model, hook

    def bind_tools(self, tools, **kwargs):
        return _gated_class()(self._model.bind_tools(tools, **kwargs), self._branchgate_hook)

    def __getattr__(self, name):
        return getattr(self._model, name)


class _SubgraphProxy:
    """Stands in for ``researcher_subgraph``: each ``ainvoke`` is one researcher run."""

    def __init__(self, graph, hook):
        self._graph, self._branchgate_hook = graph, hook

    async def ainvoke(self, input, config=None, **kwargs):
        hook = self._branchgate_hook
        topic = str((input or {}).get("research_topic") or "") if isinstance(input, dict) else ""
        branch = hook.start_branch(topic)
        token = hook._branch.set(branch)
        try:
            result = await self._graph.ainvoke(input, config, **kwargs)
        finally:
            hook._branch.reset(token)
        hook.end_branch(branch, result)
        return result

    def __getattr__(self, name):
        return getattr(self._graph, name)


_GATED = []


def _gated_class():
    """The Runnable that gates a bound model's answers (defined on first use: langchain-core is only
    needed once the package is)."""
    if _GATED:
        return _GATED[0]
    from langchain_core.runnables import Runnable
    from langchain_core.runnables.config import ensure_config

    class GatedToolCalls(Runnable):
        def __init__(self, bound, hook):
            self.bound, self.hook = bound, hook

        @property
        def InputType(self):
            return self.bound.InputType

        @property
        def OutputType(self):
            return self.bound.OutputType

        def invoke(self, input, config=None, **kwargs):
            out = self.bound.invoke(input, config, **kwargs)
            return self.hook.on_message(input, out, ensure_config(config))

        async def ainvoke(self, input, config=None, **kwargs):
            out = await self.bound.ainvoke(input, config, **kwargs)
            return self.hook.on_message(input, out, ensure_config(config))

    _GATED.append(GatedToolCalls)
    return GatedToolCalls
