"""Everything about one server as the client knows it: the server object
(``server``), what sends batches to it (``dispatcher``), the OpenAI wire format
(``wire``), its load reports (``load``), its model list (``model_list``), and how
each kind of server speaks (``kinds``).

A new server kind, or a new response-header family, changes here.
"""
