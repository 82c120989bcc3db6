"""A call's options: declared once, checked once per distinct set, and cached.

The ``*Params`` TypedDicts are the one declaration of what a call takes. They type
the ``**params`` of every :class:`Client` and :class:`SyncClient` method (through
``Unpack``), so a type checker sees every option and its type; their keys beyond
llmbatch's own options (:class:`CallParams`) are the body fields each endpoint
accepts, so a misspelt keyword is a ``TypeError`` naming the nearest one. A call's
keywords arrive as one dict, are checked into a :class:`CallSpec` (llmbatch's own
options taken out and checked by the checks declared beside them, the rest sent
as they are), and cached by their values: a bulk map or a burst of ``complete()``
calls repeats the same options for every prompt. Adding an option is a key in
:class:`CallParams`, its check in :func:`check_call`, and its slot on
:class:`CallSpec`.

Wrong types raise :class:`InvalidTypeError` (also a ``TypeError``), bad values
:class:`InvalidRequestError` (also a ``ValueError``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, Literal, Protocol, cast

from llmbatch._calls.params import (
    ChatFields,
    CompletionFields,
    EmbeddingFields,
    Fields,
    check_extra,
    check_keywords,
    keys_of,
    query_string,
)
from llmbatch._calls.validate import (
    DEFAULT_MAX_TOKENS,
    bad_value,
    check_max_retries,
    check_tenant,
    check_timeout,
    positive_int,
    wrong_type,
)
from llmbatch._config import Priority, PriorityLike, parse_priority
from llmbatch._exceptions import InvalidRequestError, InvalidTypeError

__all__ = [
    "DEFAULT_MAX_REASKS",
    "OWN_OPTIONS",
    "BodyDialect",
    "CacheMode",
    "CallParams",
    "CallSpec",
    "ChatParams",
    "CompletionParams",
    "EmbeddingParams",
    "Kind",
    "MapParams",
    "ResponseModel",
    "SpecCache",
    "TextParams",
    "check_cache_mode",
    "check_call",
    "response_model_of",
]

Kind = Literal["completion", "chat", "embedding"]
CacheMode = Literal["use", "off", "refresh"]
"""What a call asks of the client's response cache."""


class CallParams(Fields, total=False):
    """llmbatch's own options, which every call takes (None: left out)."""

    priority: PriorityLike | None
    """The tier: ``"realtime"``, ``"normal"`` or ``"batch"`` (each method has its
    default)."""
    model: str | None
    """Overrides the client's model for this call."""
    timeout: float | None
    """Seconds the whole request may take, queueing included."""
    max_retries: int | None
    """Retries after the first attempt (None: the client's :class:`RetryPolicy`)."""
    extra_body: Mapping[str, Any] | None
    """Fields sent in the body as they are."""
    extra_headers: Mapping[str, str] | None
    """HTTP headers sent with the request."""
    extra_query: Mapping[str, str] | None
    """Query parameters added to the endpoint's URL."""
    tenant: str | None
    """Who the call is for (docs/tenants.md)."""
    cache: bool | Literal["refresh"] | None
    """With a client's ``cache``: ``False`` neither reads nor writes it for this call,
    ``"refresh"`` asks the server and replaces the stored answer (docs/caching.md)."""


class CompletionParams(CallParams, CompletionFields, total=False):
    """What :meth:`Client.complete` takes besides the prompt."""


class ChatParams(CallParams, ChatFields, total=False):
    """What :meth:`Client.chat` takes besides the messages."""


class EmbeddingParams(CallParams, EmbeddingFields, total=False):
    """What :meth:`Client.embed` takes besides the input."""


class TextParams(CallParams, CompletionFields, ChatFields, total=False):
    """What a call that takes a prompt or messages takes (the streams)."""


class MapParams(CallParams, CompletionFields, ChatFields, EmbeddingFields, total=False):
    """What a map takes for its items (a dict item may override each one, except
    ``max_cost``, which is the map's)."""

    max_cost: float | None
    """Dollars this map may spend (beside the client's ``max_cost``): once spent, the
    items not yet sent fail with :class:`SpendingLimitReached`."""


