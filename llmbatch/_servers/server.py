"""One server, all the client knows and does about it: its URL, headers and
connection pool; what it is and serves (detected at open, again after an outage);
its signals; the controller and breaker that decide how much may be sent to it and
when; its seats in the scheduler (given when it is made); what it has refused
(the priority field, long lists, a too-long prompt); and its own snapshot
(``stats``).

This object is the one door to its controller: the dispatcher reports every
exchange here (what it sent, answers, failures, load headers, latencies, what was
refused), the health policy (``_runtime.health``) asks it to update its limit
(``control``), and its own probes feed it what ``/metrics`` and the server's own
report say; nothing else calls the controller, so a new signal is one change here.
Everything that reads the network about the server is here (``/health`` probes,
``/metrics`` reads, what it is); the controller, breaker and signals it feeds are
pure. It knows nothing of what sends to it: the dispatcher holds it, not the
other way round.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import anyio

from llmbatch._config import Limits, Priority, RetryPolicy, SLOSetting
from llmbatch._control.admission import AdmissionController, Pace
from llmbatch._control.breaker import Breaker, BreakerState
from llmbatch._control.signals import STEP_TIME_SOURCES, Signals
from llmbatch._exceptions import RequestError
from llmbatch._servers.kinds import (
    GENERIC,
    Dialect,
    PriorityField,
    ServerKind,
    Version,
    kind_from_models,
)
from llmbatch._servers.limits.wait import retry_after
from llmbatch._servers.load import (
    LOAD_FORMAT_HEADER,
    LOAD_HEADER,
    Load,
    MetricsSample,
    parse_load_header,
    parse_metrics,
)
from llmbatch._servers.model_list import fetch
from llmbatch._stats import ProviderLimits, ServerStats, SignalSource
from llmbatch._transports.base import HTTPRequest, Transport

if TYPE_CHECKING:
    from llmbatch._replicas import Replica
    from llmbatch._scheduler import Seats
    from llmbatch._servers.model_list import ModelList

__all__ = ["VLLM_PRIORITY", "Server"]

logger = logging.getLogger("llmbatch")

#: vLLM's convention, used when ``priority_scheduling=True`` meets an unknown server.
VLLM_PRIORITY = PriorityField(lower_first=True)

#: Seconds between two reads of /metrics while the client has work on the server.
METRICS_INTERVAL = 0.5
#: How long opening waits for each probe of what the server is.
DETECT_TIMEOUT = 2.0
#: A generation shorter than this says little about the server's step time.
MIN_TOKENS_FOR_STEP_SAMPLE = 4
#: Bulk sequences a hosted endpoint (a model list owned by no engine llmbatch knows)
#: is sent until it first answers one: its answers say its rate limits, which a first
#: burst of a whole bulk limit would meet blind. Realtime is not held.
FIRST_ANSWER_BULK = 8


class Server:
    """One server the client sends to (one of its replicas)."""

    def __init__(
        self,
        replica: Replica,
        *,
        headers: Mapping[str, str],
        transport: Transport,
        seats: Seats,
        limits: Limits,
        retry: RetryPolicy,
        slo: SLOSetting,
        refill: int = 0,
        priority_scheduling: bool | None = None,
    ) -> None:
        self.replica = replica
        """How the user named it (the public value ``client.endpoints`` lists)."""
        self.base_url = replica.base_url
        self.transport = transport
        self.models: ModelList | None = None
        """Its model list as last read (None: not read yet, or it did not answer)."""
        self.unread: Exception | None = None
        """Why its model list could not be read, last time."""
        self.seats = seats
        """Its seats in the scheduler."""
        self.probing = False
        """A health probe of it is under way."""
        self._provider_limits: tuple[ProviderLimits, float] | None = None
        """What its last answer's headers said of its rate limits, and when."""
        self.learnt_rate: tuple[int | None, int | None] | None = None
        """Requests and tokens a minute its answers state (``Health`` hands them to the
        scheduler, which paces by them when no ``RateLimit`` was given)."""
        self.answered_sequences = 0
        """Sequences whose answers came back from it (streams counted as they end)."""
        self._finished_last: tuple[float, int] | None = None
        """The engine's finished requests and this client's answered sequences at the
        last ``/metrics`` read that had both."""
        self._unsent = 0
        """Sequences the engine has finished that this client has not had back, as
        counted since the first such read."""
        self.generation_answered = False
        """It has answered a request this client sent it (any status)."""
        self.provider_owned = False
        """Its model list names an owner that is no engine llmbatch knows: a hosted
        endpoint or a proxy in front of one."""
        self._first_gate = False
        """Whether the bulk limit last handed on was held for the first answer."""
        self.learnt_remaining: tuple[float | None, float | None] | None = None
        self.refused = 0
        """Answers with status 429 (over the provider's rate) so far."""
        self.news = False
        """A provider's limits or a 429 came since the health policy last looked: the
        engine's loop should turn, even with nothing queued (an idle client's
        stats() and the processes sharing its key learn of them then)."""
        """What the latest answer said is left of those limits, in a second's worth
        of requests and tokens, until ``Health`` hands it to the scheduler (None:
        nothing new)."""
        self.cooldown_until = -math.inf
        """Until when nothing is sent to it: a 429 asked to wait (``retry-after-ms``,
        ``Retry-After``), at most ``RetryPolicy.max_backoff``."""
        self._max_wait = retry.max_backoff
        self._priority_scheduling = priority_scheduling
        """``Client(priority_scheduling=...)``: send tiers as ``priority`` (None: where
        the server's convention is known); False once the server has refused it."""
        # Every request asks vLLM for a load report on its response (other servers
        # ignore the header).
        self.headers = {**headers, LOAD_FORMAT_HEADER[0]: LOAD_FORMAT_HEADER[1]}
        self.probe_headers = dict(headers)
        stated = replica.max_num_seqs
        self.controller = AdmissionController(
            ceiling=limits.max_in_flight,
            max_reserve=limits.reserved_realtime,
            slo=slo,
            seats=stated,
            seats_stated_by=f"Replica(max_num_seqs={stated})" if stated else "",
            prefill_cost=replica.prefill_seconds_per_token,
            adaptive=limits.adaptive,
        )
        self.refill = refill
        """One bulk batch (the bulk tiers' largest ``max_batch_size``): what it may
        keep queued beyond its seats while it is sent each tier's priority and until
        realtime first runs there (``AdmissionController.refill``)."""
        self.breaker = Breaker(outage_tolerance=retry.outage_tolerance)
        self.prompt_cap: int | None = None
        """The most prompts it takes in one ``/v1/completions`` list, once it has
        refused a longer one (vLLM's ``VLLM_MAX_COMPLETION_PROMPTS``)."""
        self.dialect: Dialect = GENERIC
        """What the server said it is, and so how it speaks (``detect``)."""
        self.version: Version | None = None
        """Its release, where it says (``detect``)."""
        self.priority_field: PriorityField | None = None
        """How it takes the ``priority`` field (None: it is not sent)."""
        self._load_report: tuple[str | None, Load | None] = (None, None)
        """The last load header read and what it said: a lone caller's answers
        repeat it, and parsing it again cost more than comparing the text."""
        self.has_metrics: bool | None = None
        """Whether /metrics parses as vLLM's, so is worth reading (None: not read yet).
        Which of its series are there is ``signals``' business."""
        self.signals = Signals()
        """Which sources have reported on this server lately (load header, /metrics
        gauges and histogram, stream and answer timings, 429/503)."""
        self.length_risk = False
        """The server has refused a prompt as too long: prompts that might be are sent
        alone from now on, so one cannot fail a whole batch."""
        self._last_metrics: MetricsSample | None = None
        self.ejected = False
        """Out of rotation for being far slower than its peers (until re-admitted)."""

    def __repr__(self) -> str:
        return f"<Server {self.base_url} breaker={self.breaker.state.value}>"

    @property
    def index(self) -> int:
        """Its place in the scheduler (``Batch.replica``)."""
        return self.seats.index

    @property
    def removed(self) -> bool:
        """Removed from the client: it takes nothing new (in-flight work drains)."""
        return not self.seats.active

    @property
    def model_names(self) -> frozenset[str] | None:
        """The ids its list names (None: not read, or empty: it said nothing)."""
        if not self.models:
            return None
        return frozenset(str(m["id"]) for m in self.models)

    def stats(self, now: float) -> ServerStats:
        """What the client knows and decides about it now, for ``client.stats()``."""
        best = self.signals.best(now, STEP_TIME_SOURCES)
        control = self.controller.state()
        breaker = self.breaker
        seats = self.seats
        pace = control.pace
        return ServerStats(
            base_url=self.base_url,
            kind=self.kind.value,
            in_flight=seats.in_flight,
            bulk_limit=seats.bulk_cap,
            ceiling=control.ceiling,
            realtime_reserve=control.realtime_reserve,
            step_time=control.step_time,
            ttft=control.ttft,
            waiting=control.waiting,
            kv_cache_usage=control.kv_cache_usage,
            slo_met=control.slo_met,
            slo_missed=control.slo_missed,
            slo_aim=control.slo_aim,
            slo_unreachable=control.slo_unreachable,
            slo_auto=control.slo_auto,
            slo=control.slo,
            slo_ttft_derived=control.slo_ttft_derived,
            api_queue=control.api_queue,
            signals=self.signals.live(now),
            step_time_source=None if best is None else best.value,
            breaker=breaker.state.value,
            outages=breaker.opened,
            ejected=self.ejected,
            inferences=control.inferences,
            bulk_pace=None if pace is None else pace.tokens_per_second,
            bulk_slice=None if pace is None else pace.slice_tokens,
            bulk_refill=control.refill,
            provider_limits=self._provider_limits_now(now),
            cooldown=self.cooldown_until - now if now < self.cooldown_until else None,
        )

    def _provider_limits_now(self, now: float) -> ProviderLimits | None:
        if self._provider_limits is None:
            return None
        limits, read_at = self._provider_limits
        return limits.aged(now - read_at)

    # -- what exchanges report ---------------------------------------------------------

    def on_sent(
        self, now: float, sequences: int, prompt_tokens: int = 0, bulk: bool = False
    ) -> None:
        """An HTTP request of ``sequences`` sequences (about ``prompt_tokens`` prompt
        tokens; ``bulk``: normal or batch work) went out at ``now``."""
        self.controller.on_sent(now, sequences, prompt_tokens, bulk)

    def on_timing(
        self,
        tier: Priority,
        latency: float,
        tokens: int,
        now: float,
        first_token_at: float | None,
    ) -> None:
        """What one answered exchange shows of the server's speed: ``latency`` from
        sending to ``now``, the most tokens a sequence generated, and when the first
        arrived (streams)."""
        controller = self.controller
        signals = self.signals
        ttft = tpot = None
        source = SignalSource.STREAM_TIMING
        if first_token_at is not None:
            ttft = first_token_at - (now - latency)
            if tokens > 1:
                tpot = (now - first_token_at) / (tokens - 1)
                signals.saw(source, now)
        else:
            if tokens >= MIN_TOKENS_FOR_STEP_SAMPLE:
                tpot = latency / tokens  # an upper bound: it includes the prefill
                source = SignalSource.ANSWER_LATENCY
                signals.saw(source, now)
            step = controller.step_time
            if tier is Priority.REALTIME and step is not None and tokens >= 1:
                # Not streamed: the answer's time less its decode steps estimates the
                # first token's (the SLO's TTFT needs realtime callers to stream no more).
                ttft = max(step, latency - (tokens - 1) * step)
        if tier is Priority.REALTIME:
            if ttft is not None:
                controller.on_ttft(ttft)
            whole = first_token_at is None  # not streamed: the call is judged whole
            controller.on_realtime_answer(
                ttft,
                tpot,
                sent=now - latency,
                latency=latency if whole else None,
                tokens=tokens,
            )
        else:
            controller.on_bulk_answer(tokens)
        if tpot is not None and signals.best(now, STEP_TIME_SOURCES) is source:
            # Only the best source reporting now feeds the step time: the server's own
            # histogram while it is there, else streams, else answers. One that goes
            # quiet gives way by itself; none switches another off for good.
            controller.on_step_time(tpot)

    def control(
        self, now: float, *, blocked: bool, realtime_in_flight: int, bulk_in_flight: int
    ) -> bool:
        """Update the bulk limit (at most every controller interval): ``blocked`` if
        bulk work waited for it, with ``realtime_in_flight`` realtime and
        ``bulk_in_flight`` bulk sequences there now. Returns whether the limit
        changed."""
        controller = self.controller
        if blocked:
            controller.on_blocked()
        controller.on_realtime_in_flight(now, realtime_in_flight)
        controller.refill = self.refill if self.ranks_tiers else 0
        unreachable = controller.slo_unreachable
        changed = controller.update(now, bulk_in_flight)
        gated = self.awaits_first_answer
        if gated != self._first_gate:
            self._first_gate = gated
            changed = True
        if controller.slo_unreachable and not unreachable:
            # Once per episode: the limit alone, sitting at 1, would not say why.
            logger.warning(
                "%s is over the SLO (%s) with bulk down to one sequence: the server "
                "is too slow for it (step %s); loosen the SLO or add capacity",
                self.base_url,
                controller.slo,
                "unknown" if controller.step_time is None else f"{controller.step_time:.4f}s",
            )
        return changed

    def _finished_unsent(self, sample: MetricsSample) -> int:
        """Sequences the engine has finished that this client has not had back yet:
        prompts of a batched answer waiting for the batch's last. Counted from read
        to read (what the engine finished, less what came back), never below 0 (so
        what was unsent before the first read is forgotten as it comes back) nor
        above what is in flight (other clients' finished requests cannot make it
        more). 0 where the server does not count what it finished."""
        finished = sample.finished
        if finished is None:
            return 0
        last = self._finished_last
        answered = self.answered_sequences
        self._finished_last = (finished, answered)
        if last is None or finished < last[0]:  # (a restarted server counts afresh)
            self._unsent = 0
            return 0
        grown = int(finished - last[0]) - (answered - last[1])
        self._unsent = min(self.seats.in_flight, max(0, self._unsent + grown))
        return self._unsent

    @property
    def awaits_first_answer(self) -> bool:
        """A hosted endpoint (:attr:`provider_owned`) that has not answered a request
        yet: bulk is held to :data:`FIRST_ANSWER_BULK` until its answer says its rate
        limits."""
        return self.provider_owned and not self.generation_answered

    @property
    def bulk_limit(self) -> int:
        """Bulk sequences the controller allows in flight here now (a few, where the
        server has yet to say its rate limits)."""
        limit = self.controller.limit
        return min(limit, FIRST_ANSWER_BULK) if self.awaits_first_answer else limit

    @property
    def paces(self) -> bool:
        """Bulk here is paced once measured (``SLO(pace=True)``)."""
        slo = self.controller.slo
        return slo is not None and slo.pace

    @property
    def batch_prefill(self) -> float | None:
        """The most estimated prompt tokens one batch should carry here (None: no
        cap): one engine step's worth (as stated on its ``Replica``, else as its kind
        takes them), less the decodes running there."""
        step = self.replica.max_num_batched_tokens or self.dialect.step_tokens
        return self.controller.batch_prefill_cap(step)

    # -- what it takes, and what it has refused ---------------------------------------

    @property
    def ranks_tiers(self) -> bool:
        """Each tier is sent with its priority (its kind takes one, or the client was
        told to send it) and it has not refused the field: its queue puts realtime
        first."""
        send = self._priority_scheduling
        return send is not False and (bool(send) or self.priority_field is not None)

    def rank(self, priority: Priority) -> int | None:
        """The ``priority`` field for a tier, in its own convention (None: not sent).
        ``priority_scheduling=True`` sends it in vLLM's (an int, lower first) to a
        server whose convention is not known."""
        send = self._priority_scheduling
        if send is False:
            return None
        field = self.priority_field
        if field is None:
            if not send:
                return None
            field = VLLM_PRIORITY
        return field.value(priority.rank)

    def on_priority_refused(self, message: str) -> None:
        """It refused the ``priority`` field (vLLM on ``fcfs``): none is sent from now."""
        logger.warning(
            "%s refuses the priority field (%s); sending tiers without it from now on",
            self.base_url,
            message,
        )
        self._priority_scheduling = False

    def on_list_refused(self, cap: int) -> None:
        """It refused a list of prompts longer than ``cap`` (vLLM's
        ``VLLM_MAX_COMPLETION_PROMPTS``): lists are kept within it from now on."""
        logger.warning(
            "%s takes at most %d prompts a request; sending lists of %d from now on",
            self.base_url,
            cap,
            cap,
        )
        self.prompt_cap = cap

    def on_too_long(self) -> None:
        """It refused a prompt as longer than its context: prompts that might be are
        sent alone from now on (``length_risk``)."""
        self.length_risk = True

    def on_prompt_usage(self, estimated: int, counted: int) -> None:
        """A batch's prompt tokens: the client's estimate, and the server's count."""
        self.controller.on_prompt_usage(estimated, counted)

    @property
    def bulk_pace(self) -> Pace | None:
        """How fast bulk prompt tokens may go here now (None: unpaced)."""
        return self.controller.pace()

    def on_response(
        self,
        status: int,
        headers: Mapping[str, str],
        now: float,
        sent_at: float | None = None,
    ) -> None:
        """An HTTP response arrived at ``now`` (any status) to a request sent at
        ``sent_at`` (None: a probe of what it is): the server is reachable."""
        limits = self.dialect.provider_limits(headers)
        if sent_at is not None and (status < 400 or status == 429 or limits is not None):
            # An answer that says the limits, or that there are none to say. (A 404
            # for a route the server lacks says nothing: LiteLLM's proxy answers the
            # chat batch route so, and bulk then went out before any limit was known.)
            self.generation_answered = True
        if limits is not None:
            self.news = True
            self._provider_limits = (limits, now)
            self.learnt_rate = learnt = _per_minute(limits)
            if learnt is not None:
                self.learnt_remaining = _per_second_left(limits, learnt)
        if status == 429:
            self.refused += 1
            self.news = True
            wait = retry_after(headers)
            if wait:
                # Every batch for this server waits it out, not only the one refused:
                # the others would meet the same limit.
                self.cooldown_until = max(self.cooldown_until, now + min(wait, self._max_wait))
        if status in (429, 503):
            if self.breaker.state is BreakerState.CLOSED:  # (not an outage's 503s)
                self.controller.on_overload()
                self.signals.saw(SignalSource.OVERLOAD_STATUS, now)
        else:
            self.controller.on_answer()
        if status == 503:
            return  # overloaded or restarting: the dispatcher reports it as a failure
        if not self.ejected:
            self.breaker.on_success(sent_at)
        elif self.breaker.state is BreakerState.HALF_OPEN:
            self.ejected = False  # its trial batch was answered: back in rotation
            self.breaker.on_success(sent_at)
        # (Answers to work sent before an ejection do not end it.)
        raw = headers.get(LOAD_HEADER)
        seen, load = self._load_report
        if raw != seen:
            load = parse_load_header(raw)
            self._load_report = (raw, load)
        if load is not None:
            self.signals.saw(SignalSource.LOAD_HEADER, now)
            self.controller.on_load(
                now, waiting=load.waiting, running=load.running, kv_cache_usage=load.kv_cache_usage
            )

    def on_unavailable(self, now: float, error: RequestError, *, patient: bool = False) -> bool:
        """A connection failure, a dropped connection or a 503. Returns True when
        requests should wait for the server rather than retry on their own: the
        breaker is open (or just opened) and the server has answered before, or is
        ``patient``ly waited for (one of several replicas whose peers answered: it is
        starting or restarting, not misconfigured)."""
        if not (self.breaker.ever_answered or patient) or self.breaker.outage_tolerance <= 0:
            # Never answered: a configuration problem, reported at once. (Or the
            # patience was turned off.)
            return False
        opened = self.breaker.on_failure(now, str(error))
        if opened:
            self.controller.on_outage()
            logger.warning(
                "%s is unavailable (%s); holding requests and probing every %.1fs for up to %.0fs",
                self.base_url,
                error,
                self.breaker.probe_interval,
                self.breaker.outage_tolerance,
            )
        return self.breaker.state is not BreakerState.CLOSED

    def eject(self, now: float, reason: str) -> None:
        """Take a server far slower than its peers out of rotation until a health
        probe and a trial batch re-admit it; its speed is measured afresh then."""
        if self.breaker.state is not BreakerState.CLOSED:
            return
        logger.warning(
            "%s is far slower than its peers (%s); sending it nothing for now",
            self.base_url,
            reason,
        )
        self.ejected = True
        self.breaker.open_without_failure(now, reason)
        self.controller.forget_speed()

    def hold_out(self, now: float, reason: str) -> None:
        """A replica that did not answer at open: out of rotation, probed like a
        server in an outage, in once a probe and a trial batch succeed."""
        self.breaker.open_without_failure(now, reason)

    @property
    def kind(self) -> ServerKind:
        """What kind of server it is."""
        return self.dialect.kind

    # -- probes ----------------------------------------------------------------------

    async def detect(self, models: Sequence[Mapping[str, object]]) -> None:
        """Learn what the server is from its model list, and from what its kind says
        about itself (its release; SGLang: how it orders priorities; llama.cpp: its
        slots). ``_servers`` has the rules and their sources."""
        dialect = kind_from_models(models) or GENERIC
        # An owner named that is no engine's (OpenAI's "system", a provider's, a
        # proxy's): a hosted endpoint, whose rate limits its first answer will say.
        self.provider_owned = dialect is GENERIC and any(m.get("owned_by") for m in models)
        info = None if dialect.info_path is None else await self._get_json(dialect.info_path)
        self.dialect = dialect
        self.version = dialect.version(info)
        self.priority_field = dialect.priority_field(info)
        slots = dialect.stated_seats(info)
        if slots is not None and self.replica.max_num_seqs is None:
            self.controller.capacity.state(
                slots, f"{dialect.kind} {dialect.info_path} total_slots {slots}"
            )

    async def _get_json(self, path: str) -> object:
        """``GET {origin}{path}`` as JSON; None when it fails in any way (a probe of
        what the server is must never stop the client from opening)."""
        try:
            with anyio.fail_after(DETECT_TIMEOUT):
                status, _, body = await fetch(
                    self.transport, self._origin() + path, self.probe_headers
                )
            return json.loads(body) if status == 200 else None
        except Exception:
            return None

    def _origin(self) -> str:
        # vLLM serves /health and /metrics at the root, not under /v1.
        url = self.base_url
        return url[: -len("/v1")] if url.endswith("/v1") else url

    async def probe_health(self) -> bool:
        """GET /health: True if the server answers 200."""
        try:
            response = await self.transport.send(
                HTTPRequest("GET", self._origin() + "/health", self.probe_headers)
            )
            try:
                await response.read()
            finally:
                await response.aclose()
        except RequestError:
            return False
        except Exception:
            # A transport must raise only llmbatch's errors; a background probe must
            # not take the client down when a custom one does not.
            logger.exception("the transport failed probing %s/health", self._origin())
            return False
        return response.status == 200

    async def read_metrics(self, now: float) -> None:
        """GET /metrics and feed the controller: gauges, and the step time and TTFT
        averaged since the last read (from vLLM's histogram totals)."""
        try:
            response = await self.transport.send(
                HTTPRequest("GET", self._origin() + "/metrics", self.probe_headers)
            )
            try:
                body = await response.read()
            finally:
                await response.aclose()
        except RequestError:
            return
        except Exception:
            # As for probes: a custom transport's bug costs the metrics, not the client.
            logger.exception(
                "the transport failed reading %s/metrics; not reading it again", self._origin()
            )
            self.has_metrics = False
            return
        sample = parse_metrics(body.decode("utf-8", "replace")) if response.status == 200 else None
        self.has_metrics = sample is not None
        if sample is None:
            return
        controller = self.controller
        load = sample.load
        if load.waiting is not None or load.running is not None or load.kv_cache_usage is not None:
            self.signals.saw(SignalSource.METRICS_GAUGES, now)
        controller.on_load(
            now, waiting=load.waiting, running=load.running, kv_cache_usage=load.kv_cache_usage
        )
        if load.waiting is not None and load.running is not None:
            # Read with the gauges, not from the load header: an answer's header is
            # read as its sequence leaves, and a batch's arrive one by one.
            accepted = self.seats.in_flight - load.running - load.waiting
            controller.on_api_queue(now, max(0, accepted - self._finished_unsent(sample)))
        if sample.tpot_count is not None:
            # The histogram is there (even when no token was generated since the last
            # read): the server measures the step time better than answers can.
            self.signals.saw(SignalSource.METRICS_STEP_TIME, now)
        last = self._last_metrics
        if last is not None:
            step = _mean_since(sample.tpot_sum, sample.tpot_count, last.tpot_sum, last.tpot_count)
            if step is not None:
                controller.on_step_time(step)
        self._last_metrics = sample


