"""A deterministic scripted engine, for fast tests of everything above the model.

Prompts are rendered to one token per character (the tools, when there are any, lead
them as JSON); the reply to a prompt is scripted by the last user message: `echo: TEXT`
answers TEXT, anything else answers a fixed pangram. The engine keeps the last prompts it
was given (`prompts`), so tests can check what the model saw.
Each step yields one word per sequence: the first from the prefill phase that reads
the prompt's end, the others from decode phases. Asked for log-probabilities, each word
has -0.5 and its alternatives `alt1`, `alt2`, … one less each. `hold` and `release` (the
`gate`) let tests hold sequences in flight after their first word for as long as they
need; `step_delay` (seconds of real time per step) paces the steps; `prefill_chunk` makes
prefill take several steps, as the MLX engine's chunked prefill does. `phases` records
what each phase reported, in order, for tests of the model actor's delivery.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlxcel.generation import (
    CustomGrammar,
    FinishReason,
    ModelInfo,
    PrefillProgress,
    Sampling,
    SequenceSpec,
    TokenStep,
)
from mlxcel.items import TokenLogprob
from mlxcel.model.engine import LoadedModel
from mlxcel.model.grammar.constrained import compile_schema
from mlxcel.model.grammar.tool_grammars import check_quotable, validate

DEFAULT_REPLY = "The quick brown fox jumps over the lazy dog."
HELD_STEP_SECS = 0.005
"""How long a decode phase waits for a closed gate before it returns with nothing."""
_MARK = "\x00ASSISTANT\x00"


class FakeCodec:
    """One token per character; the rendered prompt keeps the last user message findable,
    and shows the tools and an assistant turn's calls as JSON."""

    def __init__(self, *, opens_reasoning: bool = False) -> None:
        self._opens_reasoning = opens_reasoning

    def opens_reasoning(self, template_kwargs: Mapping[str, Any] | None = None) -> bool:
        return self._opens_reasoning and (template_kwargs or {}).get("enable_thinking") is not False

    def render(
        self,
        messages: Sequence[dict[str, object]],
        tools: Sequence[dict[str, object]] | None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        text = f"\x01tools\x02{json.dumps(tools)}" if tools else ""
        text += "".join(
            f"\x01{m['role']}\x02{m.get('reasoning_content') or ''}{m.get('content') or ''}"
            + (f"\x03{json.dumps(m['tool_calls'])}" if m.get("tool_calls") else "")
            for m in messages
        )
        text += _MARK
        return [ord(c) for c in text]

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def compile_schema(self, schema: Mapping[str, Any]) -> str:
        """Validated like the real codec's (without a tokenizer); the fake ignores it."""
        return compile_schema(schema)

    def compile_call(self, schema: Mapping[str, Any], parser: str) -> str:
        """A bare JSON call (the fake has no call tokens); the fake ignores it."""
        return compile_schema(schema)

    def compile_custom_tools(
        self,
        custom: Sequence[CustomGrammar],
        others: Sequence[str],
        parser: str,
        *,
        call_schema: Mapping[str, Any] | None = None,
        required: bool = False,
    ) -> str | None:
        """Each grammar validated like the real codec's for a model that writes the Hermes
        form (without a tokenizer): valid alone, and one the rewrite for the call's JSON
        string carries; nothing to enforce (the fake has no call tokens)."""
        for tool in custom:
            validate(tool, None)
            if parser == "hermes":
                check_quotable(tool)
        return None


def scripted_reply(prompt: Sequence[int]) -> list[str]:
    """The words the fake model answers to a rendered prompt."""
    text = "".join(chr(t) for t in prompt)
    last_user = text.rsplit("\x01user\x02", 1)[-1].split("\x01", 1)[0].removesuffix(_MARK)
    reply = last_user[len("echo:") :].strip() if last_user.startswith("echo:") else DEFAULT_REPLY
    words = reply.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


@dataclass
class _Seq:
    spec: SequenceSpec
    words: list[str]
    prefill_left: int
    emitted: int = 0


def _open_gate() -> threading.Event:
    gate = threading.Event()
    gate.set()
    return gate


@dataclass
class FakeEngine:
    """A deterministic engine without weights: the same protocol as the MLX engine, scripted
    replies, steps that can be slowed, held or made to fail, so the actor machinery and
    the HTTP edge are tested fast and exactly."""

    step_delay: float = 0.0
    prefill_chunk: int = 10_000
    fail_on: str | None = None
    """Raise in `step` when a reply contains this word, to test engine failures."""
    fail_insert_on: str | None = None
    """Raise in `insert` when a reply contains this word, to test admission failures."""
    _seqs: dict[int, _Seq] = field(default_factory=dict)
    closed: bool = False
    steps: int = 0
    idled: int = 0
    prompts: deque[str] = field(default_factory=lambda: deque(maxlen=16))
    """The last prompts inserted, as text."""
    samplings: deque[Sampling] = field(default_factory=lambda: deque(maxlen=16))
    """How the last sequences inserted were to be sampled (their grammar too)."""
    phases: deque[tuple[str, tuple[int, ...]]] = field(default_factory=lambda: deque(maxlen=64))
    """The last phases run: ("decode" or "prefill", the sequences that got a token)."""
    gate: threading.Event = field(default_factory=_open_gate)
    """Decode phases run freely while it is set (at first). Cleared (`hold`), the held
    sequences stop after their first word (the prefill phase's) until it is set again
    (`release`): a decode phase waits up to `HELD_STEP_SECS` on it and advances only the
    others, so the model thread still admits, cancels and stops sequences between steps.
    An event, as the engine steps on the model thread and tests run on another."""
    hold_on: str | None = None
    """With the gate closed, only replies that have this word are held (all when None)."""
    held: int = 0
    """Decode phases that held a sequence back (the gate closed)."""

    def hold(self, on: str | None = None) -> None:
        """Hold sequences in flight after their first word until `release`: every one, or
        those whose reply has the word `on`."""
        self.hold_on = on
        self.gate.clear()

    def release(self) -> None:
        """Let the held sequences (and all later ones) run on."""
        self.gate.set()

    @property
    def last_prompt(self) -> str:
        """The text of the last prompt inserted ("" before any)."""
        return self.prompts[-1] if self.prompts else ""

    def insert(self, spec: SequenceSpec) -> None:
        self.prompts.append("".join(chr(t) for t in spec.prompt))
        self.samplings.append(spec.sampling)
        words = scripted_reply(spec.prompt)
        if self.fail_insert_on is not None and any(self.fail_insert_on in w for w in words):
            raise RuntimeError(f"scripted admission failure on {self.fail_insert_on!r}")
        self._seqs[spec.seq_id] = _Seq(spec, words, len(spec.prompt))

    def prefilling(self) -> list[PrefillProgress]:
        progress: list[PrefillProgress] = []
        for seq in self._seqs.values():
            total = len(seq.spec.prompt)
            if 0 < seq.prefill_left < total:
                progress.append(PrefillProgress(seq.spec.seq_id, total - seq.prefill_left, total))
        return progress

    def remove(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)

    def has_work(self) -> bool:
        return bool(self._seqs)

    def idle(self) -> None:
        self.idled += 1

    def spill_prompt_cache(self) -> int:
        return 0  # no prompt cache

    def close(self) -> None:
        self._seqs.clear()
        self.closed = True

    @property
    def active(self) -> int:
        return len(self._seqs)

    def decode(self) -> list[TokenStep]:
        self.steps += 1
        closed = not self.gate.wait(HELD_STEP_SECS)
        if self.step_delay:
            time.sleep(self.step_delay)
        decoding = [s for s in self._seqs.values() if s.prefill_left <= 0 and s.emitted > 0]
        held = {s.spec.seq_id for s in decoding if closed and self._holds(s)}
        self.held += bool(held)
        out = [self._next_word(s) for s in decoding if s.spec.seq_id not in held]
        self.phases.append(("decode", tuple(s.seq_id for s in out)))
        return out

    def prefill(self) -> list[TokenStep]:
        out: list[TokenStep] = []
        for seq in list(self._seqs.values()):
            if seq.emitted == 0:
                seq.prefill_left -= self.prefill_chunk
                if seq.prefill_left <= 0:
                    out.append(self._next_word(seq))
        self.phases.append(("prefill", tuple(s.seq_id for s in out)))
        return out

    def step(self) -> list[TokenStep]:
        """Both phases at once."""
        return [*self.decode(), *self.prefill()]

    def _holds(self, seq: _Seq) -> bool:
        return self.hold_on is None or self.hold_on in (w.strip() for w in seq.words)

    def _next_word(self, seq: _Seq) -> TokenStep:
        word = seq.words[seq.emitted]
        if self.fail_on is not None and self.fail_on in word:
            raise RuntimeError(f"scripted engine failure on {word!r}")
        seq.emitted += 1
        finish: FinishReason | None = None
        if seq.emitted >= seq.spec.sampling.max_tokens:
            finish = "length"
        elif seq.emitted >= len(seq.words):
            finish = "stop"
        logprob = _logprob(word, seq.spec.sampling) if seq.spec.sampling.logprobs else None
        if finish is not None:
            del self._seqs[seq.spec.seq_id]
        return TokenStep(seq.spec.seq_id, seq.emitted, word, finish, logprob)


def _logprob(word: str, sampling: Sampling) -> TokenLogprob:
    top = tuple((f"alt{i}", -0.5 - i) for i in range(1, sampling.top_logprobs))
    return TokenLogprob(word, -0.5, ((word, -0.5), *top) if sampling.top_logprobs else ())


def fake_factory(
    engine: FakeEngine | None = None, context_length: int = 4096, *, opens_reasoning: bool = False
) -> LoadedModel:
    """A LoadedModel around a fake engine (a new one unless given)."""
    return LoadedModel(
        engine=engine or FakeEngine(),
        codec=FakeCodec(opens_reasoning=opens_reasoning),
        info=ModelInfo(
            name="fake",
            path="fake",
            context_length=context_length,
            backend="fake",
            vocab_size=0x110000,  # one token per character
        ),
    )
