"""The published axolotl trainer images (playbooks/data/images.yaml) and which one runs where.

A full machine with Docker (a monthly server) runs `axolotlai/axolotl:<tag>` with
`docker run`; a container rental (Vast.ai, RunPod) has no Docker inside and is created from
`axolotlai/axolotl-cloud:<tag>`, so training runs natively in it. Both come from the same
build and share tags, layout and CUDA version (real-hosts.md §1). Pure: no I/O but reading
the data file once.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Literal, NamedTuple

from providers.datacache import read_yaml

HostKind = Literal["docker", "container"]
HOST_KINDS: tuple[HostKind, ...] = ("docker", "container")


class ImageLayout(NamedTuple):
    """Where things are inside the trainer images."""

    workdir: str
    venv: str
    uv: str
    cuda_env: str
    entrypoint: str
    cloud_entrypoint: str
    cloud_cmd: tuple[str, ...]
    cloud_env_file: str
    data_mount: str


class ImageTag(NamedTuple):
    """One published tag and what it needs from the host."""

    tag: str
    python: str
    cuda: str  # "13.0": the host driver must support at least this CUDA version
    torch: str


class Catalog(NamedTuple):
    """The data file, parsed."""

    version: str
    default_tag: str
    repositories: dict[str, str]  # host kind -> repository
    tags: dict[str, ImageTag]
    layout: ImageLayout
    vllm: dict[str, str]  # version, image, transformers5_from
    lm_eval: dict[str, str]  # version, api_requirement


@cache
def catalog() -> Catalog:
    """playbooks/data/images.yaml (read once)."""
    raw: dict[str, Any] = read_yaml(Path(__file__).parent / "data" / "images.yaml")
    tags = {str(t): ImageTag(str(t), str(v["python"]), str(v["cuda"]), str(v["torch"]))
            for t, v in raw["tags"].items()}
    lay = dict(raw["layout"])
    lay["cloud_cmd"] = tuple(lay["cloud_cmd"])
    return Catalog(str(raw["version"]), str(raw["default_tag"]),
                   {str(k): str(v) for k, v in raw["repositories"].items()}, tags,
                   ImageLayout(**lay), {str(k): str(v) for k, v in raw["vllm"].items()},
                   {str(k): str(v) for k, v in raw["lm_eval"].items()})


def layout() -> ImageLayout:
    """The trainer images' layout (paths, entrypoints)."""
    return catalog().layout


def repository(kind: HostKind) -> str:
    """The repository a host of `kind` runs: axolotlai/axolotl or axolotlai/axolotl-cloud."""
    return catalog().repositories[kind]


def vllm_image() -> str:
    """The pinned vLLM server image (reads what axolotl 0.18.0 / transformers 5 writes)."""
    return catalog().vllm["image"]


def vllm_version() -> str:
    """The pinned vLLM release, for a host that installs the wheel (a container rental)."""
    return catalog().vllm["version"]


def eval_context(sequence_len: int, tasks: bool) -> int:
    """The context vLLM serves the evaluation with (`--max-model-len`): the training
    `sequence_len` (what the eval set's prompts were trained at), and at least lm-eval's
    `max_length` when `tasks` run, which lm-eval then truncates its requests to."""
    if not tasks:
        return sequence_len
    return max(sequence_len, int(catalog().lm_eval["max_length"]))


def default_image(kind: HostKind = "docker") -> str:
    """The pinned trainer image for a host of `kind`."""
    return f"{repository(kind)}:{catalog().default_tag}"


def _split(image: str) -> tuple[str, str]:
    repo, colon, tag = image.rpartition(":")
    if not colon or "/" in tag:
        return image, ""
    return repo.removeprefix("docker.io/"), tag


def problem(image: str) -> str | None:
    """Why `image` is not a published trainer image, or None when it is one."""
    repo, tag = _split(image)
    cat = catalog()
    if repo in cat.repositories.values() and tag in cat.tags:
        return None
    known = ", ".join(f"{cat.repositories['docker']}:{t}" for t in cat.tags)
    if repo not in cat.repositories.values():
        return (f"{image!r} is not an axolotl trainer image orch knows; use one of: {known}")
    return (f"{image!r} was never published (unknown tag {tag!r}); use one of: {known} "
            f"(source: playbooks/data/images.yaml)")


def tag_info(image: str) -> ImageTag:
    """The published tag of `image`; ValueError (saying what is known) when there is none."""
    why = problem(image)
    if why is not None:
        raise ValueError(why)
    return catalog().tags[_split(image)[1]]


def for_host(image: str, kind: HostKind) -> str:
    """The same tag from the repository a host of `kind` runs (docker or container rental)."""
    return f"{repository(kind)}:{tag_info(image).tag}"


def min_cuda(image: str) -> str:
    """The lowest CUDA version (e.g. "13.0") the host driver must support to run `image`."""
    return tag_info(image).cuda


def cuda_tuple(version: str) -> tuple[int, ...]:
    """"13.0" -> (13, 0): CUDA versions compare numerically ("12.10" > "12.9")."""
    try:
        return tuple(int(part) for part in version.strip().split("."))
    except ValueError:
        raise ValueError(f"not a CUDA version: {version!r} (expected e.g. 13.0)") from None
