"""Any OpenAI-compatible HTTP endpoint as a backend (a user's vLLM / SGLang server, a hosted model):
preferably through the completions API, so that the loop's chat template and token ids stay in charge.

Two modes:
- `tokens` (token-exact): the prompt is sent as token ids (`"prompt": [ids]`) and the reply comes back as
  token ids (`"return_tokens_as_token_ids": true`, tokens spelled `token_id:<id>`) with each token's
  log-prob (`"logprobs": 1`). vLLM's server supports both; the trajectory is exact.
- `text`: the prompt is decoded to text, the reply text is tokenized locally. Servers that take only text
  work, but the ids are a re-tokenization (token boundaries may differ from what the model sampled) and
  log-probs are kept only when the server's tokens line up one to one; the backend reports
  `token_exact = False` and the loop marks its trajectories so the trainer does not learn from them.

`OpenAIChatBackend` speaks the chat completions API instead (messages, `tools`, `tool_calls`), for hosted
models that offer nothing else; see `ChatBackend` and docs/agent.md.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import aiohttp

from cuda_agent.rollout.base import FinishReason, Generation, SamplingParams

Mode = Literal["tokens", "text"]
_TOKEN_PREFIX = "token_id:"


class EndpointError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"completions endpoint answered {status}: {message}")
        self.status = status


class _Endpoint:
    """One aiohttp session to an OpenAI-compatible server, with retries for overload and lost connections."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_connections: int = 512,
        retries: int = 2,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.retries = retries
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._max_connections = max_connections
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        # Created on first use, inside the event loop that uses it.
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                timeout=self._timeout,
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=self._max_connections),
            )
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def release(self, session: str) -> None:
        return None

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(self.retries + 1):
            try:
                async with self._session().post(self.base_url + path, json=body) as resp:
                    payload: dict[str, Any] = await resp.json(content_type=None)
                    if resp.status >= 400:
                        error = payload.get("error", payload) if isinstance(payload, dict) else payload
                        message = error.get("message", str(error)) if isinstance(error, dict) else str(error)
                        # Overload and gateway errors are worth a retry; a bad request is not.
                        if resp.status in (429, 502, 503, 504) and attempt < self.retries:
                            await asyncio.sleep(0.5 * 2**attempt)
                            continue
                        raise EndpointError(resp.status, message)
                    return payload
            except aiohttp.ClientConnectionError:
                if attempt >= self.retries:
                    raise
                await asyncio.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")


class OpenAICompatibleBackend(_Endpoint):
    """The completions API, token ids in and out (`tokens`) or text (`text`)."""

    def __init__(
        self, base_url: str, model: str, *, mode: Mode = "tokens", tokenizer: Any = None, **kwargs: Any
    ) -> None:
        if mode == "text" and tokenizer is None:
            raise ValueError("text mode needs the model's tokenizer (to decode prompts, encode replies)")
        super().__init__(base_url, model, **kwargs)
        self.mode = mode
        self.tokenizer = tokenizer
        self.token_exact = mode == "tokens"

    def _body(self, prompt_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": 1,
            "skip_special_tokens": False,
        }
        if sampling.top_k > 0:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        if self.mode == "tokens":
            body["prompt"] = prompt_ids
            body["return_tokens_as_token_ids"] = True
        else:
            body["prompt"] = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        return body

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session: str | None = None
    ) -> Generation:
        payload = await self._post("/v1/completions", self._body(prompt_ids, sampling))
        choice = payload["choices"][0]
        finish: FinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
        logprobs = choice.get("logprobs") or {}
        tokens: list[str] = logprobs.get("tokens") or []
        values: list[float | None] = logprobs.get("token_logprobs") or []
        if self.mode == "tokens":
            if not all(t.startswith(_TOKEN_PREFIX) for t in tokens) or len(values) != len(tokens):
                raise EndpointError(200, "the server did not return token ids (return_tokens_as_token_ids)")
            ids = [int(t.removeprefix(_TOKEN_PREFIX)) for t in tokens]
            return Generation(ids, [float(v or 0.0) for v in values], finish, text=choice.get("text"))
        text: str = choice.get("text", "")
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        aligned = len(values) == len(ids)
        lps = [float(v or 0.0) for v in values] if aligned else [0.0] * len(ids)
        return Generation(ids, lps, finish, text=text)


class OpenAIChatBackend(_Endpoint):
    """The chat completions API with `tools`, for hosted models that take only messages. The reply comes
    back as text and `tool_calls`; the loop keeps the conversation as messages and records a local
    re-tokenization, so trajectories are marked not token-exact (evaluation, not PPO)."""

    token_exact = False

    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], sampling: SamplingParams
    ) -> Generation:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "tools": tools,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        payload = await self._post("/v1/chat/completions", body)
        choice = payload["choices"][0]
        message = choice.get("message") or {}
        finish: FinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
        calls = message.get("tool_calls") or []
        return Generation([], [], finish, text=message.get("content") or "", tool_calls=list(calls))
