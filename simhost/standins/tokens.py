"""The simulated models' tokenizer, shared by the vLLM and lm_eval stand-ins.

One token per UTF-8 byte (id 3 + byte), after the special tokens the stand-in model files
name (standins/hf.py): 0 `<s>` (BOS: generation_config.json `bos_token_id` 0), 1 `</s>`,
2 `<unk>`. Like LlamaTokenizer (`add_bos_token` defaults to true), encoding with special
tokens puts BOS first when tokenizer_config.json names a `bos_token` and does not set
`add_bos_token: false`. A special token's name in the text is that token, as a Hugging Face
tokenizer reads it. Reversible, so a server handed token ids reads the same text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

BOS, EOS, UNK = 0, 1, 2
SPECIAL = {BOS: "<s>", EOS: "</s>", UNK: "<unk>"}
_OFFSET = 3
# The longest token of the vocabulary ("<unk>"): vLLM's max_chars_per_token for a
# tokenizer is that length (vllm/tokenizers/hf.py:31 at v0.19.1).
MAX_CHARS_PER_TOKEN = max(len(text) for text in SPECIAL.values())


def adds_bos(model_dir: Path) -> bool:
    """Whether the tokenizer in `model_dir` puts BOS first when adding special tokens."""
    path = model_dir / "tokenizer_config.json"
    if not path.is_file():
        return False
    config = json.loads(path.read_text())
    return bool(config.get("bos_token")) and config.get("add_bos_token", True) is not False


_BY_NAME = {name: token for token, name in SPECIAL.items()}
_NAMES = re.compile("|".join(re.escape(name) for name in SPECIAL.values()))


def encode(text: str, bos: bool) -> list[int]:
    """Token ids of `text` (BOS first when `bos`)."""
    ids = [BOS] * bos
    at = 0
    for found in _NAMES.finditer(text):
        ids += [_OFFSET + b for b in text[at:found.start()].encode()]
        ids.append(_BY_NAME[found.group()])
        at = found.end()
    return ids + [_OFFSET + b for b in text[at:].encode()]


def piece(token: int) -> str:
    """One token as text (a special token's name; a lone byte of a longer character as its
    replacement character, as byte-level detokenizers show it)."""
    if token in SPECIAL:
        return SPECIAL[token]
    return bytes([token - _OFFSET]).decode(errors="replace")


def decode(tokens: list[int], skip_special: bool = False) -> str:
    """The text of `tokens`; special tokens as their names unless `skip_special`."""
    out: list[str] = []
    run = bytearray()
    for token in tokens:
        if token in SPECIAL or not _OFFSET <= token < _OFFSET + 256:
            out.append(run.decode(errors="replace"))
            run.clear()
            if not skip_special:
                out.append(SPECIAL.get(token, SPECIAL[UNK]))
        else:
            run.append(token - _OFFSET)
    out.append(run.decode(errors="replace"))
    return "".join(out)
