"""The job supervisor: background responses (`background: true`).

Each admitted job is one task in the supervisor's nursery with its own cancel scope. It
waits its turn for a generation slot (status `queued`), generates through the same
scheduler path as a synchronous request (`in_progress`), and ends `completed`,
`incomplete`, `failed` or `cancelled`. Every status change is written to the store: an
unfinished job is pinned there (never evicted), its final object is stored like any
response (or, for `store: false`, kept pollable for the ephemeral TTL). Only the cancel
endpoint stops a job; no HTTP connection owns it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field

import trio

from mlxcel.actors.job_events import EventRecorder, FrameEncoder
from mlxcel.actors.messages import (
    CancelJob,
    EndJobs,
    HeldModel,
    JobAdmission,
    JobAdmitted,
    JobCommand,
    JobRefused,
    SubmitJob,
    answer,
)
from mlxcel.actors.response_stream import release
from mlxcel.actors.webhooks import WebhooksHandle
from mlxcel.errors import RateLimited, ShuttingDown, StoreUnavailable
from mlxcel.generation import GenerationRequest
from mlxcel.items import ResponseError, ResponseRecord, Usage, cancelled, failed
from mlxcel.metrics import Metrics
from mlxcel.respond.events import ResponseFinished, ResponseInProgress
from mlxcel.store import Delivery, JobOwner, StoreHandle
from mlxcel.store.codec import encoded_size
from mlxcel.store.replica import LEASE_LOST_MESSAGE, Membership

log = logging.getLogger(__name__)

SHUTDOWN_MESSAGE = "The server shut down before this response finished."


BYTES_PER_OUTPUT_TOKEN = 8
"""Rough JSON bytes one generated token adds to a final object (text plus escaping)."""


class JobsHandle:
    """What the HTTP edge holds of the job supervisor: admitting, cancelling and draining
    background jobs are commands on its inbox, so the jobs' state stays the supervisor's alone."""

    def __init__(self, inbox: trio.MemorySendChannel[JobCommand]) -> None:
        self._inbox = inbox

    async def submit(self, request: GenerationRequest, lease: HeldModel) -> ResponseRecord:
        """Admit a job that runs on the model `lease` holds: its `queued` record, or
        `RateLimited` (429). The job holds a share of the lease until it ends, so its
        model stays loaded for it. A request with a prelude (compaction) runs it in its
        slot like any other; if it fails, the job fails."""
        send, recv = trio.open_memory_channel[JobAdmission](1)
        held = lease.share()
        try:
            await self._inbox.send(SubmitJob(request, held, send))
        except BaseException:
            held.end()  # never reached the supervisor
            raise
        match await recv.receive():
            case JobAdmitted(record):
                return record
            case JobRefused(error):
                raise error

    async def cancel(self, response_id: str, *, tenant: str = "") -> ResponseRecord | None:
        """Cancel an active job of `tenant`; its final record once stored, or None if no
        such job is active (another tenant's is left running)."""
        send, recv = trio.open_memory_channel[ResponseRecord | None](1)
        await self._inbox.send(CancelJob(response_id, send, tenant))
        return await recv.receive()

    async def end_all(self) -> None:
        """End every active job `failed` (shutdown); returns once each end is stored."""
        send, recv = trio.open_memory_channel[None](1)
        await self._inbox.send(EndJobs(send))
        await recv.receive()


@dataclass
class _Job:
    request: GenerationRequest
    lease: HeldModel
    """Its share of its request's lease: its model stays loaded until the job ends."""
    bytes: int
    owner: JobOwner
    """Who the store says holds the job: this process, in the life it was admitted in."""
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    ended_by: str | None = None
    """Why it ends `failed` (a shutdown, a lost lease) when that, not a cancel, stopped it."""
    status: str = "queued"
    """Where the metrics count it: `queued`, `in_progress`, then how it ended."""
    waiters: list[trio.MemorySendChannel[ResponseRecord | None]] = field(default_factory=list)
    recorder: EventRecorder | None = None
    """Writes its event log, when the store keeps one."""
    fenced: bool = False
    """Its end was stored by another (it was reaped): not its to write."""
    delivery: Delivery | None = None
    """Its webhook announcement, kept in the store since admission; None without one."""


class JobSupervisor:
    """Runs each background response as a job of its own (one task and cancel scope each) that
    outlives the request that made it: admission within the job and byte bounds, the status
    written to the store as it moves, the event log for resumes, the webhook at its end."""

    def __init__(
        self,
        store: StoreHandle,
        *,
        max_jobs: int,
        max_bytes: int,
        metrics: Metrics | None = None,
        encode: FrameEncoder | None = None,
        webhooks: WebhooksHandle | None = None,
    ) -> None:
        """`encode` writes the frames of the jobs' event logs; None keeps no log."""
        self._encode = encode
        self._webhooks = webhooks
        self._store = store
        self._metrics = metrics or Metrics()
        self._max_jobs = max_jobs
        self._max_bytes = max_bytes
        self._jobs: dict[str, _Job] = {}
        self._active_bytes = 0
        self._drained: list[trio.MemorySendChannel[None]] = []  # answered when no job is left
        self._closed = False  # shutting down: no new job is admitted

    async def run(
        self, *, task_status: trio.TaskStatus[JobsHandle] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Admit, run and cancel jobs until cancelled.

        Resource handling: at most `max_jobs` jobs are active, and their approximate
        bytes (the queued object plus room for its output) stay within the response
        store's byte budget; admission never evicts stored responses. The inbox is
        unbuffered. Each job holds its share of its request's model lease until it
        ends, however it ends (a refused one gives it back at once), so its model is
        never unloaded under it and is unloaded once it is done. Stopping the supervisor
        cancels every job (a shutdown's drain ends them first); a job left unfinished in
        a durable store, by a crash, is ended `failed` when the store next opens.

        Error handling: a job's generation failure ends it `failed` (`server_error`); a
        final object larger than the whole store budget is replaced by a small `failed`
        one so polling gets an answer. Store writes at a job's end are shielded so a
        cancel cannot lose them; a store that cannot be written refuses new jobs (503)
        and leaves a running job's end to the next start.
        """
        send, recv = trio.open_memory_channel[JobCommand](0)
        async with trio.open_nursery() as nursery:
            followers = trio.CancelScope()
            if (membership := self._store.membership) is not None:
                nursery.start_soon(self._follow, membership, followers)
            task_status.started(JobsHandle(send))
            async with recv:
                async for command in recv:
                    match command:
                        case SubmitJob(request, lease, reply):
                            admission = await self._admit(request, lease, nursery)
                            if isinstance(admission, JobRefused):
                                lease.end()
                                await release(request)
                            reply.send_nowait(admission)
                        case CancelJob(response_id, reply, tenant):
                            self._cancel(response_id, reply, tenant)
                        case EndJobs(reply):
                            self._closed = True
                            self._drained.append(reply)
                            for job in self._jobs.values():
                                job.ended_by = SHUTDOWN_MESSAGE
                                job.scope.cancel()
                            self._answer_drained()
            followers.cancel()  # the inbox closed: running jobs end, nothing new comes

    async def _admit(
        self,
        request: GenerationRequest,
        lease: HeldModel,
        nursery: trio.Nursery,
    ) -> JobAdmission:
        queued = dataclasses.replace(request.record, status="queued", usage=Usage())
        size = encoded_size(queued) + BYTES_PER_OUTPUT_TOKEN * request.sampling.max_tokens
        if self._closed:
            return JobRefused(
                ShuttingDown(
                    "The server is shutting down; retry on another server.",
                    code="server_shutting_down",
                )
            )
        if len(self._jobs) >= self._max_jobs:
            return JobRefused(
                RateLimited(
                    f"Too many background responses are active ({self._max_jobs}); retry "
                    "after one of them ends.",
                    code="rate_limit_exceeded",
                )
            )
        if self._active_bytes + size > self._max_bytes:
            return JobRefused(
                RateLimited(
                    "The active background responses already fill the response store's "
                    "byte budget; retry after one of them ends.",
                    code="rate_limit_exceeded",
                )
            )
        # Kept before the job is: a job registered but never announced cannot be.
        delivery = await self._webhooks.watch(queued) if self._webhooks else None
        try:
            owner = await self._store.register_job(queued)
        except StoreUnavailable as exc:
            return JobRefused(exc)
        queued_request = dataclasses.replace(request, record=queued)
        job = _Job(queued_request, lease, size, owner, delivery=delivery)
        if self._encode is not None and self._store.events is not None:
            job.recorder = EventRecorder(self._store.events, self._encode, queued.id)
            await job.recorder.begin(queued)
        self._jobs[queued.id] = job
        self._active_bytes += size
        self._metrics.job_moved(None, job.status)
        nursery.start_soon(self._run_job, job)
        return JobAdmitted(queued)

    def _cancel(
        self,
        response_id: str,
        reply: trio.MemorySendChannel[ResponseRecord | None] | None,
        tenant: str | None = None,
    ) -> None:
        """Cancel the job (only if it is `tenant`'s, unless None: a cancel asked through
        the shared store, where the asking replica checked the tenant)."""
        job = self._jobs.get(response_id)
        if job is None or (tenant is not None and job.request.record.tenant != tenant):
            if reply is not None:
                answer(reply, None)
            return
        job.scope.cancel()
        if reply is not None:
            job.waiters.append(reply)  # answered once the cancelled object is stored

    # --- on a shared store: the lease and cancels asked on other replicas ------------

    async def _follow(self, membership: Membership, scope: trio.CancelScope) -> None:
        with scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._follow_lease, membership)
                nursery.start_soon(self._hear_cancels, membership)
                nursery.start_soon(self._recheck_cancels, membership)

    async def _follow_lease(self, membership: Membership) -> None:
        """Give up the jobs of each owner whose lease is lost: their ends would be
        fenced out, and the replicas that reap them store `failed` instead."""
        while True:
            owner = membership.owner
            await membership.lost(owner)
            for job in self._jobs.values():
                if job.owner == owner:
                    job.ended_by = LEASE_LOST_MESSAGE
                    job.scope.cancel()

    async def _hear_cancels(self, membership: Membership) -> None:
        """Stop the jobs other replicas are asked to cancel, as they are asked."""
        while True:
            try:
                async with membership.cancel_requests() as requests:
                    async for response_id in requests:
                        self._cancel(response_id, None)
            except StoreUnavailable:
                await trio.sleep(1)  # the flags are re-read every renewal meanwhile

    async def _recheck_cancels(self, membership: Membership) -> None:
        """Stop the jobs whose cancel flag is set (a message missed in an outage)."""
        while True:
            await trio.sleep(membership.lease_secs / 3)
            try:
                for response_id in await membership.cancels_asked():
                    self._cancel(response_id, None)
            except StoreUnavailable:
                pass

    async def _run_job(self, job: _Job) -> None:
        record_id = job.request.record.id
        final: ResponseRecord | None = None
        try:
            async with trio.open_nursery() as recording:  # outlives the job's own scope
                if job.recorder is not None:
                    recording.start_soon(job.recorder.run)
                try:
                    final = await self._outcome(job)
                finally:
                    if job.recorder is not None:
                        job.recorder.close()  # the recorder appends the rest, then returns
            with trio.CancelScope(shield=True):
                try:
                    final = await self._keep(final, job)
                except (StoreUnavailable, trio.ClosedResourceError):
                    # Still pinned in a durable store: its next start ends it `failed`.
                    log.warning("the end of background response %s was not stored", record_id)
                else:
                    if job.recorder is not None and not job.fenced:
                        await job.recorder.finish(final)  # the end as stored
                    if job.delivery is not None and self._webhooks is not None:
                        self._webhooks.ended(job.delivery, final)
        finally:
            job.lease.end()  # its model may be unloaded now
            del self._jobs[record_id]
            self._active_bytes -= job.bytes
            self._move(job, "failed" if final is None else final.status)
            for waiter in job.waiters:
                answer(waiter, final)
            self._answer_drained()

    async def _outcome(self, job: _Job) -> ResponseRecord:
        """Run the job: its final object, however it ended (not yet stored)."""
        final: ResponseRecord | None = None
        try:
            with job.scope:  # leaving it withdraws the job from the scheduler too
                final = await self._generate(job)
        except ShuttingDown:  # admitted just before the drain began
            final = self._failed(job, "server_error", SHUTDOWN_MESSAGE)
        except Exception:
            log.exception("background response %s failed", job.request.record.id)
            final = self._failed(job, "server_error", "The server had an error.")
        if final is None and job.ended_by is not None:
            return self._failed(job, "server_error", job.ended_by)
        return final if final is not None else self._cancelled(job)

    def _answer_drained(self) -> None:
        if not self._jobs:
            for reply in self._drained:
                answer(reply, None)
            self._drained.clear()

    async def _generate(self, job: _Job) -> ResponseRecord:
        """Run the job on its model's scheduler, recording `in_progress` when a slot
        takes it."""
        async with job.lease.stream(job.request, waits=True) as events:
            await events.submit()
            async for event in events:
                if job.recorder is not None:
                    await job.recorder.record(event)
                if isinstance(event, ResponseInProgress):
                    self._move(job, "in_progress")
                    started = dataclasses.replace(event.record, usage=Usage(), output=())
                    with contextlib.suppress(StoreUnavailable):  # its end is what counts
                        if not await self._store.update_job(started, job.owner):
                            job.ended_by = LEASE_LOST_MESSAGE  # reaped: no longer ours
                            job.scope.cancel()
                elif isinstance(event, ResponseFinished):
                    return event.record
        return self._failed(job, "server_error", "the generation worker stopped")

    def _move(self, job: _Job, status: str) -> None:
        if status != job.status:
            self._metrics.job_moved(job.status, status)
            job.status = status

    @staticmethod
    def _failed(job: _Job, code: str, message: str) -> ResponseRecord:
        record = job.request.record
        return failed(record, ResponseError(code, message), usage=Usage(), output=record.output)

    @staticmethod
    def _cancelled(job: _Job) -> ResponseRecord:
        return cancelled(job.request.record, usage=Usage())

    async def _keep(self, final: ResponseRecord, job: _Job) -> ResponseRecord:
        """Store the final object and unpin the job in one step: polling never misses the
        end. A job that is no longer ours (its end already stored by another) keeps
        what is stored (and its log is ended by a reader, with that)."""
        kept = await self._store.finish_job(final, job.owner)
        if kept is None:
            job.fenced = True
            log.warning(
                "background response %s was ended elsewhere; its end here is dropped", final.id
            )
            return final
        return kept
