"""llmbatch: an async client for LLM servers with priority tiers, dynamic batching,
admission control and per-request fault isolation.

    async with llmbatch.Client() as client:
        answer = await client.complete("Hello", priority="realtime", max_tokens=64)
        results = await client.map(prompts, priority="batch")

Every public name below is loaded on first use, so ``import llmbatch`` costs a few
milliseconds (``llmbatch --version``, a web app's import) and the client's modules,
anyio and asyncio load with the first ``llmbatch.Client`` (or other name).
"""

import importlib
import typing

from llmbatch._version import __version__

if typing.TYPE_CHECKING:
    from llmbatch._chunks import (
        ChatChunkChoice,
        ChatCompletionChunk,
        ChatDelta,
        CompletionChunk,
        FunctionCallDelta,
        ToolCallDelta,
    )
    from llmbatch._client import Client
    from llmbatch._config import (
        DEFAULT_BATCH_POLICIES,
        DEFAULT_LIMITS,
        DEFAULT_RETRY_POLICY,
        DEFAULT_TIMEOUT,
        SLO,
        BatchPolicy,
        Limits,
        Priority,
        RateLimit,
        RetryPolicy,
        SharedInFlight,
        TenantLimits,
        Timeout,
    )
    from llmbatch._evidence import Inference
    from llmbatch._exceptions import (
        APIStatusError,
        AuthenticationError,
        BadRequestError,
        ClientClosedError,
        ConfigError,
        ConfigTypeError,
        ConnectError,
        ConnectTimeout,
        DeadlineExceeded,
        InvalidRequestError,
        InvalidTypeError,
        LLMBatchError,
        NotFoundError,
        PermissionDeniedError,
        PoolTimeout,
        QueueFull,
        RateLimitError,
        ReadTimeout,
        RemoteProtocolError,
        RequestCancelled,
        RequestError,
        ServerError,
        ServerInfoError,
        ServerOutageError,
        ServiceUnavailableError,
        TenantQuotaExceeded,
        TimeoutException,
        TransportError,
        UnknownModelError,
        WriteTimeout,
    )
    from llmbatch._fleet import Endpoints
    from llmbatch._models import (
        ChatChoice,
        ChatCompletion,
        ChatMessage,
        Choice,
        Completion,
        Embedding,
        FunctionCall,
        Result,
        Timings,
        ToolCall,
        Usage,
    )
    from llmbatch._progress import MapProgress, ProgressBar
    from llmbatch._replicas import Replica
    from llmbatch._stats import (
        Histogram,
        Percentiles,
        ServerStats,
        SharedStats,
        Stats,
        TenantStats,
        TierStats,
    )
    from llmbatch._sync import SyncClient

