"""Hugging Face repo ids: the rules huggingface_hub itself enforces, checked before renting.

From `huggingface_hub.utils.validate_repo_id` (v1.17.0, the version axolotl 0.18.0 pins):
"name" or "namespace/name"; letters, digits, '-', '_' and '.'; a part may not start or end
with '-' or '.'; the name is at most 96 characters; no "--" or ".."; no ".git" ending.
Only ASCII is accepted here (the Hub's own names are ASCII, `\\w` would let Unicode through).
"""

from __future__ import annotations

import re

_NAMESPACE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")
_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?")


def repo_id_problem(repo: str) -> str | None:
    """What is wrong with `repo` as a Hugging Face repo id, or None when it is valid."""
    parts = repo.split("/")
    if len(parts) > 2:
        return f"{repo!r} has more than one '/': a repo id is ORG/NAME (or NAME)"
    *namespace, name = parts
    if not (_NAME.fullmatch(name) and all(_NAMESPACE.fullmatch(p) for p in namespace)):
        return (f"{repo!r} is not a repo id: ORG/NAME of letters, digits, '-', '_' and '.', "
                "not starting or ending with '-' or '.', the name at most 96 characters")
    if "--" in repo or ".." in repo:
        return f"{repo!r} is not a repo id: '--' and '..' are not allowed"
    if repo.endswith(".git"):
        return f"{repo!r} is not a repo id: drop the '.git' ending"
    return None
