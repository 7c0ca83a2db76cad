"""The documentation holds together: every relative link and #anchor in README.md, data/README.md and docs/**/*.md
resolves, and every page under docs/ is reachable from README.md by links (issue 29, item 1)."""
from __future__ import annotations

import pathlib
import re
import unicodedata
from collections import deque

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: ``[text](target)`` and ``![alt](target)``; a title after the target (``(x "title")``) is dropped
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_EXPLICIT = re.compile(r"<a\s+(?:[^>]*?\s)?(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks, with inline code spans blanked out."""
    fenced = False
    for i, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield i, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lowercase, punctuation other than '-' and '_' removed,
    spaces -> '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    kept = [c for c in text if c in "-_ " or unicodedata.category(c)[0] in "LN"]
    return "".join(kept).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page defines: heading slugs (a repeated one gets -1, -2, ... as on GitHub) and explicit
    ``<a id=...>`` / ``<a name=...>``."""
    found, seen = set(), {}
    for _, line in _prose_lines(text):
        m = _HEADING.match(line)
        if m:
            s = slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
        found.update(_EXPLICIT.findall(line))
    return found


def links(text: str):
    """(line number, target) of every link in prose (code blocks and inline code are not links)."""
    for i, line in _prose_lines(text):
        for m in _LINK.finditer(re.sub(r"`[^`]*`", lambda c: " " * len(c.group(0)), line)):
            yield i, m.group(1)


def pages(root: pathlib.Path) -> list[pathlib.Path]:
    """README.md, data/README.md and every page under docs/."""
    out = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
    data = root / "data" / "README.md"
    return out + ([data] if data.exists() else [])


def check(root: pathlib.Path) -> list[str]:
    """Every problem, one line each: a relative link to a path that does not exist, an anchor that the target page
    does not define, a page under docs/ that README.md does not reach by links."""
    problems, cache = [], {}

    def anchors_of(path: pathlib.Path) -> set[str]:
        if path not in cache:
            cache[path] = anchors(path.read_text(encoding="utf-8"))
        return cache[path]

    graph: dict[pathlib.Path, set[pathlib.Path]] = {}
    for page in pages(root):
        graph[page] = set()
        where = page.relative_to(root)
        for line, target in links(page.read_text(encoding="utf-8")):
            if _EXTERNAL.match(target):
                continue
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / path_part).resolve() if path_part else page
            if not dest.exists():
                problems.append(f"{where}:{line}: broken link {target!r}: {path_part} does not exist")
                continue
            if dest.is_file() and dest.suffix == ".md":
                graph[page].add(dest)
                if anchor and anchor not in anchors_of(dest):
                    problems.append(f"{where}:{line}: broken anchor {target!r}: no heading or <a id> "
                                    f"'{anchor}' in {dest.relative_to(root)}")
            elif anchor:
                problems.append(f"{where}:{line}: anchor {target!r} into a file that is not a Markdown page")
    start = (root / "README.md").resolve()
    reached, todo = {start}, deque([start])
    resolved = {p.resolve(): p for p in graph}
    while todo:
        for nxt in graph.get(resolved.get(todo.popleft()), ()):
            if nxt not in reached:
                reached.add(nxt)
                todo.append(nxt)
    for page in sorted((root / "docs").rglob("*.md")):
        if page.resolve() not in reached:
            problems.append(f"{page.relative_to(root)}: not reachable from README.md by links")
    return problems


def test_every_link_and_anchor_resolves_and_every_page_is_reachable():
    assert check(ROOT) == []


def test_a_broken_link_an_unknown_anchor_and_an_orphan_page_are_reported(tmp_path):
    (tmp_path / "docs" / "guide").mkdir(parents=True)
    (tmp_path / "README.md").write_text("# Front\n\n[guide](docs/guide/a.md), [anchor](docs/guide/a.md#the-api-v2)\n"
                                        "[gone](docs/guide/missing.md) and [bad anchor](docs/guide/a.md#nowhere)\n"
                                        "`[not a link](nowhere.md)`\n\n```\n[nor this](nowhere.md)\n```\n")
    (tmp_path / "docs" / "guide" / "a.md").write_text("# A\n\n## The `api`: v2!\n\n<a id=\"here\"></a>\n\n"
                                                      "[self](#here) [back](../../README.md#front) [up](#a)\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n\n[front](../README.md)\n")
    problems = check(tmp_path)
    assert len(problems) == 3, problems
    assert any("README.md:4: broken link 'docs/guide/missing.md'" in p for p in problems), problems
    assert any("README.md:4: broken anchor 'docs/guide/a.md#nowhere'" in p for p in problems), problems
    assert any(p == "docs/orphan.md: not reachable from README.md by links" for p in problems), problems
    (tmp_path / "README.md").write_text("# Front\n\n[guide](docs/guide/a.md#the-api-v2) [o](docs/orphan.md)\n")
    assert check(tmp_path) == []


def test_slugs_follow_github():
    assert slug("`fastspec simulate`: what would this draft buy me?") == \
        "fastspec-simulate-what-would-this-draft-buy-me"
    assert slug("llama.cpp `--kl-divergence-base` files (read, never written)") == \
        "llamacpp---kl-divergence-base-files-read-never-written"
    assert slug("Predicted vs measured: fastspec's loop and Hugging Face's `generate`") == \
        "predicted-vs-measured-fastspecs-loop-and-hugging-faces-generate"
    assert anchors("# A\n## A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1", "a-2"}


def test_the_cli_reference_lists_todays_flags():
    """docs/reference/cli.md's flag lists are what the commands' --help says (rerun scripts/cli_reference.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    text = ref.PAGE.read_text()
    assert ref.MARKER in text
    assert text.split(ref.MARKER)[1].strip() == ref.flags_markdown().strip(), \
        "docs/reference/cli.md is out of date: run python scripts/cli_reference.py"


#: a repository path in inline code: ``fastspec/io/dump.py``, ``cli/_options.py``, ``benchmarks/vllm_batch/`` ...
_REPO_PATH = re.compile(r"`((?:fastspec|cli|benchmarks|scripts|tests)/[A-Za-z0-9_./-]*)`")
#: a dotted library name in inline code: ``fastspec.costs.break_even``, ``fastspec.engines.vllm.compare`` ...
_LIB_NAME = re.compile(r"`(fastspec(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def _resolves(name: str) -> bool:
    """A dotted name is a module, or an attribute chain of the longest importable module prefix."""
    import importlib

    parts = name.split(".")
    for j in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:j]))
        except ImportError:
            continue
        for attr in parts[j:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def stale_names(root: pathlib.Path) -> list[str]:
    """Repository paths and ``fastspec.*`` names quoted in README.md and docs/ that no longer exist.  Placeholders
    in capitals (``fastspec/engines/NAME/``) and lines that say a path was so "at the time" (dated results) are
    skipped."""
    bad = []
    for page in [root / "README.md"] + sorted((root / "docs").rglob("*.md")):
        for i, line in enumerate(page.read_text().splitlines(), 1):
            if "at the time" in line:
                continue
            for m in _REPO_PATH.finditer(line):
                path = m.group(1).rstrip(".")
                if not re.search(r"/[A-Z]+(/|$)", path) and not (root / path).exists():
                    bad.append(f"{page.relative_to(root)}:{i}: {path} does not exist")
            for m in _LIB_NAME.finditer(line):
                if not _resolves(m.group(1)):
                    bad.append(f"{page.relative_to(root)}:{i}: {m.group(1)} does not resolve")
    return bad


def test_the_docs_name_modules_and_paths_that_exist():
    """Every module path (``fastspec/io/dump.py``) and dotted name (``fastspec.costs.break_even``) the docs quote
    exists today: a moved or renamed module cannot leave its old name behind in the docs."""
    assert stale_names(ROOT) == []


def test_a_stale_name_is_found(tmp_path):
    """The check itself: an old path and an old dotted name on a page are both reported."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("See `fastspec/engines/vllm_batch.py` and `fastspec.engines.hf_generate`.\n"
                                        "Placeholders pass: `fastspec/engines/NAME/`.\n")
    (tmp_path / "fastspec").mkdir()
    assert stale_names(tmp_path) == ["README.md:1: fastspec/engines/vllm_batch.py does not exist",
                                     "README.md:1: fastspec.engines.hf_generate does not resolve"]


def test_the_code_points_to_pages_that_exist():
    """Module docstrings and help texts link to the page that explains them (``docs/guide/simulate.md``,
    ``docs/reference/dump-format.md#sparse``): every such path, and its anchor, exists."""
    page_ref = re.compile(r"(docs/[A-Za-z0-9_./-]*\.md)(#[A-Za-z0-9_-]+)?")
    bad, seen = [], 0
    for src in sorted([*(ROOT / "fastspec").rglob("*.py"), *(ROOT / "cli").rglob("*.py")]):
        for i, line in enumerate(src.read_text().splitlines(), 1):
            for m in page_ref.finditer(line):
                seen += 1
                page = ROOT / m.group(1)
                if not page.is_file():
                    bad.append(f"{src.relative_to(ROOT)}:{i}: {m.group(1)} does not exist")
                elif m.group(2) and m.group(2)[1:] not in anchors(page.read_text()):
                    bad.append(f"{src.relative_to(ROOT)}:{i}: {m.group(0)}: no such anchor")
    assert seen >= 20 and bad == []
