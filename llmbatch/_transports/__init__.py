"""HTTP transports: the one seam between llmbatch and the network.

A transport turns an :class:`HTTPRequest` into an :class:`HTTPResponse` and maps its
library's exceptions onto llmbatch's :class:`TransportError` family in exactly one
place. Tests swap the network for :class:`MockTransport`.
"""

from llmbatch._transports.base import HTTPRequest, HTTPResponse, Transport
from llmbatch._transports.mock import MockResponse, MockTransport

__all__ = ["HTTPRequest", "HTTPResponse", "MockResponse", "MockTransport", "Transport"]
