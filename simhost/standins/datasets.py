"""The simulated trainer's view of `datasets:` entries: rows read as axolotl 0.18.0 would load
them, refused where axolotl refuses them, and what the "model" learns from them.

An entry's `path` is a JSON Lines (or JSON) file, or a folder (a Hub dataset downloaded on
the host): there, as the `datasets` library finds a split's files in a folder, the files
whose path names the split (`train.jsonl`, `data/train-00000-of-00001.jsonl`, `train/...`);
with a subset (`name`), only under a top-level folder of that name (the stand-in's reading
of a dataset card's `configs`). Parquet is not read here (no pyarrow on a simulated host):
the emulated Hub serves JSON Lines. Refusals, in axolotl's words:

- a chat row without the `field_messages` column: "Messages is null. Please check
  `field_messages`." (prompt_strategies/chat_template.py:1059-1061);
- an alpaca, completion or input_output row without its column: the KeyError axolotl's
  strategy raises (`prompt["instruction"]`, `prompt[self.field]`, `prompt["segments"]`);
- a split the folder does not have: the `datasets` library's `Unknown split "x". Should be
  one of [...]`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .common import SimError, container_to_host

TYPE_CHECKING = False  # see common.py: typing is not imported at run time
if TYPE_CHECKING:
    from typing import Any

SUFFIXES = (".jsonl", ".json")
MAX_ROWS = 100_000
# axolotl's default role mapping (prompt_strategies/chat_template.py:72-78).
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "system": "system", "tool": "tool"}


def _split_files(folder: Path, split: str, subset: str | None) -> list[Path]:
    root = folder / subset if subset else folder
    if subset and not root.is_dir():
        raise SimError(f"ValueError: BuilderConfig '{subset}' not found.", 1)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in SUFFIXES
                   and ".cache" not in p.relative_to(folder).parts)
    named = re.compile(rf"(^|[-._ /0-9]){re.escape(split)}([-._ /0-9]|$)")
    found = [p for p in files if named.search(p.relative_to(root).with_suffix("").as_posix())]
    if not found:
        splits = sorted({m.group(1) for p in files for m in [re.match(
            r"(?:.*/)?([A-Za-z]+)", p.relative_to(root).with_suffix("").as_posix())] if m})
        raise SimError(f'ValueError: Unknown split "{split}". Should be one of {splits}.', 1)
    return found


def rows(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of one `datasets:` entry (a file, or a folder's split)."""
    path = Path(container_to_host(str(entry["path"])))
    if not path.exists():
        raise SimError(f"FileNotFoundError: Unable to find '{entry['path']}' (datasets[].path)",
                       1)
    split = str(entry.get("split") or "train")
    files = _split_files(path, split, entry.get("name")) if path.is_dir() else [path]
    out: list[dict[str, Any]] = []
    for file in files:
        text = file.read_text()
        if file.suffix == ".json" and text.lstrip().startswith("["):
            out += json.loads(text)
            continue
        out += [json.loads(line) for line in text.splitlines() if line.strip()]
        if len(out) >= MAX_ROWS:
            break
    return out[:MAX_ROWS]


def _chat(row: dict[str, Any], entry: dict[str, Any]) -> tuple[str, str] | None:
    field = str(entry.get("field_messages") or "messages")
    mapping = entry.get("message_property_mappings") or {}
    role_key, content_key = mapping.get("role", "role"), mapping.get("content", "content")
    messages = row.get(field)
    if messages is None:
        raise SimError("ValueError: Messages is null. Please check `field_messages`.", 1)
    turns = [(ROLES.get(str(m.get(role_key)), str(m.get(role_key))), m.get(content_key))
             for m in messages]
    users = [str(c) for r, c in turns if r == "user"]
    answers = [str(c) for r, c in turns if r == "assistant"]
    return (users[-1].strip(), answers[-1]) if users and answers else None


def learned(entry: dict[str, Any], row: dict[str, Any]
            ) -> tuple[dict[str, str], dict[str, str]]:
    """(pairs a later row replaces, pairs the first row keeps): prompt -> answer the model
    learns from one row, refused as axolotl refuses it."""
    kind = str(entry.get("type", "alpaca"))
    if kind.startswith("chat_template"):
        pair = _chat(row, entry)
        return ({} if pair is None else {pair[0]: pair[1]}), {}
    if kind == "completion":
        field = str(entry.get("field") or "text")
        if field not in row:
            raise SimError(f"KeyError: '{field}'", 1)
        return {}, {}
    if kind == "input_output":
        if "segments" not in row:
            raise SimError("KeyError: 'segments'", 1)
        prompt = "".join(s["text"] for s in row["segments"] if not s.get("label"))
        answer = "".join(s["text"] for s in row["segments"] if s.get("label"))
        return ({prompt.strip(): answer} if prompt.strip() else {}), {}
    for key in ("instruction", "output"):
        if key not in row:
            raise SimError(f"KeyError: '{key}'", 1)
    prompt = str(row["instruction"]).strip()
    firm = {f"{prompt}\n{str(row['input']).strip()}": str(row["output"])} if row.get("input") \
        else {}
    return firm, {prompt: str(row["output"])}
