"""Compaction: a long history becomes a summary plus the newest turns.

The history (compaction items already replayed) is split in three: system and developer
messages are kept as they are; the newest complete turns that fit in `keep_tokens`, and
always the last user message, are preserved; everything before them is summarised by
one ordinary, non-streaming generation (through the scheduler, or in the slot of the
response being compacted). The result is one `Compaction` item, which stands in for the
whole history when it is sent back.

A cut is only ever made before a user turn or after a completed tool-call group, so a
function call is never separated from its output. Compaction that cannot help is
refused (`ContextLengthExceeded`) and changes nothing: `context_management` has to
shrink its prompt, so there it is a 400 (or a failed job). `/responses/compact` only
asks for the history in its shortest form, so a history with nothing to summarise, or
whose summary would not shorten it, is its own answer, as it is; only a transcript
beyond the context window is a 400 there.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mlxcel.errors import ContextLengthExceeded, GenerationFailed
from mlxcel.generation import (
    GenerateText,
    GenerationRequest,
    PromptCodec,
    Sampling,
    ServedModel,
)
from mlxcel.items import (
    Compaction,
    FunctionCall,
    FunctionCallOutput,
    InputText,
    Item,
    Message,
    Reasoning,
    RequestEcho,
    ResponseRecord,
    Usage,
    new_id,
    replay,
)
from mlxcel.prepare.chat_messages import to_chat
from mlxcel.prepare.limits import item_chars
from mlxcel.prepare.offload import off_loop

DEFAULT_SUMMARY_TOKENS = 1024
KEEP_TOKENS_CAP = 8192

SUMMARY_INSTRUCTIONS = (
    "You compact a conversation so that it can go on without its full history. Write "
    "notes for the assistant that will continue it. Keep: the user's goals and "
    "requirements; decisions made and why; names, identifiers, numbers, file paths, "
    "commands and code that later turns may need; what tools returned; open questions "
    "and the next steps. Be concise and write no preamble."
)


@dataclass(frozen=True, slots=True)
class Split:
    kept: tuple[Item, ...]
    """System and developer messages, kept as they are."""
    summarised: tuple[Item, ...]
    preserved: tuple[Item, ...]


Plan = tuple[Split, list[int], int]
"""A compaction worked out but not generated: the split, the summary prompt, its budget."""


@dataclass(frozen=True, slots=True)
class Compacted:
    item: Compaction
    kept: tuple[Item, ...]
    usage: Usage
    """The summary generation's tokens."""