#: Where each public name is defined (read by ``__getattr__`` on first use).
_EXPORTS = {
    "ChatChunkChoice": "llmbatch._chunks",
    "ChatCompletionChunk": "llmbatch._chunks",
    "ChatDelta": "llmbatch._chunks",
    "CompletionChunk": "llmbatch._chunks",
    "FunctionCallDelta": "llmbatch._chunks",
    "ToolCallDelta": "llmbatch._chunks",
    "Client": "llmbatch._client",
    "BatchPolicy": "llmbatch._config",
    "DEFAULT_BATCH_POLICIES": "llmbatch._config",
    "DEFAULT_LIMITS": "llmbatch._config",
    "DEFAULT_RETRY_POLICY": "llmbatch._config",
    "DEFAULT_TIMEOUT": "llmbatch._config",
    "Limits": "llmbatch._config",
    "Priority": "llmbatch._config",
    "RateLimit": "llmbatch._config",
    "RetryPolicy": "llmbatch._config",
    "SLO": "llmbatch._config",
    "SharedInFlight": "llmbatch._config",
    "TenantLimits": "llmbatch._config",
    "TenantQuotaExceeded": "llmbatch._exceptions",
    "Timeout": "llmbatch._config",
    "APIStatusError": "llmbatch._exceptions",
    "AuthenticationError": "llmbatch._exceptions",
    "BadRequestError": "llmbatch._exceptions",
    "ClientClosedError": "llmbatch._exceptions",
    "ConfigError": "llmbatch._exceptions",
    "ConfigTypeError": "llmbatch._exceptions",
    "ConnectError": "llmbatch._exceptions",
    "ConnectTimeout": "llmbatch._exceptions",
    "DeadlineExceeded": "llmbatch._exceptions",
    "InvalidRequestError": "llmbatch._exceptions",
    "InvalidTypeError": "llmbatch._exceptions",
    "LLMBatchError": "llmbatch._exceptions",
    "NotFoundError": "llmbatch._exceptions",
    "PermissionDeniedError": "llmbatch._exceptions",
    "PoolTimeout": "llmbatch._exceptions",
    "QueueFull": "llmbatch._exceptions",
    "RateLimitError": "llmbatch._exceptions",
    "ReadTimeout": "llmbatch._exceptions",
    "RemoteProtocolError": "llmbatch._exceptions",
    "RequestCancelled": "llmbatch._exceptions",
    "RequestError": "llmbatch._exceptions",
    "ServerError": "llmbatch._exceptions",
    "ServerInfoError": "llmbatch._exceptions",
    "ServerOutageError": "llmbatch._exceptions",
    "ServiceUnavailableError": "llmbatch._exceptions",
    "TimeoutException": "llmbatch._exceptions",
    "TransportError": "llmbatch._exceptions",
    "UnknownModelError": "llmbatch._exceptions",
    "WriteTimeout": "llmbatch._exceptions",
    "Endpoints": "llmbatch._fleet",
    "ChatChoice": "llmbatch._models",
    "ChatCompletion": "llmbatch._models",
    "ChatMessage": "llmbatch._models",
    "Choice": "llmbatch._models",
    "Completion": "llmbatch._models",
    "Embedding": "llmbatch._models",
    "FunctionCall": "llmbatch._models",
    "Result": "llmbatch._models",
    "Timings": "llmbatch._models",
    "ToolCall": "llmbatch._models",
    "Usage": "llmbatch._models",
    "MapProgress": "llmbatch._progress",
    "ProgressBar": "llmbatch._progress",
    "Replica": "llmbatch._replicas",
    "Histogram": "llmbatch._stats",
    "Percentiles": "llmbatch._stats",
    "ServerStats": "llmbatch._stats",
    "Inference": "llmbatch._evidence",
    "SharedStats": "llmbatch._stats",
    "Stats": "llmbatch._stats",
    "TenantStats": "llmbatch._stats",
    "TierStats": "llmbatch._stats",
    "SyncClient": "llmbatch._sync",
}


if not typing.TYPE_CHECKING:  # type checkers read the imports above, and flag typos

    def __getattr__(name: str) -> object:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'llmbatch' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later lookups are plain attribute reads
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = [
    "DEFAULT_BATCH_POLICIES",
    "DEFAULT_LIMITS",
    "DEFAULT_RETRY_POLICY",
    "DEFAULT_TIMEOUT",
    "SLO",
    "APIStatusError",
    "AuthenticationError",
    "BadRequestError",
    "BatchPolicy",
    "ChatChoice",
    "ChatChunkChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatDelta",
    "ChatMessage",
    "Choice",
    "Client",
    "ClientClosedError",
    "Completion",
    "CompletionChunk",
    "ConfigError",
    "ConfigTypeError",
    "ConnectError",
    "ConnectTimeout",
    "DeadlineExceeded",
    "Embedding",
    "Endpoints",
    "FunctionCall",
    "FunctionCallDelta",
    "Histogram",
    "Inference",
    "InvalidRequestError",
    "InvalidTypeError",
    "LLMBatchError",
    "Limits",
    "MapProgress",
    "NotFoundError",
    "Percentiles",
    "PermissionDeniedError",
    "PoolTimeout",
    "Priority",
    "ProgressBar",
    "QueueFull",
    "RateLimit",
    "RateLimitError",
    "ReadTimeout",
    "RemoteProtocolError",
    "Replica",
    "RequestCancelled",
    "RequestError",
    "Result",
    "RetryPolicy",
    "ServerError",
    "ServerInfoError",
    "ServerOutageError",
    "ServerStats",
    "ServiceUnavailableError",
    "SharedInFlight",
    "SharedStats",
    "Stats",
    "SyncClient",
    "TenantLimits",
    "TenantQuotaExceeded",
    "TenantStats",
    "TierStats",
    "Timeout",
    "TimeoutException",
    "Timings",
    "ToolCall",
    "ToolCallDelta",
    "TransportError",
    "UnknownModelError",
    "Usage",
    "WriteTimeout",
    "__version__",
]
