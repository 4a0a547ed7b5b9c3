"""A Hub dataset's size in tokens, from what the Hub publishes about it (pure; no I/O).

Two published sources, asked by `orchestrator/engine/hubdatasets.py`:

- the dataset card's metadata, `cardData.dataset_info` in the answer to `GET
  /api/datasets/{id}[/revision/{rev}]` (huggingface_hub 1.17.0 `HfApi.dataset_info`,
  hf_api.py:3300-3367; `DatasetInfo.card_data` keeps the README's YAML header as given,
  hf_api.py:1192-1195, repocard_data.py `DatasetCardData(**kwargs)`). The `datasets` library
  writes it on `push_to_hub`: one mapping, or a list of them with `config_name`, each with
  `splits: [{name, num_bytes, num_examples}]`; `num_bytes` is the split's Arrow size (the
  text plus a few bytes per value).
- the dataset viewer's `GET https://datasets-server.huggingface.co/size?dataset=ID`
  (https://huggingface.co/docs/dataset-viewer/size): `size.splits: [{config, split,
  num_rows, num_bytes_memory, num_bytes_parquet_files}]`, for datasets whose card has no
  `dataset_info` (tatsu-lab/alpaca's card has none: its README header is license, language,
  tags, pretty_name, task_categories).

Tokens are estimated as for a local file (`datafiles.CHARS_PER_TOKEN` characters per token,
plus the format's template tokens per row), with the bytes as the characters: an upper bound,
since the bytes count every column (alpaca's `text` column repeats the other three).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from orchestrator.core.datafiles import (
    ALPACA_TEMPLATE_TOKENS,
    CHARS_PER_TOKEN,
    CHAT_MESSAGE_TOKENS,
    DatasetSize,
)

# Template tokens per row: alpaca's prompt template; a chat row has at least two messages.
ROW_TEMPLATE_TOKENS = {"alpaca": ALPACA_TEMPLATE_TOKENS, "chat_template": 2 * CHAT_MESSAGE_TOKENS,
                       "completion": 0, "input_output": 0}
DEFAULT_CONFIG = "default"  # the datasets library's name for a dataset's only config


class HubDatasetRef(NamedTuple):
    """Which rows of which Hub dataset a job trains on."""

    repo: str
    revision: str = "main"
    subset: str | None = None
    split: str = "train"
    format: str = "alpaca"


class SplitSize(NamedTuple):
    """One split's published size."""

    config: str
    split: str
    rows: int
    bytes: int


class HubSizeError(ValueError):
    """The published information rules the job out: no such subset or split. `key` is the
    dataset path's field at fault (`subset`, `split`); the message says what to set."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


# The engine's lookup of a Hub dataset's size (None when the Hub publishes none or did not
# answer); `spec.resolve` takes one, so that `core` stays free of I/O.
HubSizer = Callable[[HubDatasetRef], DatasetSize | None]


class Recording:
    """A `HubSizer` that keeps the sizes it answered (`LoadedJob.hub_sizes`)."""

    def __init__(self, sizer: HubSizer) -> None:
        self.sizer = sizer
        self.sized: dict[HubDatasetRef, DatasetSize] = {}

    def __call__(self, ref: HubDatasetRef) -> DatasetSize | None:
        size = self.sizer(ref)
        if size is not None:
            self.sized[ref] = size
        return size


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def card_splits(card_data: Mapping[str, Any] | None) -> list[SplitSize]:
    """The splits `cardData.dataset_info` lists (empty when the card has none)."""
    info = (card_data or {}).get("dataset_info")
    configs = info if isinstance(info, list) else [info] if isinstance(info, dict) else []
    found = []
    for config in configs:
        if not isinstance(config, dict):
            continue
        name = str(config.get("config_name") or DEFAULT_CONFIG)
        for split in config.get("splits") or []:
            if not isinstance(split, dict):
                continue
            rows, size = _int(split.get("num_examples")), _int(split.get("num_bytes"))
            if rows is not None and size is not None and split.get("name"):
                found.append(SplitSize(name, str(split["name"]), rows, size))
    return found


def viewer_splits(size_answer: Mapping[str, Any] | None) -> list[SplitSize]:
    """The splits of a dataset viewer `/size` answer (empty when it has none)."""
    size = (size_answer or {}).get("size")
    splits = size.get("splits") if isinstance(size, dict) else None
    found = []
    for split in splits if isinstance(splits, list) else []:
        if not isinstance(split, dict):
            continue
        rows = _int(split.get("num_rows"))
        size_bytes = _int(split.get("num_bytes_memory"))
        if size_bytes is None:
            size_bytes = _int(split.get("num_bytes_parquet_files"))
        if rows is not None and size_bytes is not None and split.get("split"):
            found.append(SplitSize(str(split.get("config") or DEFAULT_CONFIG),
                                   str(split["split"]), rows, size_bytes))
    return found


def pick(splits: list[SplitSize], ref: HubDatasetRef) -> SplitSize | None:
    """The split `ref` trains on; None when `splits` is empty (nothing published);
    HubSizeError when the subset or split does not exist."""
    if not splits:
        return None
    configs = list(dict.fromkeys(s.config for s in splits))
    subset = ref.subset
    if subset is None:
        if len(configs) > 1 and DEFAULT_CONFIG not in configs:
            raise HubSizeError("subset", f"{ref.repo} has subsets {', '.join(configs)}; "
                                         "name the one to train on")
        subset = DEFAULT_CONFIG if DEFAULT_CONFIG in configs else configs[0]
    elif subset not in configs:
        raise HubSizeError("subset", f"{ref.repo} has no subset {subset!r} (it has "
                                     f"{', '.join(configs)})")
    names = [s.split for s in splits if s.config == subset]
    for split in splits:
        if split.config == subset and split.split == ref.split:
            return split
    of = "" if ref.subset is None else f" ({subset})"
    raise HubSizeError("split", f"{ref.repo}{of} has no split {ref.split!r} (it has "
                                f"{', '.join(names)})")


def megabytes(n: int) -> str:
    """Bytes as decimal megabytes: `44.4 MB`."""
    return f"{n / 1e6:.1f} MB"


def estimate(split: SplitSize, ref: HubDatasetRef, source: str) -> DatasetSize:
    """Tokens in one epoch of `split`, with where the numbers came from."""
    tokens = round(split.bytes / CHARS_PER_TOKEN) + split.rows * ROW_TEMPLATE_TOKENS.get(
        ref.format, 0)
    subset = "" if split.config == DEFAULT_CONFIG else f" of subset {split.config}"
    return DatasetSize(max(1, tokens), split.rows,
                       f"{source}: {split.rows:,} rows, {megabytes(split.bytes)} in split "
                       f"{split.split}{subset} of {ref.repo}")


def from_card(card_data: Mapping[str, Any] | None, ref: HubDatasetRef) -> DatasetSize | None:
    """The estimate from the card's `dataset_info` (None when the card lists no splits)."""
    split = pick(card_splits(card_data), ref)
    return None if split is None else estimate(split, ref, "Hub dataset info")


def from_viewer(size_answer: Mapping[str, Any] | None,
                ref: HubDatasetRef) -> DatasetSize | None:
    """The estimate from the dataset viewer's `/size` (None when it lists no splits)."""
    split = pick(viewer_splits(size_answer), ref)
    return None if split is None else estimate(split, ref, "Hub dataset viewer")
