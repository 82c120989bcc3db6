"""The response cache: answers kept under a key of what was asked, so that a request
sent again is answered without the server (docs/caching.md).

``key`` makes the keys (pure), ``codec`` turns answers into stored bytes and back,
``files`` checks where a cache file may live, and ``store`` keeps the entries in a
SQLite file that several processes may share. The client's side (lookups, hits,
sharing a request in flight) is ``_runtime.caching``.
"""
