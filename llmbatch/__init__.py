"""llmbatch: an async client for LLM servers with priority tiers, dynamic batching,
admission control and per-request fault isolation.

    async with llmbatch.Client() as client:
        answer = await client.complete("Hello", priority="realtime", max_tokens=64)
        results = await client.map(prompts, priority="batch")
"""

from llmbatch._client import Client
from llmbatch._config import (
    DEFAULT_BATCH_POLICIES,
    DEFAULT_LIMITS,
    DEFAULT_RETRY_POLICY,
    DEFAULT_TIMEOUT,
    BatchPolicy,
    Limits,
    Priority,
    RateLimit,
    RetryPolicy,
    Timeout,
)
from llmbatch._exceptions import (
    APIStatusError,
    AuthenticationError,
    BadRequestError,
    ClientClosedError,
    ConnectError,
    DeadlineExceeded,
    InvalidRequestError,
    LLMBatchError,
    NotFoundError,
    PermissionDeniedError,
    QueueFull,
    RateLimitError,
    ReadTimeout,
    RemoteProtocolError,
    RequestCancelled,
    RequestError,
    ServerError,
    ServerInfoError,
    ServiceUnavailableError,
    TransportError,
)
from llmbatch._models import ChatCompletion, ChatMessage, Choice, Completion, Result, Timings, Usage
from llmbatch._progress import MapProgress, ProgressBar
from llmbatch._stats import Percentiles, Stats, TierStats
from llmbatch._version import __version__

__all__ = [
    "DEFAULT_BATCH_POLICIES",
    "DEFAULT_LIMITS",
    "DEFAULT_RETRY_POLICY",
    "DEFAULT_TIMEOUT",
    "APIStatusError",
    "AuthenticationError",
    "BadRequestError",
    "BatchPolicy",
    "ChatCompletion",
    "ChatMessage",
    "Choice",
    "Client",
    "ClientClosedError",
    "Completion",
    "ConnectError",
    "DeadlineExceeded",
    "InvalidRequestError",
    "LLMBatchError",
    "Limits",
    "MapProgress",
    "NotFoundError",
    "Percentiles",
    "PermissionDeniedError",
    "Priority",
    "ProgressBar",
    "QueueFull",
    "RateLimit",
    "RateLimitError",
    "ReadTimeout",
    "RemoteProtocolError",
    "RequestCancelled",
    "RequestError",
    "Result",
    "RetryPolicy",
    "ServerError",
    "ServerInfoError",
    "ServiceUnavailableError",
    "Stats",
    "TierStats",
    "Timeout",
    "Timings",
    "TransportError",
    "Usage",
    "__version__",
]
