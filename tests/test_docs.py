"""The documentation: README.md, ARCHITECTURE.md and the site under docs/ (mkdocs.yml).

Every relative link resolves (file and #anchor), every `branchgate ...` command shown names a real subcommand and
real options, the site builds with `mkdocs build --strict`, and the generated parts (the results page, the
README's headline numbers, the CLI reference) are what their scripts write now.
"""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import subprocess
import sys
import unicodedata
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^([ \t]*)(```|~~~)([^\n]*)\n(.*?)^[ \t]*\2[ \t]*$", re.M | re.S)
INLINE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_REF = re.compile(r"""\b(?:href|src)=["']([^"']+)["']""")
HTML_ID = re.compile(r"""\b(?:id|name)=["']([^"']+)["']""")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)
SHELL = {"", "bash", "sh", "shell", "console", "text"}  # fenced blocks whose lines may be commands


def documents(root: Path = REPO) -> list[Path]:
    return [root / "README.md", root / "ARCHITECTURE.md", *sorted((root / "docs").rglob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code (links there are not links)."""
    return INLINE.sub("", FENCE.sub("", text))


# ---- anchors -------------------------------------------------------------------------------------------------


def _heading_text(raw: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"(\*\*|__|\*)", "", text)
    return html.unescape(text).strip()


def github_slug(text: str) -> str:
    """GitHub's heading anchor: lower case, punctuation and symbols dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def mkdocs_slug(text: str) -> str:
    """Python-Markdown's toc slugify, as mkdocs uses it (ASCII, runs of spaces and hyphens one hyphen)."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


@cache
def anchors(path: Path, site: bool) -> frozenset[str]:
    """The anchors of a Markdown file as GitHub renders it, or (``site``) as mkdocs does; duplicates numbered."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set(HTML_ID.findall(text))
    for _, raw in HEADING.findall(text):
        slug = (mkdocs_slug if site else github_slug)(_heading_text(raw))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}{'_' if site else '-'}{n}")
    return frozenset(out)


def link_problems(path: Path, root: Path = REPO) -> list[str]:
    """Relative links of ``path`` that do not resolve. A page of the site (under docs/) may only link inside
    docs/ (the site has nothing else); an anchor into the site must exist for mkdocs and for GitHub alike."""
    docs = (root / "docs").resolve()
    text = prose(path.read_text(encoding="utf-8"))
    out = []
    for target in [*LINK.findall(text), *HTML_REF.findall(text)]:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path.resolve()
        where = f"{path.relative_to(root)}: link {target!r}"
        if not dest.exists():
            out.append(f"{where}: no such file")
            continue
        if path.resolve().is_relative_to(docs) and not dest.is_relative_to(docs):
            out.append(f"{where}: a page of the site links outside docs/")
            continue
        if anchor and dest.suffix == ".md":
            rules = (False, True) if dest.is_relative_to(docs) else (False,)
            for site in rules:
                if anchor not in anchors(dest, site):
                    out.append(f"{where}: no heading with anchor #{anchor} ({'mkdocs' if site else 'GitHub'})")
    return out


# ---- commands ------------------------------------------------------------------------------------------------


def cli_options(commands) -> dict[tuple[str, ...], frozenset[str]]:
    """Every runnable command path and the option strings its parser accepts; ``()`` is the top level.
    ``commands``: ``scripts/cli_reference.commands``, the one walk over the parser."""
    from branchgate.cli import build_parser

    parser = build_parser()
    out = {(): frozenset(parser._option_string_actions)}
    for path, sub in commands(parser):
        out[path] = frozenset(sub._option_string_actions)
    return out


@cache
def train_options() -> frozenset[str]:
    """``branchgate train`` hands its arguments to LightningCLI: its options are those of its own --help."""
    run = subprocess.run(
        [sys.executable, "-m", "branchgate", "train", "--help"], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert run.returncode == 0, run.stderr
    return frozenset(re.findall(r"(?<![\w-])(--?[A-Za-z][\w.-]*)", run.stdout))


def shown_commands(text: str) -> list[str]:
    """Command lines that run ``branchgate``: lines of shell-like fenced blocks (continuations joined) and
    inline code spans."""
    lines = []
    for _indent, _fence, lang, body in FENCE.findall(text):
        if lang.strip().lower() in SHELL:
            lines += body.replace("\\\n", " ").splitlines()
    lines += [" ".join(code.split()) for _, code in INLINE.findall(FENCE.sub("", text))]
    return [line for line in lines if "branchgate" in line]


def _tokens(line: str) -> list[str]:
    lexer = shlex.shlex(line.replace("\\|", ","), posix=True, punctuation_chars="|&;<>()")
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote in prose: plain words
        return line.split()


def command_problems(line: str, where: str, known: dict) -> list[str]:
    """``branchgate`` at a command position of ``line`` (its start, after a pipe or ;, after ``$``, variable
    assignments or ``python -m``) must name a real command with options it has (``known``: ``cli_options``)."""
    toks = _tokens(line)
    out, i, start = [], 0, True
    while i < len(toks):
        tok = toks[i]
        if set(tok) <= set("|&;<>()"):
            start = True
        elif start and (
            tok == "$" or re.fullmatch(r"[A-Za-z_]\w*=\S*", tok) or re.fullmatch(r"python[\d.]*", tok) or tok == "-m"
        ):
            pass  # still at the command position
        elif start and tok == "branchgate":
            i = _check(toks, i + 1, known, where, out)
            start = False
            continue
        else:
            start = False
        i += 1
    return out


def _check(toks: list[str], i: int, known: dict, where: str, out: list[str]) -> int:
    path: tuple[str, ...] = ()
    groups = {p[:n] for p in known for n in range(1, len(p))}
    while i < len(toks) and not set(toks[i]) <= set("|&;<>()"):
        word = toks[i].strip("[]")
        if word.startswith("-"):
            if path not in known:
                break
            opt = word.split("=", 1)[0]
            ok = opt in (train_options() if path == ("train",) else known[path]) or opt in ("-h", "--help")
            if not ok:
                out.append(f"{where}: `branchgate {' '.join(path)}` has no option {opt}")
        elif path in groups or path == ():
            if (*path, word) not in known and (*path, word) not in groups:
                out.append(f"{where}: `branchgate {' '.join((*path, word))}` is not a command")
                return i + 1
            path = (*path, word)
        i += 1
    if path in groups:
        out.append(f"{where}: `branchgate {' '.join(path)}` needs a subcommand")
    return i


# ---- repository paths ----------------------------------------------------------------------------------------


def path_problems(path: Path, root: Path = REPO) -> list[str]:
    """Repository paths named in inline code (``scripts/split_queries.py``, ``training/stats.bootstrap_ci``) that do
    not exist. Placeholders (``NAME``, ``<step>``, ``*``) are skipped; ``folder/module.name`` may name a module's
    attribute."""
    tops = {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(("__", ".git"))}
    out = []
    for _, code in INLINE.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        for tok in code.split():
            tok = tok.strip("(),;:[]'\"`")
            top, sep, rest = tok.partition("/")
            if not sep or top not in tops or re.search(r"[<>*{}]|\b[A-Z]{2,}\b", tok):
                continue
            module = root / top / (rest.rsplit(".", 1)[0] + ".py")
            if not (root / tok).exists() and not module.is_file():
                out.append(f"{path.relative_to(root)}: `{tok}` does not exist")
    return out


# ---- the tests -----------------------------------------------------------------------------------------------


def test_every_relative_link_resolves():
    problems = [p for doc in documents() for p in link_problems(doc)]
    assert not problems, "\n".join(problems)


def test_every_shown_command_is_a_real_command_with_real_options(harness):
    known = cli_options(harness("cli_reference").commands)
    problems, seen = [], 0
    for doc in documents():
        for line in shown_commands(doc.read_text(encoding="utf-8")):
            seen += 1
            problems += command_problems(line, str(doc.relative_to(REPO)), known)
    assert seen > 30  # the docs do show commands: the check looked at them
    assert not problems, "\n".join(problems)


def test_every_repository_path_shown_exists():
    """README, ARCHITECTURE and the user pages name files that exist (the research pages also name files of
    earlier commits, on purpose)."""
    pages = [d for d in documents() if "research" not in d.relative_to(REPO).parts]
    problems = [p for doc in pages for p in path_problems(doc)]
    assert not problems, "\n".join(problems)


def test_the_path_check_finds_a_planted_moved_file(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "tool.py").write_text("")
    doc = tmp_path / "README.md"
    doc.write_text("Run `python3 scripts/tool.py`, `scripts/tool.main`, `scripts/NAME.txt` and `scripts/moved.py`.\n")
    assert path_problems(doc, tmp_path) == ["README.md: `scripts/moved.py` does not exist"]


def test_the_checks_find_a_planted_broken_link_and_anchor(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "ARCHITECTURE.md").write_text("# Arch\n")
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Report keys — all of them\n\nText.\n")
    (tmp_path / "README.md").write_text(
        "# R\n\n[ok](docs/page.md) [ok](docs/page.md#page) [ok](#r) [gone](docs/nope.md) "
        "[bad anchor](docs/page.md#no-such-heading) [dash](docs/page.md#report-keys-all-of-them) "
        "`[not a link](docs/nope2.md)`\n\n```\n[in code](docs/nope3.md)\n```\n"
    )
    (tmp_path / "docs" / "index.md").write_text("[out of the site](../ARCHITECTURE.md) [in](page.md#page)\n")
    problems = [p for doc in documents(tmp_path) for p in link_problems(doc, tmp_path)]
    assert any("'docs/nope.md': no such file" in p for p in problems)
    assert any("#no-such-heading" in p for p in problems)
    # the em dash: GitHub makes two hyphens, mkdocs one — a link that works in one place only is caught
    assert any("#report-keys-all-of-them (GitHub)" in p for p in problems)
    assert any("links outside docs/" in p for p in problems)
    assert len(problems) == 5, problems  # the missing anchor for both renderers; nothing in code; good links pass


def test_the_checks_find_a_planted_bad_command_and_option(harness):
    known = cli_options(harness("cli_reference").commands)
    text = (
        "```bash\nbranchgate dataset build --traces logs/ --out ds --no-such-option 3\n"
        "RAY_ADDRESS=auto branchgate dataset build --traces a --out b --engine ray\n"
        "echo '{\"a\": 1}' | branchgate gate --model m.onnx --tua 0.3   # a typo\n"
        "pip install branchgate\n```\n\n"
        "Run `branchgate simulat --env sample --out x`, `branchgate dataset` and "
        "`branchgate bench --env DIR --train-queries F \\| G --eval-queries F --out DIR`, "
        "then `python3 -m branchgate train --config quickstart --trainer.max_epochs=2 --model.no_such_knob 1`.\n"
    )
    problems = [p for line in shown_commands(text) for p in command_problems(line, "x.md", known)]
    assert sorted(problems) == sorted(
        [
            "x.md: `branchgate dataset build` has no option --no-such-option",
            "x.md: `branchgate gate` has no option --tua",
            "x.md: `branchgate simulat` is not a command",
            "x.md: `branchgate dataset` needs a subcommand",
            "x.md: `branchgate train` has no option --model.no_such_knob",
        ]
    ), problems


def test_site_builds_strict(tmp_path):
    """mkdocs.yml's site: `mkdocs build --strict` (broken links, missing anchors, pages missing from the nav
    configuration's files all fail it)."""
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "site" / "results" / "index.html").is_file()
    page = (tmp_path / "site" / "results" / "index.html").read_text(encoding="utf-8")
    assert "<table>" in page.split("<details", 1)[1].split("</details>", 1)[0]  # tables inside <details> render


