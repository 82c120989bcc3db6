"""The closed loop over one server, pure, with time passed in: how much lower-tier
work it may have in flight (``admission``), what may be believed of it and on what
evidence (``evidence``), where its signals come from (``signals``), and when it is
out and waited for (``breaker``).

A new control signal is read here once the server wing has parsed it.
"""
