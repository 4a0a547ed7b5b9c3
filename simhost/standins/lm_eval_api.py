"""lm-eval 0.4.11's `local-completions` model: the requests it builds and how it reads them.

What `lm_eval.models.api_models.TemplateAPI` and `openai_completions.LocalCompletionsAPI`
do at v0.4.11, for the settings orch passes in `model_args`:

- `tokenized_requests` (default True): prompts go to the server as token ids, encoded here
  with the tokenizer (`tokenizer=DIR`: the simulated tokenizer of standins/tokens.py) and
  left-truncated to `max_length` (default 2048; one token is kept for generation, so
  `max_length - 1`), a generation's context to that minus `max_gen_toks` (default 256).
  False: loglikelihood inputs are still encoded and truncated, then decoded back to text;
  a generation's context is sent as it is, unchecked ("Context + generation length is not
  checked"): api_models.py:171-173, 279-293, 551-572, 713-760.
- `add_bos_token` (default False): `tok_encode` adds the tokenizer's special tokens (BOS for
  a Llama tokenizer) only when set (api_models.py:397-425).
- A loglikelihood request is `echo=True, logprobs=1, max_tokens=1`; its score is the sum of
  `token_logprobs[ctxlen:-1]`, `ctxlen` being the context's length as encoded here
  (openai_completions.py:87-122). A server that adds BOS to a text prompt shifts that span
  by one token: the scored tokens are then not the continuation. Each loglikelihood request
  is recorded (`lm-eval-request` event) with the tokens it scored, so a test sees it.

Failures as the real one reports them: an HTTP error is logged with the server's text, and
after its retries the run ends with tenacity's RetryError.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from . import tokens
from .common import Host, SimError, container_to_host, say

TYPE_CHECKING = False  # see common.py: typing is not imported at run time
if TYPE_CHECKING:
    from typing import Any

MAX_LENGTH = 2048  # TemplateAPI's default max_length (api_models.py:126)
MAX_GEN_TOKS = 256  # its default max_gen_toks (api_models.py:123)


def _flag(value: str | None, default: bool) -> bool:
    # lm-eval's handle_arg_string: "true"/"false" in any case (utils.py:156-166).
    return default if value is None else value.lower() == "true"


class ApiModel:
    """One `local-completions` model: its settings and the server it asks."""

    def __init__(self, host: Host, margs: dict[str, str]) -> None:
        self.host = host
        self.model = margs.get("model") or ""
        self.base_url = margs.get("base_url") or ""
        tokenizer = margs.get("tokenizer", self.model)
        backend = margs.get("tokenizer_backend", "auto")
        if backend not in ("auto", "huggingface"):
            raise SimError(f"simhost: tokenizer_backend={backend} is not simulated "
                           "(huggingface and auto are)", 2)
        # `auto` asks the server for /tokenizer_info, which vLLM serves only with
        # --enable-tokenizer-info-endpoint: the Hugging Face tokenizer (`tokenizer=`) it is.
        self.tokenizer_bos = tokens.adds_bos(Path(container_to_host(tokenizer)))
        self.tokenized = _flag(margs.get("tokenized_requests"), True)
        self.add_bos = _flag(margs.get("add_bos_token"), False)
        self.max_length = int(margs.get("max_length") or MAX_LENGTH) - 1
        self.max_gen_toks = int(margs.get("max_gen_toks") or MAX_GEN_TOKS)
        self.task = ""

    def encode(self, text: str) -> list[int]:
        """`tok_encode`: special tokens only with add_bos_token."""
        return tokens.encode(text, self.add_bos and self.tokenizer_bos)

    def generate(self, context: str, until: list[str]) -> str:
        """A `generate_until` request for `context`; the text generated."""
        prompt: Any = context
        if self.tokenized:
            prompt = [self.encode(context)[-(self.max_length - self.max_gen_toks):]]
        out = self._post({"model": self.model, "prompt": prompt, "max_tokens":
                          self.max_gen_toks, "temperature": 0, "stop": until, "seed": 1234})
        return str(out["choices"][0]["text"])

    def loglikelihood(self, context: str, continuation: str) -> bool:
        """A loglikelihood request; whether the span it scores is the continuation."""
        spaces = len(context) - len(context.rstrip())  # TemplateLM._encode_pair
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole, ctx = self.encode(context + continuation), self.encode(context)
        cont = whole[len(ctx):]
        sent = (ctx + cont)[-self.max_length:]
        ctxlen = len(ctx) - max(0, len(ctx) + len(cont) - self.max_length)
        # Not tokenized: decoded back to text, special tokens as their names (batch_decode).
        prompt: Any = [sent] if self.tokenized else tokens.decode(sent)
        out = self._post({"model": self.model, "prompt": prompt, "temperature": 0,
                          "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True})
        seen = out["choices"][0]["logprobs"]["tokens"]
        scored = seen[ctxlen:-1]
        wanted = [tokens.piece(t) for t in cont]
        aligned = scored == wanted
        self.host.event("lm-eval-request", task=self.task, ctxlen=ctxlen, sent=len(seen) - 1,
                        scored=scored, continuation=wanted, aligned=aligned,
                        bos_first=seen[:1] == [tokens.SPECIAL[tokens.BOS]])
        return aligned

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        request = urllib.request.Request(self.base_url, data,
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                answer: dict[str, Any] = json.load(response)
                return answer
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            say(f"WARNING [api_models.py:519] API request failed! Status code: {exc.code}, "
                f"Response text: {text}. Retrying...", err=True)
            raise SimError(f"tenacity.RetryError: RetryError[<Future state=finished raised "
                           f"ClientResponseError>] ({self.base_url}: {exc.code}, "
                           f"message='{exc.reason}')", 1) from None
        except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
            raise SimError(f"tenacity.RetryError: RetryError[<Future state=finished raised "
                           f"{type(exc).__name__}>] ({self.base_url}: {exc})", 1) from None
