"""A client's lifetime: what opening builds (``runtime``, from its checked
configuration, ``config``), its servers together (``fleet``, ``health``), the
driver that runs the scheduler on the event loop (``engine``), and the ways calls
and maps go in (``submitter``, ``map``).
"""
