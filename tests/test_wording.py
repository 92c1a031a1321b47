"""Wording: nothing meshscope shows its users cites "the seed".

meshscope grew from a chapter of a Chinese NCCL course on TP, PP, EP/MoE and multi-dimensional process
groups. That chapter is not in the repository, so user-facing text calls it "the chapter" and points at
docs/chapter.md (a question such as "docs/chapter.md, Q3", or a section title), never at "the seed".

The word itself stays legitimate where it means a random seed: torch's ``manual_seed``, an RNG ``seed``
config field or parameter (``seed: int = 0``), a ``--seed`` option. Those are allowed below, by
`_is_rng`; everything else that says "seed" as a whole word (any case, also "seed's") fails.

Scope: user-facing text is every string literal of src/meshscope that is not a docstring (help texts,
errors, doctor causes and findings, table titles, report.md and result.json contents), README.md,
docs/**/*.md, and the text of ``meshscope --help``, every subcommand's ``--help``, ``meshscope list``
and ``meshscope predict tp_sp_b128``. A stricter check covers the comments, docstrings and identifiers
of the sources too, since they may cite the chapter (by its questions) but not as "the seed".
"""

from __future__ import annotations

import argparse
import ast
import re
import tokenize
from pathlib import Path

import pytest

from meshscope.cli.parser import build_parser, main

from .helpers import ROOT

SRC = ROOT / "src" / "meshscope"

PENDING = ()
"""Subpackages of src/meshscope whose wording is not done yet and are left out of every check here. Empty:
every check covers all of src/meshscope. A subpackage may only be listed here while its wording is being
fixed, and must leave the tuple when that is done."""

SEED = re.compile(r"\bseed(?:'s|s)?\b", re.IGNORECASE)
RNG = re.compile(r"\bRNG\b|\brandom|manual_seed|Generator|--seed\b", re.IGNORECASE)
IDENTIFIER_STRING = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _is_rng(text: str) -> bool:
    """Whether a "seed" in `text` is a random seed: the text names the RNG (``RNG seed``, ``random``,
    ``manual_seed``, ``torch.Generator``, a ``--seed`` option), or it is the bare name ``seed`` itself,
    as a config field, dict key or argparse dest."""
    return bool(RNG.search(text)) or text.strip().strip("'\"").lower() == "seed"


def _offending(text: str) -> list[str]:
    """The lines of `text` that say "seed" other than about a random seed."""
    return [line.strip() for line in text.splitlines() if SEED.search(line) and not _is_rng(line)]


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if p.relative_to(SRC).parts[0] not in PENDING)


def test_pending_packages_exist():
    """A renamed or removed package must leave PENDING, not hide under a stale name."""
    assert all((SRC / name / "__init__.py").exists() for name in PENDING)


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes: the first statement of a module, class or function, and attribute
    docstrings (a bare string statement after an assignment)."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def _string_literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


def test_user_facing_strings_do_not_say_seed():
    bad = [f"{path.relative_to(ROOT)}:{line}: {text!r}"
           for path in _sources() for line, text in _string_literals(path) if _offending(text)]
    assert not bad, "user-facing strings cite 'the seed'; name the chapter and point at docs/chapter.md:\n" + "\n".join(bad)


def test_readme_and_docs_do_not_say_seed():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    bad = [f"{path.relative_to(ROOT)}: {line}" for path in docs for line in _offending(path.read_text())]
    assert not bad, "\n".join(bad)


def _subcommands() -> list[str]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return list(action.choices)


def _output(capsys, argv: list[str]) -> str:
    try:
        rc = main(argv)
    except SystemExit as exc:  # --help exits through argparse
        rc = exc.code
    out, err = capsys.readouterr()
    assert rc == 0, (argv, err[-2000:])
    return out + err


@pytest.mark.parametrize("argv", [["--help"], *([name, "--help"] for name in _subcommands()), ["list"],
                                  ["predict", "tp_sp_b128"]], ids=" ".join)
def test_cli_output_does_not_say_seed(capsys, monkeypatch, argv):
    monkeypatch.setenv("COLUMNS", "200")
    out = _output(capsys, argv)
    assert out.strip()
    assert not _offending(out), _offending(out)


def _source_words(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment, string (docstrings included) and identifier of a Python file."""
    out = []
    with path.open("rb") as f:
        for tok in tokenize.tokenize(f.readline):
            if tok.type == tokenize.NAME:
                # snake_case and UPPER_CASE names: SEED_WORLD or test_seed_counts say "seed" as a word;
                # an RNG's name (megatron-core's model_parallel_cuda_manual_seed) is a random seed
                words = " ".join(tok.string.split("_"))
                if tok.string not in ("seed", "seeds") and not RNG.search(tok.string):
                    out.append((tok.start[0], words))
            elif tok.type in (tokenize.COMMENT, tokenize.STRING) or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
                out.extend((tok.start[0] + i, line) for i, line in enumerate(tok.string.splitlines()))
    return out


def test_sources_do_not_cite_the_seed():
    """Comments, docstrings and identifiers of src/meshscope (less PENDING), tests/ and benchmarks/ may cite
    the chapter by its questions ("chapter Q7: ..."), not as "the seed"; a random seed is fine."""
    files = _sources() + sorted((ROOT / "benchmarks").glob("*.py")) + \
        sorted(p for p in (ROOT / "tests").glob("*.py") if p.name != Path(__file__).name)
    bad = [f"{path.relative_to(ROOT)}:{line}: {text.strip()}"
           for path in files for line, text in _source_words(path)
           if SEED.search(text) and not _is_rng(text)]
    bad += [f"{path.relative_to(ROOT)}: {line}" for path in sorted((ROOT / "benchmarks").glob("*.sh"))
            for line in _offending(path.read_text())]
    assert not bad, "\n".join(bad)


def _chapter_headings() -> tuple[set[int], set[str]]:
    """(question numbers, section titles) of docs/chapter.md."""
    headings = [line.lstrip("#").strip() for line in (ROOT / "docs" / "chapter.md").read_text().splitlines()
                if line.startswith("## ") or line.startswith("### ")]
    questions = {int(m.group(1)) for h in headings if (m := re.match(r"Q(\d+)\.", h))}
    return questions, {h for h in headings if not re.match(r"Q\d+\.", h)}


def test_pointers_into_chapter_md_exist():
    """Every "docs/chapter.md, Q12" or "docs/chapter.md, <section>" in the sources names a question or
    section that docs/chapter.md has, so that a user sent there finds it."""
    questions, sections = _chapter_headings()
    assert questions == set(range(1, 29))
    bad = []
    for path in _sources():
        text = " ".join(path.read_text().split())  # pointers may wrap inside docstrings
        for m in re.finditer(r"docs/chapter\.md,? ([^);]*)", text):
            target = m.group(1).strip()
            if target.startswith("Q"):
                bad += [f"{path.relative_to(ROOT)}: Q{q}" for q in map(int, re.findall(r"Q(\d+)", target))
                        if q not in questions]
            elif target.startswith('"') or target[:1].isupper():  # a section title, quoted or not
                title = target.split('"')[1] if target.startswith('"') else target.split(":")[0]
                if title not in sections:
                    bad.append(f"{path.relative_to(ROOT)}: {title!r}")
    assert not bad, f"pointers to missing parts of docs/chapter.md (sections: {sorted(sections)}):\n" + "\n".join(bad)
