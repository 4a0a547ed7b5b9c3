"""Every relative link in README.md and docs/ resolves inside the repository (anchors
included), and every `orch` command shown in their code blocks names a real command and real
options, as `orch COMMAND -h` lists them (issue 25, item 19). Commands that can run on `sim`
with no argument to fill in run for real.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from functools import cache
from pathlib import Path

import orchfork
import pytest

ROOT = Path(__file__).resolve().parent.parent
ORCH = str(Path(sys.executable).parent / "orch")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"^#+ (.*)$", path.read_text(), flags=re.M)}


def links() -> list[tuple[Path, str]]:
    out = []
    for doc in DOCS:
        text = FENCE.sub("", doc.read_text())  # links in code blocks are code, not links
        out += [(doc, target) for target in LINK.findall(text)
                if not re.match(r"[a-z]+:", target)]
    return out


@pytest.mark.parametrize("doc,target", links(), ids=lambda v: str(v).replace(str(ROOT), ""))
def test_relative_link_resolves_inside_the_repository(doc: Path, target: str) -> None:
    path_part, _, anchor = target.partition("#")
    dest = (doc.parent / path_part).resolve() if path_part else doc
    assert dest.exists(), f"{doc.name}: {target} does not exist"
    assert dest.is_relative_to(ROOT), f"{doc.name}: {target} is outside the repository"
    if anchor and dest.suffix == ".md":
        assert anchor in anchors(dest), f"{doc.name}: no heading #{anchor} in {dest.name}"


def test_docs_do_not_point_outside_the_repository() -> None:
    # Prose citations too: `../shared/...` is not part of a checkout.
    for doc in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        assert "../shared/" not in doc.read_text(), doc.name


def shown_commands() -> list[tuple[Path, str]]:
    """Each `orch ...` command in a code block (a `|`-separated line gives several)."""
    out = []
    for doc in DOCS:
        for block in FENCE.findall(doc.read_text()):
            for line in block.splitlines():
                line = re.sub(r"\s#\s.*$", "", line).strip()  # a trailing comment
                for part in line.split(" | "):
                    part = part.strip()
                    found = re.search(r"(?:^|&& |\bbin/)(orch (?:[a-z-]+).*)$", part)
                    if found and not part.startswith("#"):
                        shown = found.group(1).split(" && ")[0].split(" >")[0]
                        out.append((doc, shown.rstrip("'\"")))  # inside `sh -c '...'`
    return out


@cache
def help_of(*words: str) -> str:
    proc = orchfork.run([*words, "-h"], timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, (words, proc.stderr)
    return proc.stdout


def words_and_options(command: str) -> tuple[list[str], list[str]]:
    """(`orch` and its command words, the options the line uses) of a documented line, its
    placeholders (`[--json]`, `ID`, `NAME`) read as option names or values."""
    tokens = shlex.split(command.replace("[", " ").replace("]", " ").replace("|", " "))
    words = [tokens[1]]
    if tokens[1] in ("servers", "schema", "warm") and len(tokens) > 2 \
            and not tokens[2].startswith("-"):
        words.append(tokens[2])
    options = [t.split("=")[0] for t in tokens if re.match(r"--?[a-z]", t)]
    return words, options


@pytest.mark.parametrize("doc,command", shown_commands(),
                         ids=lambda v: str(v).replace(str(ROOT), "")[:60])
def test_shown_command_names_real_options(doc: Path, command: str) -> None:
    words, options = words_and_options(command)
    if words[0].startswith("-"):  # `orch --version`, `orch --install-completion`
        assert words[0] in help_of(), command
        return
    assert re.search(rf"^  {re.escape(words[0])}\s", help_of(), re.M), \
        f"{doc.name}: `{command}`: no command {words[0]}"
    text = help_of(*words)
    for option in options:
        assert re.search(rf"(^|[ ,]){re.escape(option)}\b", text, re.M), \
            f"{doc.name}: `{command}`: {' '.join(words)} has no option {option}"


def test_commands_that_run_on_sim_run(tmp_path: Path) -> None:
    """The documented commands that need nothing filled in and no account, run for real."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    for command in ("orch plan examples/quickstart.yml", "orch models",
                    "orch schema job", "orch render examples/quickstart.yml --json",
                    "orch jobs", "orch sweeps", "orch servers list", "orch cost --by month",
                    "orch reconcile --dry-run"):
        assert any(c.startswith(command.split(" examples")[0]) for _, c in shown_commands()), \
            command
        proc = orchfork.run(shlex.split(command)[1:], env=env, cwd=ROOT, timeout=120)
        assert proc.returncode == 0, (command, proc.stderr)
