"""How decision texts are formed, shared by dataset building, training and the Gate (core-safe)."""

from __future__ import annotations

if __name__.partition(".")[0] not in ("branchgate", "__main__", "__mp_main__"):  # the root is the package
    raise ImportError(f"import branchgate.{__name__} (the repository root is the branchgate package), not {__name__}")


def candidate_text(query: str, goal: str = "") -> str:
    """The candidate tower's text: the subquery, then its research goal when there is one."""
    query, goal = (query or "").strip(), (goal or "").strip()
    return f"{query}\n{goal}" if goal else query


TITLE_WORDS = 40  # a document's title (its first line) is cut to this many words
SNIPPET_WORDS = 20  # a search hit's snippet, in whitespace words: about what a search engine shows (the default
# everywhere a snippet is made from a text: the Search-o1 reader, the simulator, the agent hooks)


def title_of(text: str) -> str:
    """A document's title as a search engine lists it: its first line, at most ``TITLE_WORDS`` words."""
    return " ".join(text.strip().partition("\n")[0].split()[:TITLE_WORDS])


def snippet(text: str, n_words: int) -> str:
    """A search hit's snippet: the opening ``n_words`` whitespace words of ``text``, joined by single spaces."""
    return " ".join(text.split()[:n_words])


def hit_of(text: str, title: str = "") -> tuple[str, str]:
    """A document as a search engine lists it: ``(title, snippet)``. The title is ``title`` when given, else the
    text's first line (``title_of``); the snippet is the opening ``SNIPPET_WORDS`` words of the text (after that
    first line when it gave the title)."""
    title = " ".join((title or "").split())
    if title:
        return title, snippet(text or "", SNIPPET_WORDS)
    text = (text or "").strip()
    return title_of(text), snippet(text.partition("\n")[2], SNIPPET_WORDS)


def hit_text(title: str, snippet: str = "") -> str:
    """A search hit's text as the read gate sees it (before the page is read): its title, then its snippet."""
    title, snippet = (title or "").strip(), (snippet or "").strip()
    return f"{title}\n{snippet}" if title and snippet else title or snippet
