"""What the Docker stand-in knows about images: published axolotl tags and the image layout.

The tags and paths come from the product's own data file, playbooks/data/images.yaml (with
its source), so the simulated registry refuses exactly the tags orch refuses. Stand-ins are
stdlib only, so the file is read with a reader for its few flat blocks, not PyYAML.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "playbooks" / "data" / "images.yaml"
# The registry namespace whose tags are checked against the data file.
AXOLOTL_NAMESPACE = "axolotlai/"

_ENTRY = re.compile(r'^  "?([^":#\s]+)"?:\s*(.*?)\s*(?:#.*)?$')


@cache
def _blocks() -> dict[str, dict[str, str]]:
    """Top-level block name -> {key: raw value} for the two-space indented entries."""
    blocks: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in DATA.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            name, _, value = line.partition(":")
            current = blocks.setdefault(name.strip(), {}) if not value.strip() else None
            continue
        found = _ENTRY.match(line)
        if current is not None and found:
            current[found.group(1)] = found.group(2)
    return blocks


def repositories() -> dict[str, str]:
    """Host kind -> repository (axolotlai/axolotl, axolotlai/axolotl-cloud)."""
    return _blocks()["repositories"]


def published(image: str) -> bool:
    """Whether the registry has `image` (only axolotlai/ images are checked)."""
    repo, _, tag = image.removeprefix("docker.io/").rpartition(":")
    if not image.startswith(AXOLOTL_NAMESPACE) and not image.startswith("docker.io/axolotlai/"):
        return True
    return repo in repositories().values() and tag in _blocks()["tags"]


def vllm() -> dict[str, str]:
    """The pinned vLLM release: version, image, transformers5_from."""
    return _blocks()["vllm"]


def layout(key: str) -> str:
    """A path of the images' layout (workdir, venv, entrypoint, cloud_entrypoint, ...)."""
    return _blocks()["layout"][key]


def is_axolotl(image: str) -> bool:
    """Whether `image` is one of the axolotl trainer images."""
    repo = image.removeprefix("docker.io/").rpartition(":")[0]
    return repo in repositories().values()


def is_cloud(image: str) -> bool:
    """Whether `image` is the cloud variant (entrypoint starts sshd; CMD sleep infinity)."""
    return image.removeprefix("docker.io/").rpartition(":")[0] == repositories()["container"]


_TAG_FIELD = re.compile(r'(\w+):\s*"([^"]*)"')


def tag(image: str) -> dict[str, str]:
    """What images.yaml says of `image`'s tag (python, cuda, torch); {} when it is none of the
    published axolotl tags."""
    if not is_axolotl(image):
        return {}
    raw = _blocks()["tags"].get(image.rpartition(":")[2])
    return dict(_TAG_FIELD.findall(raw)) if raw else {}
