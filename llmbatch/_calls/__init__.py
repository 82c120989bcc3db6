"""A call, from its keywords to the request that carries it: the options it may take
(``params``), their check once per distinct set (``spec``, ``validate``), the
defaults a view fills in (``defaults``), its answer's schema (``structured``), its
prompt's prefix keys (``prefix``), and the request itself (``request``).

A new call parameter or an option of llmbatch's own changes here. Nothing here
knows a server: how a kind of server reads a body is passed in.
"""