OWN_OPTIONS = keys_of(CallParams) | {"response_model", "max_reasks"}
"""llmbatch's own options: checked and used here, never sent as they are
(``response_model`` and ``max_reasks`` are parameters of their own in the
signatures that take them, so that the answer's type follows the model)."""
DEFAULT_MAX_REASKS = 2
"""How many times an answer that fails validation is sent back to be corrected."""
#: Body fields that name a schema themselves, which a response_model would contradict.
_SCHEMA_FIELDS = ("response_format", "structured_outputs", "guided_json", "json_schema")


class ResponseModel:
    """A call's ``response_model``: the type its answers are validated into, with
    pydantic's ``TypeAdapter`` for it and its JSON schema (made once per type)."""

    __slots__ = ("adapter", "name", "schema", "target", "validate_json")

    def __init__(self, target: object) -> None:
        # pydantic only when a schema is used: ``import llmbatch`` stays light.
        from pydantic import PydanticUserError, TypeAdapter

        try:
            self.adapter: Any = TypeAdapter(cast(Any, target))
            self.schema: dict[str, Any] = self.adapter.json_schema()
            # pydantic-core's validator itself, without the adapter's Python wrapper
            # (once per answer of a bulk map).
            self.validate_json: Any = getattr(self.adapter, "validator", self.adapter).validate_json
        except (PydanticUserError, TypeError, ValueError) as exc:
            shown = getattr(target, "__name__", None) or repr(target)
            raise InvalidTypeError(
                f"response_model must be a type pydantic can validate (a BaseModel, "
                f"list[Model], a Literal, an enum, a TypedDict), got {shown}: "
                f"{str(exc).splitlines()[0]}",
                field="response_model",
            ) from None
        self.target = target
        self.name = _schema_name(target)
        """The schema's name, as ``response_format`` wants it (``[a-zA-Z0-9_-]``)."""

    def __repr__(self) -> str:
        return f"ResponseModel({self.name})"


def _schema_name(target: object) -> str:
    raw = getattr(target, "__name__", None) or str(target)
    name = re.sub(r"[^a-zA-Z0-9_-]+", "_", raw).strip("_")[:64]
    return name or "answer"


#: Each type's ResponseModel, made once (a TypeAdapter takes milliseconds to build).
_MODELS: dict[object, ResponseModel] = {}


def response_model_of(target: object) -> ResponseModel | None:
    """The checked ``response_model`` (None: none given); raises if pydantic cannot
    validate ``target``."""
    if target is None:
        return None
    try:
        found = _MODELS.get(target)
    except TypeError:  # unhashable: built each time
        return ResponseModel(target)
    if found is None:
        found = _MODELS[target] = ResponseModel(target)
    return found


