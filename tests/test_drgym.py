"""DeepResearchGym in one module: trace parsing, normalisation, key points, span matching, and the two users
(the Search-o1 reader of ``dataset build`` and the drgym environment builder) labelling documents alike."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from branchgate.errors import InputError
from branchgate.logs_to_dataset import drgym, spans
from branchgate.logs_to_dataset.readers import read_runs
from branchgate.logs_to_dataset.traces import ReadReport
from branchgate.pipeline import env_build

# --- parsing ---------------------------------------------------------------------------------------------

TRACE = (
    "Let me think.\n<|begin_search_query|>first query<|end_search_query|>\n<|begin_search_result|>"
    "Doc 1 (URL: https://a.example/wiki/Foo_(bar), ClueWebID: cw-A)\nAlpha text.\nSecond line of A.\n"
    "Doc 2 (URL: https://b.example/page)\nBeta text quoting <|begin_search_query|> inside a page.\n"
    "<|end_search_result|>\nSo far so good.\n<|begin_search_query|>second query<|end_search_query|>\n"
    "<|begin_search_result|>Doc 1 (URL: https://c.example, ClueWebID: none)\nGamma text, cut off"
)


def test_parse_trace_and_documents():
    warnings = Counter()
    prefix, searches, orphans, truncated = drgym.parse_trace(TRACE, lambda m, n=1: warnings.update({m: n}))
    assert prefix.strip() == "Let me think." and [s.query for s in searches] == ["first query", "second query"]
    assert truncated and orphans == [] and searches[0].after.strip() == "So far so good."
    docs = drgym.parse_documents(searches[0].result, lambda m, n=1: warnings.update({m: n}))
    # a URL may hold parentheses; a document without a ClueWebID is known by its URL; a tag inside a document is text
    assert [(d.id, d.url) for d in docs] == [
        ("cw-A", "https://a.example/wiki/Foo_(bar)"),
        ("https://b.example/page", "https://b.example/page"),
    ]
    assert docs[0].text == "Alpha text.\nSecond line of A." and "<|begin_search_query|>" in docs[1].text
    assert [d.id for d in drgym.trace_documents(TRACE)] == ["cw-A", "https://b.example/page", "https://c.example"]
    assert warnings["searcho1: unterminated search result at the end of the trace (read up to the cut)"] == 1
    assert warnings["searcho1: document without a ClueWebID (URL used as its id)"] == 1


def test_orphan_result_blocks_still_give_documents():
    text = "<|begin_search_result|>Doc 1 (URL: u, ClueWebID: cw-O)\nOrphan.\n<|end_search_result|>"
    assert [(d.id, d.text) for d in drgym.trace_documents(text)] == [("cw-O", "Orphan.")]
    assert drgym.parse_trace(text)[2] == ["Doc 1 (URL: u, ClueWebID: cw-O)\nOrphan.\n"]


# --- normalisation -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, norm",
    [
        ("He said \u201cit\u2019s   fine\u201d \u2014 really.", "he said it s fine really"),
        ("  --Stra\u00dfe\u00a0\ufb01ne!  ", "strasse fine"),  # casefold (ß → ss), NFKC (ﬁ → fi), no-break space
        ("x_y \u00bd", "x y 1 2"),  # underscore is not alphanumeric; ½ → 1⁄2
        ("", ""),
        ("...", ""),
    ],
)
def test_normalize(text, norm):
    assert spans.normalize(text) == norm
    got, index = spans.normalize_with_map(text)
    assert got == norm and len(index) == len(norm)


def test_normalize_map_points_at_the_original_characters():
    text = "Intro. The \u201cQuick\u201d  brown-fox \u2014 jumps\u00e9! End"
    norm, index = spans.normalize_with_map(text)
    s = norm.index("quick brown fox")
    e = s + len("quick brown fox")
    assert text[index[s] : index[e - 1] + 1] == "Quick\u201d  brown-fox"
    assert text[index[norm.index("jumps\u00e9")]] == "j"
    assert [text[index[i]].casefold() for i, c in enumerate(norm) if c != " "] == [
        c for c in text.casefold() if c.isalnum()
    ]


def test_find_span_rules():
    norm = spans.normalize(
        "He said \u201cit\u2019s fine\u201d \u2014 really. Then the next line goes on for a while "
        "and then some more words come before the very end of it all."
    )
    assert spans.find_span(norm, 'he said "it\'s fine" - really') is not None  # punctuation and case ignored
    s, e = spans.find_span(norm, "He said it's fine ... the next line goes on")  # ellipsis pieces, in any gap
    assert norm[s:e].startswith("he said") and norm[s:e].endswith("goes on")
    long_span = (
        "Then the next line goes on for a while and [a few words are left out] come before the very end of it all"
    )
    s, e = spans.find_span(norm, long_span)  # head and tail anchors (≥ 12 words)
    assert norm[s:e].startswith("then the next") and norm[s:e].endswith("end of it all")
    assert spans.find_span(norm, "something else entirely here") is None
    assert spans.find_span(norm, "... ") is None


# --- key points --------------------------------------------------------------------------------------------

PER_DOC = {
    "key_points": {
        "CW-1": [
            {"point_number": 1, "point_content": "a", "spans": ["Span one of the first document here.", " "]},
            {"point_number": 2, "point_content": "b", "spans": []},
        ],
        "null": [{"point_number": 1, "point_content": "c", "spans": ["A quote of no document at all."]}],
        "cw-2": [{"point_number": 1, "point_content": "d", "spans": ["Short one"]}],
    }
}
AGG = {
    "key_points": [
        {"point_number": 1, "point_content": "Point one.", "original_point_number": [1, 3]},
        {"point_number": 2, "point_content": "Point two.", "original_point_number": [2, 9, True]},
        {"point_number": 3, "original_point_number": [4]},
        {"point_number": 4, "point_content": "Point four.", "original_point_number": [4]},
        {"point_number": 1, "point_content": "Point one again.", "original_point_number": [4]},
    ]
}


def test_parse_key_points_ids_numbering_and_problems():
    kps = drgym.parse_key_points("q7", PER_DOC, AGG, "q7.json", "q7_aggregated.json")
    assert kps.ids == ["q7#1", "q7#2", "q7#4"]
    by_id = {k.id: k for k in kps.points}
    # per-document points numbered across documents in file order; the null document is null:<qid>; a
    # repeated point number merges; blank spans and points without spans give nothing
    assert by_id["q7#1"].sources == [
        ("cw-1", "Span one of the first document here."),
        ("null:q7", "A quote of no document at all."),
        ("cw-2", "Short one"),
    ]
    assert by_id["q7#2"].sources == [] and by_id["q7#4"].sources == [("cw-2", "Short one")]
    assert kps.bad_links == 2 and kps.bad_entries == 1  # 9 is out of 1..4, True is no number; #3 has no content
    assert ("q7_aggregated.json", "key_points[2]: needs 'point_content'") in kps.problems
    assert kps.names["cw-1"] == "CW-1"
    with pytest.raises(InputError, match="must be an object"):
        drgym.parse_key_points("q7", {"key_points": []}, AGG)
    with pytest.raises(InputError, match="must be a list"):
        drgym.parse_key_points("q7", PER_DOC, {"key_points": {}})


def test_load_key_points_reports_missing_and_broken_files(tmp_path):
    (tmp_path / "q1.json").write_text(json.dumps(PER_DOC))
    with pytest.raises(InputError, match="key-point file missing") as exc:
        drgym.load_key_points(tmp_path, "q1")
    assert exc.value.file.endswith("q1_aggregated.json")
    (tmp_path / "q1_aggregated.json").write_text("{ broken")
    with pytest.raises(InputError, match="invalid JSON"):
        drgym.load_key_points(tmp_path, "q1")
    (tmp_path / "q1_aggregated.json").write_text(json.dumps(AGG))
    assert drgym.load_key_points(tmp_path, "q1").ids == ["q1#1", "q1#2", "q1#4"]


def test_kp_order_is_numeric():
    assert sorted(["q#10", "q#2", "a#3", "q#x"], key=drgym.kp_order) == ["a#3", "q#2", "q#10", "q#x"]


# --- span matching -----------------------------------------------------------------------------------------


def _kps(qid: str, points: dict[int, list[tuple[str, str]]]) -> drgym.QueryKeyPoints:
    return drgym.QueryKeyPoints(qid, [drgym.KeyPoint(f"{qid}#{n}", "", src) for n, src in points.items()])


def test_span_index_labels_own_documents_and_long_quotes_of_others():
    index = spans.SpanIndex(
        [
            _kps(
                "q1",
                {
                    1: [("doc-a", "Bees regurgitate nectar into the honeycomb cells.")],
                    2: [("doc-a", "wax")],
                    3: [("doc-b", "bees dance")],
                },
            ),
            _kps("q2", {1: [("doc-c", "The queen lays up to two thousand eggs a day.")]}),
        ]
    )
    page = "Worker BEES regurgitate nectar \u2014 into the honeycomb\ncells! And bees dance. The queen lays up to two"
    # its own key points by id (case-insensitive), even those whose span is not in the text
    assert index.labels("DOC-A", "no text at all") == {"q1#1", "q1#2"}
    # another document's span of ≥ MIN_SPAN_WORDS words labels any page quoting it; a shorter one does not
    assert index.labels("doc-x", page) == {"q1#1"}
    assert index.labels(None, page + " thousand eggs a day") == {"q1#1", "q2#1"}
    assert index.labels("doc-b", page) == {"q1#1", "q1#3"}
    assert index.labels("doc-a", page, own=False) == {"q1#1"}  # only what is located
    found, missing = index.locate("doc-a", page)
    assert missing == [("wax", {"q1#2"})]
    assert [(page[s:e], labs) for s, e, labs in found] == [
        ("BEES regurgitate nectar \u2014 into the honeycomb\ncells", {"q1#1"})
    ]


def test_span_index_finds_quotes_that_start_inside_a_word():
    # substring semantics: the anchor index must not lose a match whose first word is cut
    index = spans.SpanIndex(
        [
            _kps(
                "q",
                {
                    1: [("d1", "cat sat on the warm mat today")],
                    2: [("d1", "the warm mat today and then the dog came ... barking loudly at it")],
                },
            )
        ]
    )
    assert index.labels("d2", "A bobcat sat on the warm mat today and then the dog came in, barking loudly at it.") == {
        "q#1",
        "q#2",
    }
    assert index.labels("d2", "A cat sat on the warm rug today.") == set()


def test_span_index_agrees_with_trying_every_span():
    quotes = [
        "one two three four five",
        "two three four five six seven",
        "alpha beta gamma delta epsilon",
        "x ... one two three four five ... six seven eight nine",
        "ten eleven",
        "a b c d e f g h i j k l m n",
        "a b c d e f g h ... z",
    ]
    index = spans.SpanIndex([_kps("q", {i + 1: [(f"s{i}", s)] for i, s in enumerate(quotes)})])
    texts = [
        "zero one two three four five six seven eight nine ten eleven",
        "gamma delta epsilon alpha beta",
        "a b c d e f g h q r s t u v w x y z i j k l m n",
        "a b c d e f g h i j k l m n o",
        "xone two three four fives",
    ]
    for text in texts:
        norm = spans.normalize(text)
        brute = {k for e in index.entries if e.cross and e.needle.find(norm) for k in e.labels}
        assert index.labels("other", text) == brute, text
    assert index.labels("other", texts[0]) == {"q#1", "q#2", "q#4"}


# --- the reader and the environment builder agree ----------------------------------------------------------


def _evidence_labels(folder: Path) -> dict[tuple[str, str], set[str]]:
    out = {}
    for run in read_runs([folder], report=ReadReport()):
        for e in run.events:
            if e.type == "evidence":
                assert e.labels is not None
                out[(run.run_id, e.evidence_id)] = set(e.labels)
    return out


def _env_doc_labels(monkeypatch) -> dict[str, set[str]]:
    """Record the labels the environment builder gives each document's passages (before identical passages of
    different documents are merged into one)."""
    seen: dict[str, set[str]] = defaultdict(set)
    add = env_build.Builder.add_passage

    def recording(self, doc, atom, kind):
        seen[drgym.doc_key(doc)] |= atom.labels
        return add(self, doc, atom, kind)

    monkeypatch.setattr(env_build.Builder, "add_passage", recording)
    return seen


def _agree(evidence, env_docs) -> tuple[int, list]:
    differ = []
    for (qid, doc), labels in evidence.items():
        env = {k for k in env_docs.get(drgym.doc_key(doc), ()) if k.rpartition("#")[0] == qid}
        if env != labels:
            differ.append((qid, doc, sorted(labels), sorted(env)))
    return len(evidence) - len(differ), differ


def test_reader_and_environment_label_documents_alike(tmp_path, monkeypatch):
    root = tmp_path / "drgym"
    for d in ("queries", "key_point", "Searcho1_ClueWeb22"):
        (root / d).mkdir(parents=True)
    (root / "queries" / "q.jsonl").write_text('{"id": "q1", "query": "how do bees make honey"}\n')
    (root / "key_point" / "q1.json").write_text(
        json.dumps(
            {
                "key_points": {
                    "cw-gt": [
                        {"point_number": 1, "spans": ["Bees regurgitate nectar into the honeycomb cells."]},
                        {"point_number": 2, "spans": ["fanning ... evaporates the water"]},
                    ],
                    "cw-span-only": [
                        {"point_number": 1, "spans": ["Honey never spoils when it is sealed."]},
                        {"point_number": 2, "spans": ["Bees dance"]},
                    ],
                }
            }
        )
    )
    (root / "key_point" / "q1_aggregated.json").write_text(
        json.dumps(
            {
                "key_points": [
                    {"point_number": 1, "point_content": "Nectar is regurgitated.", "original_point_number": [1]},
                    {"point_number": 2, "point_content": "Water evaporates.", "original_point_number": [2]},
                    {"point_number": 3, "point_content": "Honey keeps.", "original_point_number": [3]},
                    {"point_number": 4, "point_content": "Bees dance.", "original_point_number": [4]},
                ]
            }
        )
    )
    (root / "Searcho1_ClueWeb22" / "q1.q").write_text("how do bees make honey")
    (root / "Searcho1_ClueWeb22" / "q1.a").write_text(
        "<|begin_search_query|>bees honey<|end_search_query|>\n<|begin_search_result|>"
        "Doc 1 (URL: http://gt.example, ClueWebID: CW-GT)\nBees regurgitate nectar into the honeycomb cells. "
        "Their fanning quickly evaporates the water.\n"
        "Doc 2 (URL: http://mirror.example, ClueWebID: cw-mirror)\nA mirror: bees regurgitate nectar, into the "
        "honeycomb cells! Also, honey never spoils when it's sealed.\n"
        "Doc 3 (URL: http://other.example, ClueWebID: cw-other)\nBees dance to show where flowers are.\n"
        "<|end_search_result|>\nDone."
    )
    env_docs = _env_doc_labels(monkeypatch)
    env_build.build_drgym([str(root)], tmp_path / "env", chunk_words=20, progress=False)
    evidence = _evidence_labels(root / "Searcho1_ClueWeb22")
    assert evidence == {("q1", "CW-GT"): {"q1#1", "q1#2"}, ("q1", "cw-mirror"): {"q1#1"}, ("q1", "cw-other"): set()}
    # by id (own spans located or not), a long quote of another document with other punctuation (mirror), a
    # two-word quote of another document (not enough); "it's" vs "it is" differ in words: no match
    assert _agree(evidence, env_docs) == (3, [])
    assert env_docs["cw-span-only"] == {"q1#3", "q1#4"}


@pytest.mark.shared
def test_real_reader_and_environment_label_the_same_documents_alike(tmp_path, monkeypatch, shared):
    """The first 40 Search-o1 traces (in name order) with their key points: every retrieved document gets the
    same key points from the reader as its passages get from the environment builder."""
    traces, kp_dir, queries = (
        shared("drgym", "Searcho1_ClueWeb22"),
        shared("drgym", "key_point"),
        shared("drgym", "queries"),
    )
    qids = [p.stem for p in sorted(traces.glob("*.a"))[:40]]
    root = tmp_path / "drgym"
    for d in ("queries", "key_point", "Searcho1_ClueWeb22"):
        (root / d).mkdir(parents=True)
    wanted = set(qids)
    lines = [
        line
        for f in sorted(queries.glob("*.jsonl"))
        for line in f.read_text(encoding="utf-8").splitlines()
        if line.strip() and str(json.loads(line).get("id")) in wanted
    ]
    (root / "queries" / "q.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for q in qids:  # links, not copies
        for f in drgym.keypoint_files(kp_dir, q):
            (root / "key_point" / f.name).symlink_to(f)
        for ext in (".a", ".q"):
            (root / "Searcho1_ClueWeb22" / f"{q}{ext}").symlink_to(traces / f"{q}{ext}")
    env_docs = _env_doc_labels(monkeypatch)
    out = env_build.build_drgym([str(root)], tmp_path / "env", progress=False)
    evidence = _evidence_labels(root / "Searcho1_ClueWeb22")
    agree, differ = _agree(evidence, env_docs)
    assert differ == [] and agree == len(evidence) >= 100
    labelled = [k for k, v in evidence.items() if v]
    index = spans.SpanIndex([drgym.load_key_points(kp_dir, q) for q in qids])
    span_only = [k for k in labelled if not index.own.get(drgym.doc_key(k[1]))]
    assert len(labelled) >= 20 and len(span_only) >= 4  # both rules are exercised: by id and by quoted span
    # the written environment keeps every label (identical passages of two documents merge their labels)
    with gzip.open(out / "passages.jsonl.gz", "rt", encoding="utf-8") as fh:
        written = {k for line in fh for k in json.loads(line)["labels"]}
    assert written == {k for labs in env_docs.values() for k in labs}
