"""A fast path for BERT WordPiece tokenizers on plain ASCII text (core-safe: standard library only).

The Gate tokenises every new text of a decision before encoding it. The ``tokenizers`` library spends
most of its time per text in its normaliser's alignment bookkeeping: about 50 µs for a 15-word query on
one thread, 0.4-0.6 ms per cold sample decision, 3-5% of an int8 decision. For text made only of printable
ASCII characters, tabs and line breaks, a BERT tokenizer (``BertNormalizer``, ``BertPreTokenizer``,
``WordPiece``, ``[CLS] text [SEP]``) reduces to: lowercase (when the normaliser does), split into runs of
non-space, non-punctuation characters and single punctuation characters, and greedy longest-match
WordPiece over the vocabulary. This module does exactly that in about 9 µs per text. Any other text
(non-ASCII, other control characters, text containing an added token such as ``[MASK]``) and tokenizers
of any other shape go to ``tokenizers`` as before; the Gate also checks the two agree when it loads.

``AsciiWordPiece.from_json(data, max_length)`` returns None for tokenizers it does not reproduce;
``ids(text)`` returns the token ids (with ``[CLS]``/``[SEP]``, truncated to ``max_length``) or None when
the text must go to ``tokenizers``.
"""

from __future__ import annotations

import json
import re
import string

# BERT splits off every ASCII punctuation character (and splits on whitespace; only the space is printable).
_PUNCT = re.escape(string.punctuation)
_WORDS = re.compile(f"[^ {_PUNCT}]+|[{_PUNCT}]")
_SPACES = str.maketrans("\t\n\r", "   ")
MEMO_SIZE = 65536  # words split by WordPiece, remembered (cleared when full)


class AsciiWordPiece:
    def __init__(
        self,
        vocab: dict[str, int],
        unk: str,
        prefix: str,
        max_word_chars: int,
        lowercase: bool,
        cls_id: int,
        sep_id: int,
        added: list[str],
        max_length: int,
    ):
        self.vocab = vocab
        self.unk_id = vocab[unk]
        self.prefix = prefix
        self.max_word_chars = int(max_word_chars)
        self.lowercase = bool(lowercase)
        self.cls_id, self.sep_id = int(cls_id), int(sep_id)
        self.added = [a for a in added if a]  # text containing any of these goes to tokenizers
        marks = [a.lower() for a in self.added] if self.lowercase else self.added
        self._added = re.compile("|".join(map(re.escape, marks))) if marks else None
        self.max_length = int(max_length)
        self._memo: dict[str, list[int]] = {}

    @classmethod
    def from_json(cls, data: dict, max_length: int) -> AsciiWordPiece | None:
        """The fast path for a parsed tokenizer.json, or None when it is not a BERT WordPiece tokenizer."""
        try:
            norm, pre, model, post = data["normalizer"], data["pre_tokenizer"], data["model"], data["post_processor"]
            if (norm or {}).get("type") != "BertNormalizer" or (pre or {}).get("type") != "BertPreTokenizer":
                return None
            if (model or {}).get("type") != "WordPiece" or model["unk_token"] not in model["vocab"]:
                return None
            ends = _cls_sep(post or {})
            if ends is None or int(max_length) < 2:
                return None
            added = [str(a["content"]) for a in data.get("added_tokens") or []]
            return cls(
                model["vocab"],
                model["unk_token"],
                str(model.get("continuing_subword_prefix", "##")),
                int(model.get("max_input_chars_per_word", 100)),
                bool(norm.get("lowercase", True)),
                ends[0],
                ends[1],
                added,
                int(max_length),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def ids(self, text: str) -> list[int] | None:
        """Token ids of ``text`` as the tokenizer gives them, or None when the text is not plain ASCII."""
        if not text.isascii():
            return None
        if not text.isprintable():
            text = text.translate(_SPACES)  # tab and line breaks are spaces to BERT; other controls are not handled
            if not text.isprintable():
                return None
        if self.lowercase:
            text = text.lower()
        if self._added is not None and self._added.search(text):
            return None
        words = _WORDS.findall(text)
        ids = list(map(self.vocab.get, words))
        if None in ids:  # words that are not in the vocabulary whole
            whole, ids = ids, []
            for word, i in zip(words, whole):
                if i is None:
                    ids.extend(self._pieces(word))
                else:
                    ids.append(i)
        return [self.cls_id, *ids[: self.max_length - 2], self.sep_id]

    def _pieces(self, word: str) -> list[int]:
        pieces = self._memo.get(word)
        if pieces is None:
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            pieces = self._memo[word] = self._split(word)
        return pieces

    def _split(self, word: str) -> list[int]:
        """Greedy longest-match-first WordPiece; a word with an unmatched piece (or too long) is [UNK]."""
        if len(word) > self.max_word_chars:
            return [self.unk_id]
        out, start, n = [], 0, len(word)
        while start < n:
            end = n
            while end > start:
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                i = self.vocab.get(piece)
                if i is not None:
                    out.append(i)
                    break
                end -= 1
            else:
                return [self.unk_id]
            start = end
        return out


def _cls_sep(post: dict) -> tuple[int, int] | None:
    """(cls id, sep id) of a post-processor that wraps a single text as [CLS] text [SEP], else None."""
    if post.get("type") == "BertProcessing":
        return int(post["cls"][1]), int(post["sep"][1])
    if post.get("type") != "TemplateProcessing":
        return None
    single = post.get("single") or []
    if len(single) != 3 or "Sequence" not in single[1]:
        return None
    first, last = single[0].get("SpecialToken"), single[2].get("SpecialToken")
    if not first or not last:
        return None
    special = post.get("special_tokens") or {}
    ids = [special.get(tok["id"], {}).get("ids") or [] for tok in (first, last)]
    if any(len(i) != 1 for i in ids):
        return None
    return int(ids[0][0]), int(ids[1][0])


# Plain ASCII texts that exercise lowercasing, punctuation, sub-words, unknown and over-long words.
WORDPIECE_PROBES = (
    "What's the U.S. GDP growth (2023-24)? e.g. $1,234.5bn; see [ref] #3 & @x ~ok",
    "unaffordable xqzjwv antidisestablishmentarianism " + "z" * 120,
    "",
    "a   b",
)


def checked_wordpiece(tok_text: str, tokenizer, max_length: int):
    """The ASCII fast path for this tokenizer, if it has one and agrees with ``tokenizer`` on the probes."""
    try:
        fast = AsciiWordPiece.from_json(json.loads(tok_text), max_length)
    except ValueError:
        return None
    if fast is None or any(fast.ids(t) != tokenizer.encode(t).ids for t in WORDPIECE_PROBES):
        return None
    return fast