class CallSpec:
    """The checked options of a call, shared by every request made with them."""

    __slots__ = (
        "attempts",
        "body_prefix",
        "cache",
        "compat_key",
        "headers",
        "kind",
        "max_batch",
        "max_reasks",
        "max_tokens",
        "max_tokens_given",
        "model",
        "n",
        "params",
        "priority",
        "query",
        "response_model",
        "stream",
        "tenant",
        "tenant_suffix",
        "timeout",
    )

    def __init__(
        self,
        *,
        kind: Kind,
        priority: Priority,
        model: str,
        params: Mapping[str, Any],
        params_json: str,
        max_tokens: int,
        n: int,
        timeout: float | None,
        stream: bool,
        headers: tuple[tuple[str, str], ...] = (),
        query: str = "",
        attempts: int | None = None,
        tenant: str | None = None,
        response_model: ResponseModel | None = None,
        max_reasks: int = DEFAULT_MAX_REASKS,
        max_tokens_given: bool | None = None,
        cache: CacheMode = "use",
    ) -> None:
        self.kind = kind
        self.priority = priority
        self.model = model
        self.params = params
        """Body fields as sent (None values dropped, ``max_tokens`` if given)."""
        self.max_tokens = max_tokens
        """``max_tokens`` for budgeting: the caller's, or the endpoint's default."""
        self.max_tokens_given = (
            "max_tokens" in params if max_tokens_given is None else max_tokens_given
        )
        self.n = n
        self.timeout = timeout
        self.stream = stream
        self.headers = headers
        """``extra_headers``: sent with the HTTP request that carries it."""
        self.query = query
        """``extra_query`` as ``?a=1``, appended to the endpoint's path."""
        self.attempts = attempts
        """HTTP attempts for this call (``max_retries + 1``); None: the client's policy."""
        self.tenant = tenant
        """Who the call is for (None: the shared default tenant)."""
        self.response_model = response_model
        """The type its answers are validated into (None: plain answers)."""
        self.max_reasks = max_reasks
        """How often an answer that fails validation goes back to be corrected."""
        self.cache: CacheMode = cache
        """What the client's response cache does for it: ``"use"`` (read, then write),
        ``"off"``, or ``"refresh"`` (write only)."""
        # Streams never share an HTTP request: each caller reads its own SSE response.
        self.max_batch = 1 if stream else 1024
        # Only requests with the same endpoint, model, parameters and mode share a batch.
        # One string, not a tuple: a string caches its hash, and the scheduler looks
        # the key up for every request it queues.
        self.compat_key = "\x00".join(
            (
                kind,
                model,
                params_json,
                "stream" if stream else "",
                repr(headers),
                query,
                str(attempts),
            )
        )
        # A tenant's requests form groups of their own (each group one tenant, so the
        # scheduler can weigh tenants against each other); groups that differ only in
        # their tenant form a family, whose batches may mix tenants.
        self.tenant_suffix = "" if tenant is None else f"\x00tenant\x00{tenant}"
        self.body_prefix: bytes | None = None
        """The JSON body up to the prompt, made once by the wire module."""


def _number(params: Mapping[str, Any], name: str, lo: float, hi: float) -> None:
    value = params.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise wrong_type(name, "a number", value)
    if not math.isfinite(value) or not lo <= value <= hi:
        raise bad_value(
            f"{name} must be a finite number between {lo} and {hi}, got {value!r}", name
        )


Version = tuple[int, int, int]
"""A server's release as ``(major, minor, patch)``."""


class BodyDialect(Protocol):
    """How a kind of server reads a call's body: what a call needs of a server kind
    (``_servers.kinds`` has one for each; the server is known only once a client
    has opened, and a call is checked without one before that)."""

    def schema_fields(
        self, schema: Mapping[str, Any], name: str, version: Version | None
    ) -> dict[str, Any]:
        """The body fields that constrain an answer to a JSON schema."""
        ...

    def session_field(self, version: Version | None) -> str | None:
        """The body field that carries a caller's session (None: none)."""
        ...

    def body_fields(
        self, fields: dict[str, Any], *, chat: bool, version: Version | None
    ) -> dict[str, Any]:
        """The body's fields as this server reads them."""
        ...


