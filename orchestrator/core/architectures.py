"""Base-model shapes: the built-in table (data/models.yaml) and reading a config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any, NamedTuple

from providers.datacache import read_yaml

_DATA = Path(__file__).with_name("data") / "models.yaml"

# The fields every sizing needs; anything else is optional with a documented default.
REQUIRED_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)

# Modules a LoRA can target in a Llama/Qwen/Mistral-style decoder.
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class ArchitectureError(ValueError):
    """A base model that cannot be sized; the message says what is missing."""


@dataclass(frozen=True)
class Architecture:
    """The shape of a dense decoder-only transformer (Llama/Qwen/Mistral family).

    Parameter counts are cached on first use: the scheduler asks for them per offer group.
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    head_dim: int | None = None

    @cached_property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @cached_property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_size

    @cached_property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_size

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(d_in, d_out) of each linear layer in one decoder block."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @cached_property
    def layer_linear_params(self) -> int:
        """Weights of the linear layers of one block (what 4-bit quantization applies to)."""
        return sum(a * b for a, b in self.linear_shapes().values())

    @cached_property
    def layer_other_params(self) -> int:
        """Per-block parameters kept in bf16: two RMSNorms and the optional q/k/v biases."""
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        return 2 * self.hidden_size + bias

    @cached_property
    def embedding_params(self) -> int:
        """Input embedding plus LM head (counted once when tied)."""
        one = self.vocab_size * self.hidden_size
        return one if self.tie_word_embeddings else 2 * one

    @cached_property
    def linear_params(self) -> int:
        return self.num_hidden_layers * self.layer_linear_params

    @cached_property
    def params(self) -> int:
        """Total parameters, as the model card counts them."""
        blocks = self.num_hidden_layers * (self.layer_linear_params + self.layer_other_params)
        return blocks + self.embedding_params + self.hidden_size  # + final norm

    def lora_params(self, r: int, target: tuple[str, ...]) -> int:
        """Trainable LoRA parameters: r·(d_in + d_out) per adapted linear, every block."""
        shapes = self.linear_shapes()
        return self.num_hidden_layers * sum(r * sum(shapes[m]) for m in target)


class KnownModel(NamedTuple):
    repo: str
    architecture: Architecture
    published_params: int


@cache
def known_models() -> dict[str, KnownModel]:
    """Built-in table keyed by lower-cased repo id (aliases included)."""
    raw = read_yaml(_DATA)["models"]
    table: dict[str, KnownModel] = {}
    for repo, fields in raw.items():
        fields = dict(fields)
        aliases = fields.pop("aliases", [])
        published = fields.pop("params")
        arch = from_fields(fields, where=f"{_DATA.name}:{repo}")
        km = KnownModel(repo=repo, architecture=arch, published_params=published)
        for name in [repo, *aliases]:
            table[name.lower()] = km
    return table


def known_aliases() -> dict[str, list[str]]:
    """Each built-in repo id and its aliases, as the data file spells them."""
    raw = read_yaml(_DATA)["models"]
    return {repo: list(fields.get("aliases", [])) for repo, fields in raw.items()}


def lookup(repo: str) -> KnownModel:
    """The built-in shape of `repo`, or an error listing near matches."""
    table = known_models()
    hit = table.get(repo.lower())
    if hit is not None:
        return hit
    import difflib  # only when there is a typo to suggest a fix for (start-up)
    close = difflib.get_close_matches(repo.lower(), list(table), n=3, cutoff=0.6)
    hint = f" did you mean {', '.join(repr(table[c].repo) for c in close)}?" if close else ""
    raise ArchitectureError(
        f"unknown base model {repo!r};{hint} give its shape instead: "
        "{repo: ORG/NAME, config: path/to/config.json} or "
        "{repo: ORG/NAME, architecture: {hidden_size: .., num_hidden_layers: .., ...}}"
    )


# Bound on every size field of a config.json (the largest vocabularies are ~256K, hidden
# sizes ~16K): keeps the sizing arithmetic and the database's integers in range.
MAX_FIELD = 1 << 24


def from_fields(fields: dict[str, Any], where: str = "") -> Architecture:
    """Build an Architecture from config.json-style fields, naming missing ones.

    `where` (a file) prefixes the messages; inline fields in a job file leave it empty
    because the caller already names the file, line and field.
    """
    where = f"{where}: " if where else ""
    if fields.get("num_local_experts") or fields.get("num_experts"):
        raise ArchitectureError(
            f"{where}mixture-of-experts models are not supported by the sizing yet"
        )
    missing = [f for f in REQUIRED_FIELDS if fields.get(f) is None]
    if missing:
        raise ArchitectureError(f"{where}cannot size this model, missing {', '.join(missing)}")
    ints: dict[str, int] = {}
    for name in (*REQUIRED_FIELDS, "num_key_value_heads", "head_dim"):
        value = fields.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ArchitectureError(f"{where}{name} must be a positive integer (got {value!r})")
        if value > MAX_FIELD:
            raise ArchitectureError(f"{where}{name} must be <= {MAX_FIELD:,} (got {value:,}); "
                                    "no model is that large")
        ints[name] = value
    heads = ints["num_attention_heads"]
    kv = ints.get("num_key_value_heads", heads)
    if heads % kv:
        raise ArchitectureError(
            f"{where}num_attention_heads ({heads}) must be a multiple of "
            f"num_key_value_heads ({kv})"
        )
    if "head_dim" not in ints and ints["hidden_size"] % heads:
        raise ArchitectureError(
            f"{where}hidden_size must be divisible by num_attention_heads, or give head_dim"
        )
    # Qwen2 configs do not carry attention_bias, but the architecture has q/k/v biases.
    qkv_bias = bool(
        fields.get("qkv_bias", fields.get("attention_bias", fields.get("model_type") == "qwen2"))
    )
    return Architecture(
        hidden_size=ints["hidden_size"],
        num_hidden_layers=ints["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=ints["intermediate_size"],
        vocab_size=ints["vocab_size"],
        tie_word_embeddings=bool(fields.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        head_dim=ints.get("head_dim"),
    )


def from_config_json(path: Path) -> Architecture:
    """Read a Hugging Face config.json."""
    from orchestrator.core import userfiles

    try:
        fields = json.loads(userfiles.read_text(path, userfiles.MAX_CONFIG_BYTES,
                                                "config.json"))
    except FileNotFoundError:
        raise ArchitectureError(f"{path}: file not found") from None
    except userfiles.UserFileError as exc:
        raise ArchitectureError(f"{path}: {exc}") from None
    except RecursionError:
        raise ArchitectureError(f"{path}: JSON nested too deeply to be a config") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ArchitectureError(f"{path}: not a readable JSON config ({exc})") from None
    if not isinstance(fields, dict):
        raise ArchitectureError(f"{path}: expected a JSON object")
    # Multimodal configs nest the language model's shape.
    if "text_config" in fields and "hidden_size" not in fields:
        fields = fields["text_config"]
    return from_fields(fields, where=str(path))