def test_results_page_and_readme_headline_are_the_stored_bench_report(harness):
    """docs/results.md's block and the README's headline numbers are exactly the rendering of the stored report
    (no number typed by hand), and the plots they show exist."""
    mod = harness("readme_results")
    report = json.loads(mod.STORED.read_text())
    page = mod.PAGE.read_text(encoding="utf-8")
    readme = mod.README.read_text(encoding="utf-8")
    assert page.count(mod.BEGIN) == 1 and page.count(mod.END) == 1
    assert page.split(mod.BEGIN, 1)[1].split(mod.END, 1)[0] == "\n" + mod.block(report)
    assert readme.split(mod.HEAD_BEGIN, 1)[1].split(mod.HEAD_END, 1)[0] == "\n" + mod.headline(report)
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", mod.block(report))
    assert images and all((mod.PAGE.parent / img).read_bytes()[:4] == b"\x89PNG" for img in images)
    assert mod.replace_block(page, mod.block(report)) == page  # rerunning the script changes nothing


def test_cli_reference_is_current(harness):
    """docs/cli.md is what scripts/cli_reference.py writes from today's --help texts."""
    mod = harness("cli_reference")
    recorded = re.search(r"\(Python (\d+\.\d+)\)", mod.PAGE.read_text(encoding="utf-8"))
    if recorded and recorded.group(1) != mod.version():
        pytest.skip(f"docs/cli.md was generated with Python {recorded.group(1)} (argparse's layout differs)")
    assert mod.PAGE.read_text(encoding="utf-8") == mod.page(), "run: python3 scripts/cli_reference.py"