def check_call(
    kind: Kind,
    method: str,
    params: Mapping[str, Any],
    *,
    tier: PriorityLike = "normal",
    default_model: str | None = None,
    max_model_len: int | None = None,
    stream: bool = False,
    tenant_as_user: bool = True,
    dialect: BodyDialect | None = None,
    version: Version | None = None,
) -> CallSpec:
    """Check one call's keywords (llmbatch's options and the body's fields) and
    build its :class:`CallSpec`, or raise. ``tier`` and ``default_model`` stand in
    where the call names none; ``dialect`` and ``version`` say how the server reads
    a body (a schema, fields it has renamed). ``dialect=None`` (the default) checks
    the call without a server in mind (a job file's lines, a Ray driver's options,
    checked before the server is known): the body stays as given, to be sent later
    in the server's dialect."""
    own: dict[str, Any] = {}
    fields: dict[str, Any] = {}
    for name, value in params.items():
        if value is not None:
            (own if name in OWN_OPTIONS else fields)[name] = value
    priority = parse_priority(own.get("priority", tier))
    who = check_tenant(own.get("tenant"))
    model = own.get("model", default_model)
    if not isinstance(model, str) or not model:
        raise wrong_type("model", "a non-empty str", model)
    check_keywords(kind, method, fields)
    # extra_body goes to the server as it is (like openai-python), after the checked
    # keywords, and what it sets counts (n, max_tokens) as if passed as keywords.
    fields.update(check_extra("extra_body", own.get("extra_body")))
    headers = tuple(
        sorted(check_extra("extra_headers", own.get("extra_headers"), strings=True).items())
    )
    query = query_string(check_extra("extra_query", own.get("extra_query"), strings=True))
    if who is not None and tenant_as_user and "user" not in fields:
        # OpenAI's own field for who a request is for: servers can count by it.
        fields["user"] = who
    if kind == "chat" and "max_tokens" not in fields and "max_completion_tokens" in fields:
        fields["max_tokens"] = fields.pop("max_completion_tokens")
    max_tokens_given = fields.get("max_tokens")
    if max_tokens_given is not None:
        positive_int(max_tokens_given, "max_tokens")
        if max_model_len is not None and max_tokens_given > max_model_len:
            raise bad_value(
                f"max_tokens={max_tokens_given} exceeds the server's max_model_len of "
                f"{max_model_len}",
                "max_tokens",
            )
    n = positive_int(fields.get("n", 1), "n")
    _number(fields, "temperature", 0.0, 100.0)
    _number(fields, "top_p", 0.0, 1.0)
    _number(fields, "presence_penalty", -2.0, 2.0)
    _number(fields, "frequency_penalty", -2.0, 2.0)
    stop = fields.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise wrong_type("stop", "a str or a list of str", stop)
    deadline = check_timeout(own.get("timeout"))
    retries = check_max_retries(own.get("max_retries"))
    structured = _structured(own, fields)
    if structured is not None:
        if kind == "embedding" or stream or n != 1:
            raise bad_value(
                "response_model needs one text answer: not with embeddings, streams or n > 1",
                "response_model",
            )
        if dialect is not None:
            fields.update(dialect.schema_fields(structured.schema, structured.name, version))
    if dialect is not None:
        session = dialect.session_field(version)
        if who is not None and tenant_as_user and session is not None and session not in fields:
            fields[session] = who
        fields = dialect.body_fields(fields, chat=kind == "chat", version=version)
    try:
        params_json = json.dumps(fields, sort_keys=True, allow_nan=False)
    except TypeError as exc:  # a value JSON has no type for (an object, a set)
        raise InvalidTypeError(f"parameters must be JSON-serialisable: {exc}") from None
    except ValueError as exc:  # the right type, a bad value (NaN, infinity)
        raise InvalidRequestError(f"parameters must be JSON-serialisable: {exc}") from None
    return CallSpec(
        kind=kind,
        priority=priority,
        model=model,
        params=fields,
        params_json=params_json,
        max_tokens=int(max_tokens_given or DEFAULT_MAX_TOKENS[kind]),
        n=n,
        timeout=deadline,
        stream=stream,
        headers=headers,
        query=query,
        attempts=None if retries is None else retries + 1,
        tenant=who,
        response_model=structured,
        max_reasks=_max_reasks(own.get("max_reasks")),
        max_tokens_given=max_tokens_given is not None,
        cache=check_cache_mode(own.get("cache")),
    )


def _structured(own: Mapping[str, Any], fields: dict[str, Any]) -> ResponseModel | None:
    """The call's response model: ``response_model=``, or a class given as
    ``response_format`` (as openai's ``parse`` takes it)."""
    target = own.get("response_model")
    if isinstance(fields.get("response_format"), type):
        if target is not None:
            raise bad_value("give response_model or response_format, not both", "response_format")
        target = fields.pop("response_format")
    structured = response_model_of(target)
    if structured is not None:
        named = next((name for name in _SCHEMA_FIELDS if name in fields), None)
        if named is not None:
            raise bad_value(
                f"{named}: response_model sets the schema the server is asked for; leave it out",
                named,
            )
    return structured


