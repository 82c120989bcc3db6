"""One server's seats: the room each tier has, the bulk limit, what it takes."""

from __future__ import annotations

from llmbatch import Limits, Priority
from llmbatch._scheduler.seats import Seats

RT, NORMAL = Priority.REALTIME, Priority.NORMAL


def seats(**limits: int) -> Seats:
    return Seats(0, Limits(**limits))  # type: ignore[arg-type]


def test_bulk_starts_below_the_ceiling_by_the_realtime_reserve() -> None:
    s = seats(max_in_flight=10, reserved_realtime=2, max_in_flight_tokens=1000)
    assert s.bulk_cap == 8
    assert s.room(NORMAL) == (8, 800)
    assert s.room(RT) == (10, 1000)


def test_booking_moves_the_room_of_each_tier() -> None:
    s = seats(max_in_flight=10, reserved_realtime=2, max_in_flight_tokens=1000)
    s.book(NORMAL, 8, 400)
    assert s.room(NORMAL) == (0, 400)
    assert s.room(RT) == (2, 600)  # realtime keeps the reserve
    assert s.bulk_held_back()  # seats free, none for bulk
    s.book(RT, 2, 10)
    assert s.realtime_in_flight == 2
    assert not s.bulk_held_back()
    s.book(NORMAL, -8, -400)
    s.book(RT, -2, -10)
    assert (s.in_flight, s.in_flight_tokens, s.bulk_in_flight) == (0, 0, 0)


def test_the_bulk_limit_is_clamped_and_scales_the_token_share() -> None:
    s = seats(max_in_flight=10, reserved_realtime=2, max_in_flight_tokens=1000)
    s.set_bulk_limit(0)
    assert (s.bulk_cap, s.bulk_token_cap) == (1, 100)
    s.set_bulk_limit(50)
    assert (s.bulk_cap, s.bulk_token_cap) == (10, 1000)


def test_what_it_is_open_to() -> None:
    s = seats()
    assert s.open_to("any")
    assert s.has_seat(RT)
    s.models = frozenset({"a"})
    assert s.open_to("a")
    assert not s.open_to("b")
    assert s.open_to(None)
    s.sendable = 0  # unavailable
    assert not s.open_to("a")
    assert not s.has_seat(RT)
    s.sendable = 1  # one trial batch
    assert s.open_to("a")
    s.active = False  # removed
    assert not s.open_to(None)
