"""Budgets shared through Redis by every process that names the same key: rate
limits (``RateLimit(redis_url=..., key=...)``) and an in-flight budget
(``SharedInFlight``).

The scheduler stays free of I/O: engine-side tasks here lease budget from Redis
(atomically, with Lua scripts that read Redis's own clock) and hand it to the
scheduler's buckets and seat counts. The ``redis`` package is imported only when
a client uses one of these.
"""