def test_readme_is_one_screen_to_act_on():
    """At most 250 lines; install, quickstart and the Python that gates a decision come before the long parts."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    lines = readme.splitlines()
    assert len(lines) <= 250, len(lines)
    first = "\n".join(lines[:60])
    for needed in ("make quickstart", "make test", "Gate.load(", ".select("):
        assert needed in first, needed


def test_the_record_your_runs_example_writes_logs_replay_can_cost(tmp_path, monkeypatch, capsys):
    """docs/use/own-agent.md's recording example, run as shown, then the replay command shown after it: the logs
    carry llm_call events and evidence tokens, so replay costs them (token shares, a recommended τ, a picture)."""
    from branchgate.cli import main

    page = (REPO / "docs" / "use" / "own-agent.md").read_text(encoding="utf-8")
    section = page.split("## Record your runs", 1)[1].split("\n## ", 1)[0]
    (code,) = [body for _, _, lang, body in FENCE.findall(section) if lang.strip() == "python"]
    (command,) = [c for c in shown_commands(section) if c.startswith("branchgate replay")]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "own-agent.md", "exec"), {})  # noqa: S102  (the page's own example)
    argv = shlex.split(command)[1:]
    assert main([*argv, "--bootstrap", "50", "--no-progress"]) == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "replay" / "replay.json").read_text())
    assert report["runs"] == 1 and report["unpruned"]["tokens"] > 0
    assert "cannot cost" not in capsys.readouterr().err and "no token shares" not in report.get("summary", "")


def test_every_shared_figure_is_the_stored_one_on_every_user_page(harness):
    """A figure shown on more than one page (bench time, tree size, the read gate's share, ...) sits between
    ``<!-- fig:NAME -->`` markers and is what scripts/readme_results.py writes from the stored bench report and
    docs/figures.json: no two pages disagree, and a page that does fails here."""
    mod = harness("readme_results")
    figs = mod.figures(json.loads(mod.STORED.read_text()))
    used = set()
    for page in mod.user_pages():
        text = page.read_text(encoding="utf-8")
        used |= {m.group(1) for m in mod.FIG.finditer(text)}
        assert mod.fill_figures(text, figs, page.name) == text, (
            f"{page}: run python3 scripts/readme_results.py --figures"
        )
        # a line that starts with an HTML comment ends the paragraph in Markdown: a marker goes mid-line
        assert not [n for n, line in enumerate(text.splitlines(), 1) if line.startswith("<!-- fig:")], page
    stored = {k for k in json.loads(mod.FIGURES.read_text()) if not k.startswith("_")}
    assert stored <= used, stored - used  # docs/figures.json holds no figure that no page shows
    planted = "<!-- fig:read_gate.sim.kpr_share -->98.7%<!-- /fig -->"
    assert mod.fill_figures(planted, figs) != planted  # a disagreeing page is found
    with pytest.raises(SystemExit, match="unknown figure"):
        mod.fill_figures("<!-- fig:nope -->1<!-- /fig -->", figs)


DEVELOPMENT_NOTES = re.compile(
    r"/work/|this VM|a later session|below the \d+(\.\d+)?× target|other jobs ran|other jobs beside|"
    r"with nothing else running|shared host",
    re.I,
)


def test_user_pages_hold_no_development_notes(harness):
    """The README and the site (not its research notes) speak to a user: no machine paths, no notes about the
    machine a figure was measured on or about later sessions."""
    problems = []
    for page in harness("readme_results").user_pages():
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if m := DEVELOPMENT_NOTES.search(line):
                problems.append(f"{page.relative_to(REPO)}:{n}: {m.group(0)!r}")
    assert not problems, problems


@pytest.mark.slow
def test_the_concepts_pipeline_example_saves_tokens_and_keeps_recall(tmp_path, monkeypatch, capsys):
    """docs/concepts.md's reference-pipeline example, run as shown: the gated runs spend well under half the
    unpruned tokens and keep nearly all their key-point recall, with no stage warning (the example it replaced,
    `--post sc` at its default, kept 0.05 KPR of 0.95)."""
    from branchgate.cli import main

    page = (REPO / "docs" / "concepts.md").read_text(encoding="utf-8")
    section = page.split("## Stages", 1)[1].split("\n## ", 1)[0]
    shown = [c for c in shown_commands(section) if c.startswith("branchgate simulate") and "--out" in c]
    gated, unpruned = (shlex.split(c)[1:] for c in shown)
    monkeypatch.chdir(tmp_path)
    summaries = []
    for argv in (gated, unpruned):
        assert main([*argv, "--no-progress"]) == 0
        assert "warning:" not in capsys.readouterr().err
        summaries.append(json.loads((tmp_path / argv[argv.index("--out") + 1] / "summary.json").read_text()))
    g, u = ({k: s[k]["mean"] for k in ("tokens", "kpr")} for s in summaries)
    assert g["tokens"] < 0.5 * u["tokens"] and g["kpr"] >= 0.9 * u["kpr"], (g, u)
    assert f"{g['tokens'] / 1000:.1f}k" in section and f"{u['tokens'] / 1000:.1f}k" in section  # the page's figures


def test_simulate_warns_when_a_stage_at_its_default_drops_nearly_everything():
    """The summary of the old concepts example (`--post sc` at its default) warns and names the knob; a stage
    given its knob, or one that keeps enough, does not."""
    from branchgate.pipeline.simulate_cli import stage_drops

    summary = {
        k: {"mean": v} for k, v in {"n_candidates": 6, "n_expanded": 6, "n_evidence": 26.2, "n_context": 0.5}.items()
    }
    summary |= {"n_final": {"mean": 0.4}, "hits_offered": {"mean": 26.2}, "hits_read": {"mean": 26.2}}
    (warning,) = stage_drops(summary, {"pre": "gate:c.onnx", "read": "none", "post": "sc", "synth": "cd:threshold=0.1"})
    assert warning.startswith("--post-policy sc at its default threshold dropped 98%") and "sc:threshold=T" in warning
    assert stage_drops(summary, {"pre": "none", "read": "none", "post": "sc:max_items=3", "synth": "none"}) == []


def test_the_bench_plots_never_give_two_curves_the_same_look():
    """kpr_vs_tokens.png: no (colour, line style, marker) twice, however many families (bench_full draws 40+)."""
    import matplotlib.pyplot as plt

    from branchgate.bench.report import curve_styles

    gates = [f"gate{i}" for i in range(9)]
    others = [f"teacher{i}" for i in range(40)]
    styles = curve_styles(gates, others, plt)
    assert len(set(styles.values())) == len(gates) + len(others)
    assert not {s[0] for k, s in styles.items() if k in gates} & {s[0] for k, s in styles.items() if k in others}


def test_the_home_page_example_runs_as_shown(capsys):
    """docs/index.md's five-line example on the core install's pretrained controller."""
    (code,) = [
        b for _, _, lang, b in FENCE.findall((REPO / "docs" / "index.md").read_text()) if lang.strip() == "python"
    ]
    assert len([line for line in code.splitlines() if line.strip()]) <= 5
    exec(compile(code, "index.md", "exec"), {})  # noqa: S102  (the page's own example)
    kept = json.loads(capsys.readouterr().out)
    assert kept and all(0 <= i < 3 for i in kept)


def test_the_docs_name_the_extras_the_install_script_installs():
    """README and getting started say which extras `make quickstart` installs: those of .ci/install."""
    script = (REPO / ".ci" / "install").read_text(encoding="utf-8")
    (installed,) = re.findall(r'pip install -q -e "\.\[([\w,]+)\]"', script)
    for page in (REPO / "README.md", REPO / "docs" / "getting-started.md"):
        shown = set(re.findall(r'pip install -e\s+"\.\[([\w,]+)\]"', page.read_text(encoding="utf-8")))
        assert shown == {installed}, f"{page.name} shows {shown}, .ci/install installs .[{installed}]"
