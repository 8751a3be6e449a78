"""`context_management`: a request compacted first when its rendered input reaches the
threshold or leaves no room for output."""

from __future__ import annotations

import dataclasses
import functools

from mlxcel.actors.scheduler import SchedulerHandle
from mlxcel.generation import CompactionReport, GenerationRequest, ModelInfo, PromptCodec
from mlxcel.items import Item
from mlxcel.prepare.compaction import (
    DEFAULT_SUMMARY_TOKENS,
    Compactor,
    check_reduction,
    default_keep_tokens,
)
from mlxcel.prepare.intake import ModelNames, build_request
from mlxcel.prepare.offload import off_loop
from mlxcel.prepare.params import ResponseParams


async def build_compacted(
    scheduler: SchedulerHandle,
    names: ModelNames,
    info: ModelInfo,
    codec: PromptCodec,
    params: ResponseParams,
    history: tuple[Item, ...],
    items: tuple[Item, ...],
    *,
    waits: bool = False,
) -> GenerationRequest:
    """The request to generate, its history compacted first when it must be (the summary
    runs through `scheduler`; `waits` lets it wait its turn as a background job does)."""
    build = functools.partial(build_request, params, names, info, codec, history, items)
    generation = await off_loop(build, fits=False)
    before = len(generation.prompt)
    threshold = params.compact_threshold or info.context_length
    if before < threshold and before < info.context_length:
        return generation
    compactor = Compactor(scheduler, codec, info, names.alias)
    # Preserved turns get at most half the threshold and the summary a quarter, so the
    # compacted prompt starts well below it.
    keep = min(default_keep_tokens(info.context_length), max(1, threshold // 2))
    summary = min(DEFAULT_SUMMARY_TOKENS, max(16, threshold // 4))
    compacted = await compactor.compact(
        history + items, keep_tokens=keep, max_output_tokens=summary, waits=waits
    )
    generation = await off_loop(build, compacted.item)
    check_reduction(before, len(generation.prompt), info.context_length)
    report = CompactionReport(compacted.item, before, len(generation.prompt))
    return dataclasses.replace(generation, compaction=report)