def _mean_since(
    total: float | None, count: float | None, last_total: float | None, last_count: float | None
) -> float | None:
    """The mean of a histogram's observations between two reads."""
    if total is None or count is None or last_total is None or last_count is None:
        return None
    observed = count - last_count
    if observed <= 0:
        return None
    return (total - last_total) / observed


#: A stated limit whose budget is whole again within this is a minute's (or finer):
#: OpenAI's are; a limit whose reset is longer (Groq's requests, a day's) is not
#: spread evenly over seconds, and is not learnt.
_MINUTE = 60.0


def _per_second_left(
    limits: ProviderLimits, learnt: tuple[int | None, int | None]
) -> tuple[float | None, float | None]:
    """What ``limits`` say is left of each learnt limit, in a second's worth: a
    provider enforcing a minute's limit per second (as OpenAI documents) holds at
    most a second's worth, so what is left of the minute, over 60, is what may go at
    once; for a per-second family, what is left."""
    per = limits.window or _MINUTE

    def left(remaining: int | None, limit: int | None) -> float | None:
        return None if remaining is None or limit is None else remaining / per

    return (
        left(limits.requests_remaining, learnt[0]),
        left(limits.tokens_remaining, learnt[1]),
    )


def _per_minute(limits: ProviderLimits) -> tuple[int | None, int | None] | None:
    """The requests and tokens a minute ``limits`` state (None: neither). Where the
    family states its window, the limit scaled to a minute; where it does not
    (OpenAI's), a limit whose reset is within a minute (a per-day one, Groq's
    requests, is not spread over the day's minutes), or that states no reset
    (LiteLLM's proxy, whose limits are its deployments' rpm and tpm)."""
    window = limits.window

    def of(limit: int | None, reset: float | None) -> int | None:
        if not limit:
            return None
        if window is not None:
            return max(1, round(limit * _MINUTE / window))
        if reset is not None and reset > _MINUTE:
            return None
        return limit

    learnt = (
        of(limits.requests_limit, limits.requests_reset),
        of(limits.tokens_limit, limits.tokens_reset),
    )
    return None if learnt == (None, None) else learnt
