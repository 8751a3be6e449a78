"""`context_management`: a request compacted first when its rendered input reaches the
threshold or leaves no room for output.

Compaction is a phase of the response's generation: preparation only decides that it is
needed (and, for a request that answers now, refuses what it cannot do as a 400), and
hands the scheduler a `Prelude` that its slot runs after `response.created`: the summary
is generated in that slot, under the response's one admission, then the compacted
request is built under the same id.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from mlxcel.generation import (
    CompactionReport,
    GenerateText,
    GenerationRequest,
    ServedModel,
)
from mlxcel.items import Item, ResponseRecord
from mlxcel.prepare.compaction import (
    DEFAULT_SUMMARY_TOKENS,
    Compactor,
    Plan,
    check_reduction,
    default_keep_tokens,
)
from mlxcel.prepare.intake import build_request
from mlxcel.prepare.offload import off_loop
from mlxcel.prepare.params import ResponseParams


async def build_managed(
    params: ResponseParams,
    model: ServedModel,
    history: tuple[Item, ...],
    items: tuple[Item, ...],
    *,
    check_now: bool = True,
) -> GenerationRequest:
    """The request to generate, with a compaction prelude when its input must shrink.

    With `check_now`, a compaction that cannot help is refused here (a 400 before any
    slot is taken); a background job leaves that to its prelude (the job then fails)."""
    build = functools.partial(build_request, params, model, history, items)
    generation = await off_loop(build, fits=False)
    before = len(generation.prompt)
    context_length = model.info.context_length
    threshold = params.compact_threshold or context_length
    if before < threshold and before < context_length:
        return generation
    identity = (generation.record.id, generation.record.created_at)
    compaction = CompactionPrelude(
        model,
        build,
        identity,
        history + items,
        before,
        threshold,
        tenant=params.tenant,
    )
    if check_now:  # worked out now, and kept for the slot
        keep, summary = compaction.budget()
        planned = await compaction.compactor(_never).plan(
            compaction.items, keep_tokens=keep, max_output_tokens=summary
        )
        compaction = dataclasses.replace(compaction, planned=planned)
    return dataclasses.replace(generation, prelude=compaction)


@dataclass(frozen=True, slots=True)
class CompactionPrelude:
    """The prelude: summarise in the slot, then build the compacted request."""

    model: ServedModel
    build: functools.partial[GenerationRequest]
    identity: tuple[str, int]
    """The response's id and creation time, which the compacted request keeps."""
    items: tuple[Item, ...]
    tokens_before: int
    threshold: int
    planned: Plan | None = None
    """The compaction already worked out (split and summary prompt), if it was."""
    tenant: str = ""
    """Whose request it compacts."""

    def compactor(self, generate: GenerateText) -> Compactor:
        return Compactor(generate, self.model, self.tenant)

    def budget(self) -> tuple[int, int]:
        """Tokens for the preserved turns and for the summary: at most half the threshold
        and a quarter of it, so the compacted prompt starts well below it."""
        context_length = self.model.info.context_length
        keep = min(default_keep_tokens(context_length), max(1, self.threshold // 2))
        return keep, min(DEFAULT_SUMMARY_TOKENS, max(16, self.threshold // 4))

    async def __call__(self, generate: GenerateText) -> GenerationRequest:
        keep, summary = self.budget()
        compacted = await self.compactor(generate).compact(
            self.items, keep_tokens=keep, max_output_tokens=summary, planned=self.planned
        )
        request = await off_loop(self.build, compacted.item, identity=self.identity)
        check_reduction(self.tokens_before, len(request.prompt), self.model.info.context_length)
        report = CompactionReport(compacted.item, self.tokens_before, len(request.prompt))
        return dataclasses.replace(request, compaction=report)


async def _never(request: GenerationRequest) -> ResponseRecord:
    raise AssertionError("planning a compaction generates nothing")
