"""Each model's price: the one the user states, else the catalogue's
(``genai-prices``, the optional ``llmbatch[prices]`` extra) for the provider the
base URL names. A server the catalogue does not know by its URL (your own vLLM, a
proxy) has no price unless one is stated: a self-hosted model is never charged a
hosted provider's rate because it shares a name.
"""

from __future__ import annotations

import importlib
import importlib.util
import ipaddress
import logging
from collections.abc import Iterable, Mapping
from types import ModuleType
from urllib.parse import urlsplit

import anyio.to_thread

from llmbatch._config import Price

__all__ = ["CATALOGUE", "PriceBook", "price_needed"]

logger = logging.getLogger("llmbatch")

#: The optional package whose prices are used where none is stated.
CATALOGUE = "genai_prices"
#: Tokens of each kind priced to read a rate off the catalogue: small enough to stay
#: in any price's first tier (some rise past 128k or 200k prompt tokens).
_PROBE = 1000


class PriceBook:
    """Prices by model name, looked up once each."""

    __slots__ = ("_base_url", "_catalogue", "_found", "_stated")

    def __init__(self, stated: Mapping[str, Price], base_url: str) -> None:
        self._stated = dict(stated)
        self._base_url = base_url
        self._found: dict[str, tuple[Price | None, str | None]] = {}
        self._catalogue: ModuleType | bool | None = None if hosted(base_url) else False
        """The catalogue's module once imported; False: not installed, or of no use
        for this server (importing it costs a quarter of a second and the memory of
        its tables)."""

    def price(self, model: str | None) -> Price | None:
        """``model``'s price per million tokens (None: none stated, none known)."""
        if model is None:
            return None
        found = self._found.get(model)
        if found is None:
            found = self._found[model] = self._look_up(model)
        return found[0]

    def source(self, model: str) -> str | None:
        """Where ``model``'s price comes from: ``"stated"``, ``"genai-prices"``, None."""
        self.price(model)
        return self._found[model][1]

    async def prepare(self, models: Iterable[str | None]) -> None:
        """Look the client's models up in a worker thread (importing the catalogue
        takes a quarter of a second), so that no answer waits for it on the loop."""
        wanted = [m for m in models if m is not None and m not in self._stated]
        if wanted and self._catalogue is None and importlib.util.find_spec(CATALOGUE):
            await anyio.to_thread.run_sync(lambda: [self.price(m) for m in wanted])

    def _look_up(self, model: str) -> tuple[Price | None, str | None]:
        stated = self._stated.get(model, self._stated.get("*"))
        if stated is not None:
            return stated, "stated"
        catalogue = self._module()
        if catalogue is None:
            return None, None
        try:

            def dollars(**tokens: int) -> float:
                calc = catalogue.calc_price(
                    catalogue.Usage(**tokens), model, provider_api_url=self._base_url
                )
                return float(calc.total_price) * 1_000_000 / _PROBE

            price = Price(
                input=dollars(input_tokens=_PROBE),
                output=dollars(output_tokens=_PROBE),
                cached_input=dollars(input_tokens=_PROBE, cache_read_tokens=_PROBE),
            )
        except LookupError:  # a provider or model it does not know
            return None, None
        except Exception as exc:  # its data, not our call: never fail a request for it
            logger.debug("no price for %r from %s: %r", model, CATALOGUE, exc)
            return None, None
        return price, "genai-prices"

    def _module(self) -> ModuleType | None:
        if self._catalogue is None:
            try:
                self._catalogue = importlib.import_module(CATALOGUE)
            except ImportError:
                self._catalogue = False
        return self._catalogue if isinstance(self._catalogue, ModuleType) else None


def hosted(base_url: str) -> bool:
    """Whether ``base_url`` may name a hosted provider the catalogue knows: a public
    domain name, not an IP address, ``localhost`` or another one-label or local
    name (your own server, a proxy beside it)."""
    host = (urlsplit(base_url).hostname or "").rstrip(".")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return False
    local = (".local", ".localhost", ".internal", ".lan", ".home.arpa")
    return "." in host and not host.endswith(local)


def price_needed(model: str | None) -> str:
    """What a spending limit without ``model``'s price says, and how to give one."""
    return (
        f"max_cost needs the price of model {model!r}: state it with "
        f"prices={{{model!r}: llmbatch.Price(input=..., output=...)}} (dollars per million "
        "tokens), or install 'llmbatch[prices]' for a hosted provider's"
    )