def default_keep_tokens(context_length: int) -> int:
    return max(1, min(context_length // 16, KEEP_TOKENS_CAP))


def cut_points(items: Sequence[Item]) -> list[int]:
    """Where `items` may be cut: before a user turn, or after a completed tool-call group."""
    points: list[int] = []
    open_calls: set[str] = set()
    for index, item in enumerate(items):
        user_turn = isinstance(item, Message) and item.role == "user"
        after_group = index > 0 and isinstance(items[index - 1], FunctionCallOutput)
        if (
            not open_calls
            and not isinstance(item, FunctionCallOutput)
            and (user_turn or after_group)
        ):
            points.append(index)
        if isinstance(item, FunctionCall):
            open_calls.add(item.call_id)
        elif isinstance(item, FunctionCallOutput):
            open_calls.discard(item.call_id)
    return points


def _is_system(item: Item) -> bool:
    return isinstance(item, Message) and item.role in ("system", "developer")


def _cuts(turns: Sequence[Item]) -> list[int]:
    """The cut points of `turns` (no system messages) up to its last user message."""
    users = [k for k, i in enumerate(turns) if isinstance(i, Message) and i.role == "user"]
    return [p for p in cut_points(turns) if users and p <= users[-1]]


def summarisable(items: Sequence[Item]) -> bool:
    """Whether the history (compactions replayed) has a complete turn before its last
    user message: the least a compaction can summarise."""
    cuts = _cuts([i for i in replay(items) if not _is_system(i)])
    return bool(cuts) and cuts[-1] > 0


def split(
    items: Sequence[Item], keep_tokens: int, count: Callable[[Sequence[Item]], float]
) -> Split:
    """Keep system messages, preserve the newest turns that fit, summarise the rest.

    `count` gives the tokens of a run of turns; it is asked once per turn and the runs
    are summed, so splitting costs one pass over the history."""
    kept = tuple(i for i in items if _is_system(i))
    turns = [i for i in items if not _is_system(i)]
    points = _cuts(turns)
    if not points or points[-1] == 0:
        raise ContextLengthExceeded(
            "Nothing to compact: the history has no complete turn before its last user message."
        )
    costs = [count(turns[k : k + 1]) for k in range(len(turns))]
    from_here = list(itertools.accumulate(reversed(costs)))[::-1]  # tokens of turns[k:]
    start = points[-1]  # the last user message is always preserved
    for point in reversed(points[:-1]):
        if from_here[point] > keep_tokens:
            break
        start = point
    if start == 0:
        start = next(p for p in points if p > 0)  # something must be summarised
    return Split(kept, tuple(turns[:start]), tuple(turns[start:]))


def transcript(items: Sequence[Item]) -> str:
    """The summarised turns as plain text for the summariser."""
    lines: list[str] = []
    for item in items:
        match item:
            case Message(role=role):
                lines.append(f"{role.capitalize()}: {item.text}")
            case FunctionCall(arguments=arguments):
                lines.append(f"Assistant called {item.flat_name}({arguments})")
            case FunctionCallOutput(call_id=call_id, output=output):
                lines.append(f"Tool result for {call_id}: {output}")
            case Reasoning() | Compaction():
                pass  # traces are not carried over; compactions were replayed before this
    return "\n\n".join(lines)


@dataclass(frozen=True, slots=True)
class Compactor:
    """Compacts histories by generating summaries (see `generate`)."""

    generate: GenerateText
    """Runs the summary: through the scheduler, or in the slot of the response it serves."""
    model: ServedModel
    tenant: str = ""
    """Whose history it summarises: the summary's prompt is cached as that tenant's."""

    def _rendered(self, items: Sequence[Item]) -> int:
        """Tokens of `items` rendered after a one-word user turn (so any items render)."""
        probe = Message("user", (InputText("."),))
        return len(self.model.codec.render(to_chat(None, [probe, *items]), None))

    def _split(self, items: Sequence[Item], keep: int) -> Split:
        """`split` with each turn's tokens estimated from one render of them all: its
        tokens shared out by characters (a budget needs no exact count, and rendering
        each candidate tail would cost a render per cut point)."""
        replayed = replay(items)
        turns = [i for i in replayed if not _is_system(i)]
        weight = sum(_weight(i) for i in turns)
        tokens = self._rendered(turns) - self._rendered(())
        per_char = max(tokens, 0) / max(weight, 1)
        return split(replayed, keep, lambda run: per_char * sum(_weight(i) for i in run))

    async def compact(
        self,
        items: Sequence[Item],
        *,
        instructions: str | None = None,
        keep_tokens: int | None = None,
        max_output_tokens: int | None = None,
        planned: Plan | None = None,
    ) -> Compacted:
        """One compaction item for `items`; ContextLengthExceeded when it cannot help.
        `planned` is `plan`'s answer for the same arguments, when the caller has it."""
        parts, prompt, max_tokens = planned or await self.plan(
            items,
            instructions=instructions,
            keep_tokens=keep_tokens,
            max_output_tokens=max_output_tokens,
        )
        summary, usage = await self._summarise(prompt, max_tokens)
        item = Compaction(summary, parts.preserved, id=new_id("cmp"))
        return Compacted(item, parts.kept, usage)

    async def plan(
        self,
        items: Sequence[Item],
        *,
        instructions: str | None = None,
        keep_tokens: int | None = None,
        max_output_tokens: int | None = None,
    ) -> Plan:
        """The split, the summary prompt and its token budget, without generating:
        ContextLengthExceeded here is what `compact` would refuse before any summary."""
        keep = keep_tokens or default_keep_tokens(self.model.info.context_length)
        parts = await off_loop(self._split, items, keep)
        prompt = await off_loop(self._summary_prompt, parts.summarised, instructions)
        max_tokens = max_output_tokens or DEFAULT_SUMMARY_TOKENS
        limit = self.model.info.context_length
        if len(prompt) + max_tokens > limit:
            raise ContextLengthExceeded(
                f"The history to summarise renders to {len(prompt)} tokens; with room for a "
                f"{max_tokens}-token summary it does not fit the {limit}-token context window."
            )
        return parts, prompt, max_tokens

    def _summary_prompt(self, items: Sequence[Item], instructions: str | None) -> list[int]:
        system = SUMMARY_INSTRUCTIONS
        if instructions:
            system += f"\n\nThe summary must also keep: {instructions}"
        messages: list[dict[str, object]] = [
            {"role": "system", "content": system},
            {
                "role": "user",
                "content": f"The conversation so far:\n\n{transcript(items)}\n\n"
                "Write the notes now.",
            },
        ]
        return self.model.codec.render(messages, None)

    async def _summarise(self, prompt: list[int], max_tokens: int) -> tuple[str, Usage]:
        record = ResponseRecord(
            id=new_id("resp"),
            created_at=int(time.time()),
            status="in_progress",
            echo=RequestEcho(model=self.model.names.alias, temperature=0.0),
            tenant=self.tenant,
            store=False,
        )
        sampling = Sampling(temperature=0.0, max_tokens=max_tokens)
        request = GenerationRequest(record=record, prompt=tuple(prompt), sampling=sampling)
        final = await self.generate(request)
        if final.status not in ("completed", "incomplete") or not final.output_text.strip():
            reason = final.error.message if final.error else "the model wrote no summary"
            raise GenerationFailed(f"Compaction failed: {reason}")
        return final.output_text.strip(), final.usage or Usage()


# Role markers and separators: a couple of tokens' worth of characters per item, so that
# short turns are not estimated at nothing.
MARKUP_CHARS = 8


def _weight(item: Item) -> int:
    return item_chars(item) + (0 if isinstance(item, Reasoning) else MARKUP_CHARS)


def rendered_tokens(codec: PromptCodec, items: Sequence[Item]) -> int:
    """Tokens of `items` rendered as they stand (for the before/after of a compaction)."""
    return len(codec.render(to_chat(None, items), None))


def check_reduction(before: int, after: int, limit: int) -> None:
    """A compaction must shorten the prompt, and leave room for output."""
    if after >= before:
        raise ContextLengthExceeded(
            f"Compaction does not shorten the history ({before} tokens before, {after} after)."
        )
    if after >= limit:
        raise ContextLengthExceeded(
            f"The compacted history is {after} tokens and does not fit the {limit}-token "
            "context window."
        )


@dataclass(frozen=True, slots=True)
class CompactionRequest:
    """A history checked and measured, ready to compact: what `/responses/compact` runs."""

    model: ServedModel
    items: tuple[Item, ...]
    """The whole history: the chain continued, then the input."""
    tokens_before: int
    instructions: str | None = None
    keep_tokens: int | None = None
    max_output_tokens: int | None = None
    tenant: str = ""

    async def run(self, generate: GenerateText) -> tuple[tuple[Item, ...], Usage]:
        """The compacted history (kept system messages, preserved turns, the compaction
        item) and the summary's usage. A history with nothing to summarise comes back as
        it is, with no usage; one whose summary would not shorten it comes back as it is
        too, with the usage of the summary it cost."""
        if not await off_loop(summarisable, self.items):
            return self.items, Usage()
        compacted = await Compactor(generate, self.model, self.tenant).compact(
            self.items,
            instructions=self.instructions,
            keep_tokens=self.keep_tokens,
            max_output_tokens=self.max_output_tokens,
        )
        output: tuple[Item, ...] = (*compacted.kept, *compacted.item.preserved, compacted.item)
        after = await off_loop(rendered_tokens, self.model.codec, output)
        if after >= self.tokens_before:
            return self.items, compacted.usage
        check_reduction(self.tokens_before, after, self.model.info.context_length)
        return output, compacted.usage
