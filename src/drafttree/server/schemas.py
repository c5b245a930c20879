"""Request schemas of the OpenAI-compatible routes (pydantic): types, ranges and defaults in one place, also
published at ``/docs``. Unknown fields are accepted and ignored, as OpenAI-compatible servers do; known ones that would
change the output are refused unless at their no-op value (``NO_OPS``)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from drafttree.server.requests import parse_prompt

DEFAULT_MAX_TOKENS = 256
MAX_N = 16  # completions per request
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; send "temperature": 0 for greedy (token-identical) decoding
GREEDY_BELOW = 1e-5  # temperatures under this are greedy decoding, as vLLM reads them (the library refuses < 1e-6)
MAX_STOPS = 16


# OpenAI (and vLLM) fields that would change what is generated, with their no-op values: accepted at those (clients
# send them by default), refused otherwise
NO_OPS = {"best_of": 1}
# vLLM's structured_outputs keys (and its older guided_* fields) -> the library's structured-output arguments
STRUCTURED_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}
STRUCTURED_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                     "guided_grammar")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: bool | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None


class GenerationParams(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)
    model: str | None = None
    max_tokens: int | None = Field(None, gt=0, description=f"new tokens at most (default {DEFAULT_MAX_TOKENS})")
    max_completion_tokens: int | None = Field(None, gt=0, description="same as max_tokens (newer OpenAI name)")
    temperature: float | None = Field(None, ge=0, description="0 (or under 1e-5) = greedy: exactly the target's tokens")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, description="0 or -1 (vLLM's 'off') = off")
    n: int | None = Field(None, ge=1, le=MAX_N, description=f"completions of the prompt (up to {MAX_N}; each its own "
                                                             "row of the batch; with a seed, choice i samples with "
                                                             "seed + i); streaming takes n = 1")
    seed: int | None = Field(None, description="fixes each position's sample: the text of plain sampling with "
                                                 "this seed, whatever else the server is serving (up to bf16 "
                                                 "near-ties)")
    stop: Any = Field(None, description="a string or up to 16 strings that end the completion")
    stream: bool | None = Field(None, description="Server-Sent Events, one event per target forward")
    stream_options: StreamOptions | None = Field(None, description="with stream: include_usage adds a last chunk "
                                                                     "with the usage (and usage: null on the others)")
    method: str | None = Field(None, description="drafting method (GET /v1/drafttree/methods); default: the server's")
    echo: Any = None
    suffix: Any = None
    # OpenAI fields that would change what is generated: accepted at their no-op values (clients send them by default),
    # refused otherwise, never silently ignored: the server samples the target's own distribution
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="minus this times the token's count in "
                                            "the output so far (OpenAI's definition)")
    presence_penalty: float | None = Field(None, ge=-2, le=2, description="minus this once the token is in the output")
    repetition_penalty: float | None = Field(None, gt=0, description="vLLM's: divides positive logits "
                                             "(multiplies negative ones) of tokens in the prompt or the output")
    logit_bias: dict[str, float] | None = Field(None, description="token id -> bias in [-100, 100] added to its logit")
    response_format: Any = Field(None, description="OpenAI's: {'type': 'json_object'} (any JSON object) or {'type': "
                                 "'json_schema', 'json_schema': {'schema': {...}}}: the text follows it, each token "
                                 "the target's own choice among those allowed")
    structured_outputs: Any = Field(None, description="vLLM's: one of {'json': schema}, {'regex': ...}, {'choice': "
                                    "[...]}, {'grammar': Lark or GBNF}, {'json_object': true}")
    guided_json: Any = Field(None, description="vLLM's older name for structured_outputs.json")
    guided_regex: Any = Field(None, description="vLLM's older name for structured_outputs.regex")
    guided_choice: Any = Field(None, description="vLLM's older name for structured_outputs.choice")
    guided_grammar: Any = Field(None, description="vLLM's older name for structured_outputs.grammar")
    tools: Any = Field(None, description="OpenAI's function tools; with tool_choice 'required' or a named function the "
                       "answer is tool_calls, decoded under a schema of the tools' parameters; with 'auto' (the "
                       "default) the model's own calls, read by the server's --tool-call-parser")
    tool_choice: Any = Field(None, validate_default=True, description="'none', 'auto', 'required' or {'type': "
                             "'function', 'function': {'name': ...}} ('auto' needs the server's --tool-call-parser)")
    best_of: Any = None
    min_p: float | None = Field(None, ge=0, le=1, description="vLLM's: drop tokens less likely than min_p times the "
                                "likeliest")
    min_tokens: int | None = Field(None, ge=0, description="vLLM's: the end tokens are banned until this many are out")
    ignore_eos: bool | None = Field(None, description="the model's end-of-sequence token does not end the completion "
                                    "(it runs to max_tokens, as benchmark clients ask)")
    stop_token_ids: list[int] | None = Field(None, max_length=1024, description="token ids that end the "
                                             "completion (counted; their text kept with include_stop_str_in_output)")
    include_stop_str_in_output: bool | None = Field(None, description="the text ends after the stop string found, "
                                                    "not before it")
    skip_special_tokens: bool | None = Field(None, description="vLLM's: special tokens have no text (default true; "
                                             "false with tool_choice 'auto' and a tool-call parser, which reads them)")

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, v):
        if v is None:
            return []
        v = [v] if isinstance(v, str) else v
        if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
            raise ValueError("must be a non-empty string or a list of non-empty strings")
        if len(v) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings")
        return v

    @field_validator("echo", "suffix", mode="before")
    @classmethod
    def _unsupported(cls, v):
        if v:
            raise ValueError("is not supported by this server")
        return v

    @field_validator(*NO_OPS, mode="before")
    @classmethod
    def _changes_output(cls, v, info):
        ok = NO_OPS[info.field_name]
        if v is None or (type(v) is type(ok) or (type(ok) is int and type(v) is float)) and v == ok:
            return v
        raise ValueError(f"only {json.dumps(ok)} is supported here: other values would change what the target "
                         "generates, and drafttree samples the target's own distribution exactly")

    @field_validator("response_format", mode="before")
    @classmethod
    def _response_format(cls, v):
        if v is None:
            return None
        if not isinstance(v, dict) or v.get("type") not in ("text", "json_object", "json_schema"):
            raise ValueError("must be {'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', "
                             "'json_schema': {'schema': {...}}}")
        if v["type"] == "text":
            return None
        if v["type"] == "json_object":
            return {"json_schema": True}
        spec = v.get("json_schema")
        if not isinstance(spec, dict):
            raise ValueError("json_schema must be an object with the schema under 'schema'")
        schema = spec.get("schema", True)  # OpenAI's schema is optional: without one, any JSON object
        if schema is not True and not isinstance(schema, dict):
            raise ValueError("json_schema.schema must be a JSON schema object")
        return {"json_schema": schema}

    @field_validator("structured_outputs", mode="before")
    @classmethod
    def _structured_outputs(cls, v):
        if v is None:
            return None
        if not isinstance(v, dict):
            raise ValueError("must be an object such as {'json': {...}}, {'regex': ...} or {'choice': [...]}")
        given = {k: x for k, x in v.items() if x is not None and x is not False}
        other = sorted(set(given) - set(STRUCTURED_KINDS) - {"json_object"})
        if other:
            raise ValueError(f"{other[0]!r} is not supported here; give one of json, regex, choice, grammar, "
                             "json_object")
        if len(given) != 1:
            raise ValueError("give exactly one of json, regex, choice, grammar, json_object")
        (k, x), = given.items()
        return {"json_schema": True} if k == "json_object" else {STRUCTURED_KINDS[k]: x}

    @model_validator(mode="after")
    def _one_structure(self):
        given = [f for f in STRUCTURED_FIELDS if getattr(self, f) is not None]
        if len(given) > 1:
            raise ValueError(f"give one structured-output field, not {' and '.join(given)}")
        return self

    @field_validator("tools", mode="before")
    @classmethod
    def _tools(cls, v):
        from drafttree.server.tools import check_tools

        return None if v is None or v == [] else check_tools(v)

    @field_validator("tool_choice", mode="after")
    @classmethod
    def _tool_choice(cls, v, info):
        from drafttree.server.tools import tool_mode

        if "tools" in info.data:  # (tools that failed their own check are reported there)
            tool_mode(info.data["tools"], v)  # ValueError: a 400 on tool_choice
        return v

    @model_validator(mode="after")
    def _tools_or_structure(self):
        mode = self.tools_mode()
        if mode is not None and not mode.auto and any(getattr(self, f) is not None for f in STRUCTURED_FIELDS):
            raise ValueError("give tools (with tool_choice 'required' or a function) or a structured output, not both")
        return self

    def tools_mode(self):
        """The schema the request's tools put on the answer (server/tools.py), or None."""
        from drafttree.server.tools import tool_mode

        return tool_mode(self.tools, self.tool_choice)

    def structured(self) -> tuple[str | None, dict]:
        """(the request field, the library's structured-output arguments); (None, {}) when there is none."""
        for f in STRUCTURED_FIELDS:
            v = getattr(self, f)
            if v is not None:
                return (f, v) if f in ("response_format", "structured_outputs") else (
                    f, {STRUCTURED_KINDS[f.removeprefix("guided_")]: v})
        return None, {}

    @model_validator(mode="after")
    def _options_need_stream(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")  # OpenAI's rule
        return self

    @model_validator(mode="after")
    def _min_tokens_fit(self):
        asked = self.max_completion_tokens or self.max_tokens
        if self.min_tokens is not None and asked is not None and self.min_tokens > asked:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({asked})")  # as vLLM
        return self

    @field_validator("seed", mode="after")
    @classmethod
    def _seed(cls, v):
        return None if v is None else v & (2**64 - 1)  # torch seeds are unsigned 64-bit

    def generation(self) -> dict:
        """Keyword arguments for a generation, defaults applied."""
        return {"max_new_tokens": self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS,
                "temperature": (DEFAULT_TEMPERATURE if self.temperature is None
                                else 0.0 if self.temperature < GREEDY_BELOW else self.temperature),
                "top_p": 1.0 if self.top_p is None else self.top_p, "top_k": max(0, self.top_k or 0),
                "stop": self.stop or [], "seed": self.seed, "logprobs": self.logprob_count(),
                "stop_token_ids": self.stop_token_ids or [], "ignore_eos": bool(self.ignore_eos),
                "include_stop": bool(self.include_stop_str_in_output), "min_p": self.min_p or 0.0,
                "skip_special": self.skip_special_tokens is not False,
                "presence_penalty": self.presence_penalty or 0.0, "frequency_penalty": self.frequency_penalty or 0.0,
                "repetition_penalty": 1.0 if self.repetition_penalty is None else self.repetition_penalty,
                "logit_bias": self.logit_bias or {}, "min_tokens": self.min_tokens or 0,
                "json_schema": None, "regex": None, "choice": None, "grammar": None, **self.structured()[1],
                **({"json_schema": mode.schema} if (mode := self.tools_mode()) is not None and not mode.auto else {})}

    def logprob_count(self) -> int | None:
        """Alternatives per token to report with each token's log-probability; None: no logprobs."""
        return None


class ChatRequest(GenerationParams):
    messages: list[Message] = Field(min_length=1)
    logprobs: bool | None = Field(None, description="each token's log-probability under the target (raw logits)")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="the likeliest alternatives per token "
                                                                     "(needs logprobs)")

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:  # OpenAI's rule
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(GenerationParams):
    prompt: list[str | list[int]] = Field(description="text, or a list of token ids (no chat template); or a list of "
                                                      "those: a batch, n choices per prompt, indexed prompt by prompt")
    logprobs: int | None = Field(None, ge=0, le=5, description="each token's log-probability under the target "
                                                                 "and this many likeliest alternatives")

    @field_validator("logprobs", mode="before")
    @classmethod
    def _false_is_off(cls, v):
        return None if v is False else v  # some clients send "logprobs": false for "none"

    def logprob_count(self) -> int | None:
        return self.logprobs

    @field_validator("tools", "tool_choice", mode="before")
    @classmethod
    def _no_tools(cls, v):
        if v not in (None, [], "none"):
            raise ValueError("tools are a chat completions feature (POST /v1/chat/completions)")
        return None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v):
        from drafttree.server.requests import RequestError

        try:
            return parse_prompt({"prompt": v})
        except RequestError as e:
            raise ValueError(e.message) from None