def check_cache_mode(value: object) -> CacheMode:
    """A call's ``cache=`` option: True or None (the default) uses the client's cache,
    False does not, ``"refresh"`` writes without reading."""
    if value is None or value is True:
        return "use"
    if value is False:
        return "off"
    if value == "refresh":
        return "refresh"
    raise wrong_type("cache", 'True, False or "refresh"', value)


def _max_reasks(value: object) -> int:
    if value is None:
        return DEFAULT_MAX_REASKS
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong_type("max_reasks", "an int >= 0", value)
    if value < 0:
        raise bad_value(f"max_reasks must be >= 0, got {value}", "max_reasks")
    return value


class SpecCache:
    """Checked :class:`CallSpec` objects by the keywords that made them.

    ``model`` is the client's default model and ``max_model_len`` its context length
    (None if the server did not say; another model's is not known here, so its
    prompts are not checked against one). Bounded: past ``size`` distinct option
    sets it starts afresh.
    """

    def __init__(
        self,
        model: str,
        max_model_len: int | None,
        *,
        size: int = 512,
        tenant_as_user: bool = True,
        dialect: BodyDialect | None = None,
        version: Version | None = None,
    ) -> None:
        self.model = model
        self.dialect = dialect
        """How the (first) server reads a body (None: checked without a server)."""
        self.version = version
        self.max_model_len = max_model_len
        self.tenant_as_user = tenant_as_user
        """A call's tenant is sent as OpenAI's ``user`` (unless it has its own)."""
        self._size = size
        self._specs: dict[tuple[object, ...], CallSpec] = {}

    def context_of(self, model: str) -> int | None:
        """A model's context length, when the server told it."""
        return self.max_model_len if model == self.model else None

    def get(
        self,
        kind: Kind,
        method: str,
        tier: PriorityLike,
        params: Mapping[str, Any],
        *,
        stream: bool = False,
    ) -> CallSpec:
        """The spec for one call's keywords (checked on first sight; raises if
        invalid). ``tier`` is the method's own default when the call names none."""
        key = _key(kind, method, tier, stream, params)
        spec = None if key is None else self._specs.get(key)
        if spec is not None:
            return spec
        name = params.get("model") or self.model
        spec = check_call(
            kind,
            method,
            params,
            tier=tier,
            default_model=self.model,
            max_model_len=self.context_of(name) if isinstance(name, str) else None,
            stream=stream,
            tenant_as_user=self.tenant_as_user,
            dialect=self.dialect,
            version=self.version,
        )
        if key is not None:
            if len(self._specs) >= self._size:
                self._specs.clear()
            self._specs[key] = spec
        return spec


def _key(
    kind: Kind, method: str, tier: object, stream: bool, params: Mapping[str, Any]
) -> tuple[object, ...] | None:
    """The cache key of a call's keywords; None when a value has no hashable form.
    A value's type is part of it: True == 1 == 1.0, but not as JSON."""
    key = (kind, method, tier, stream, *[(k, type(v), v) for k, v in params.items()])
    try:
        hash(key)
    except TypeError:  # a dict or list value (extra_body, stop strings): freeze them
        try:
            key = (kind, method, tier, stream, *[(k, _freeze(v)) for k, v in params.items()])
            hash(key)
        except TypeError:
            return None
    return key


def _freeze(value: object) -> object:
    """A hashable stand-in for a value (raises TypeError if it has none)."""
    if isinstance(value, Mapping):
        return (dict, tuple(sorted((k, _freeze(v)) for k, v in value.items())))
    if isinstance(value, list):
        return (list, tuple(_freeze(v) for v in value))
    hash(value)
    return (type(value), value)
